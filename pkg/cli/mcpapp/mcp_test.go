package mcpapp

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/hooks"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func mustSchema[T any](t *testing.T) *jsonschema.Schema {
	t.Helper()
	s, err := jsonschema.For[T](nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A text cut for a tool's output stays valid UTF-8 and says what it cut.
func TestViewCutsOnARuneBoundary(t *testing.T) {
	e := &envelope.Envelope{MsgID: "m1", Kind: envelope.Reply, Body: "naïve ✓ done"}
	for max := 0; max <= len(e.Body)+1; max++ {
		m := view(e, max)
		if !utf8.ValidString(m.Body) || len(m.Body) > max || !strings.HasPrefix(e.Body, m.Body) {
			t.Fatalf("max %d: body %q", max, m.Body)
		}
		if m.Truncated != (len(e.Body) > max) || m.BodyBytes != len(e.Body) {
			t.Fatalf("max %d: truncated %v, body_bytes %d", max, m.Truncated, m.BodyBytes)
		}
		if len(e.Body) > max && max >= 3 && len(m.Body) < max-2 {
			t.Fatalf("max %d: cut too much: %q", max, m.Body)
		}
	}
}

// The schemas an LLM's client gets have one type per field: no
// "null or array" that single-type dialects reject.
func TestToolSchemasHaveOneTypePerField(t *testing.T) {
	s := notNull(mustSchema[ReceiveOut](t))
	data, _ := json.Marshal(s)
	if strings.Contains(string(data), `"null"`) {
		t.Fatalf("receive's output schema still allows null: %s", data)
	}
	if !strings.Contains(string(data), `"messages":{"type":"array"`) {
		t.Fatalf("receive's messages is not an array: %s", data)
	}
	s = notNull(mustSchema[RosterOut](t))
	data, _ = json.Marshal(s)
	if strings.Contains(string(data), `"null"`) {
		t.Fatalf("roster's output schema still allows null: %s", data)
	}
}

// A tool error starts with the kind and the exit code of the commands.
func TestToolErrorCarriesKindAndCode(t *testing.T) {
	err := fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient named bob").WithHint("list entities with: fleet-roster")
	got := toolError(err, "").Error()
	want := "unknown_recipient (67): no recipient named bob — hint: list entities with the roster tool"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	err = fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient named bobb").WithHint("did you mean bob? (list entities with: fleet-roster)")
	got = toolError(err, "").Error()
	want = "unknown_recipient (67): no recipient named bobb — hint: did you mean bob? (list entities with the roster tool)"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	err = fault.New(fault.TempFail, fault.KindTimeout, "no answer").WithHint("look with: fleet-roster --host h2; a request is carried out once per id (fleet-spawn --request-id r1)")
	got = toolError(err, "").Error()
	want = "timeout (75): no answer — hint: look with: the roster tool (host h2); a request is carried out once per id (spawn with request_id r1)"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	err = fault.New(fault.Refused, fault.KindUsage, "taken").WithHint("choose another name, or stop it first with: fleet-stop w1@h1")
	if got = toolError(err, "").Error(); !strings.HasSuffix(got, "stop it first with: the stop tool (target w1@h1)") {
		t.Fatalf("got %q", got)
	}
	got = toolError(fault.New(fault.TempFail, fault.KindTimeout, "no reply"), "wait again").Error()
	if got != "timeout (75): no reply — hint: wait again" {
		t.Fatalf("got %q", got)
	}
}

func TestBounded(t *testing.T) {
	if v, err := bounded("n", 0, 10, 1, 100); v != 10 || err != nil {
		t.Fatalf("default: %d %v", v, err)
	}
	if _, err := bounded("n", 101, 10, 1, 100); fault.CodeOf(err) != fault.Usage {
		t.Fatalf("over: %v", err)
	}
	if _, err := bounded("n", -1, 10, 1, 100); fault.CodeOf(err) != fault.Usage {
		t.Fatalf("under: %v", err)
	}
}

// listed starts the tools of a server whose gateway takes bodies of
// maxBody bytes, and lists them through an MCP client over an in-memory
// transport: what a client sees, without a gateway (no tool here reaches
// it: the arguments are refused before).
func listed(t *testing.T, maxBody int) (*mcp.ClientSession, map[string]*mcp.Tool) {
	t.Helper()
	s := &server{gw: api.Hello{Host: "h1", MaxBody: maxBody}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "fleet", Version: "test"}, nil)
	s.addTools()
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := s.mcp.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	return cs, tools
}

// Every tool has a title and annotations; the read-only ones say so, stop
// says it destroys, and none claims the open world.
func TestToolAnnotations(t *testing.T) {
	_, tools := listed(t, 1<<20)
	want := []string{"answer", "ask", "broadcast", "receive", "reply", "roster", "send", "spawn", "status", "stop", "trace", "wait_reply", "whoami"}
	if len(tools) != len(want) {
		t.Fatalf("%d tools, want %d: %v", len(tools), len(want), tools)
	}
	readOnly := map[string]bool{"roster": true, "status": true, "whoami": true, "trace": true}
	idempotent := map[string]bool{"roster": true, "status": true, "whoami": true, "trace": true, "answer": true, "stop": true}
	for _, name := range want {
		tl := tools[name]
		if tl == nil {
			t.Fatalf("no tool %s", name)
		}
		a := tl.Annotations
		if a == nil || tl.Title == "" || a.Title != tl.Title {
			t.Fatalf("%s: title %q, annotations %+v", name, tl.Title, a)
		}
		if a.ReadOnlyHint != readOnly[name] || a.IdempotentHint != idempotent[name] {
			t.Errorf("%s: readOnly %v idempotent %v", name, a.ReadOnlyHint, a.IdempotentHint)
		}
		if a.OpenWorldHint == nil || *a.OpenWorldHint {
			t.Errorf("%s: openWorldHint %v", name, a.OpenWorldHint)
		}
		if !a.ReadOnlyHint && (a.DestructiveHint == nil || *a.DestructiveHint != (name == "stop")) {
			t.Errorf("%s: destructiveHint %v", name, a.DestructiveHint)
		}
	}
}

// The bounds and defaults the handlers hold arguments to are in the input
// schemas, where a client and its model see them.
func TestInputSchemasCarryBounds(t *testing.T) {
	_, tools := listed(t, 4096)
	// a property's schema as the client got it (keys sorted)
	prop := func(tool, name string) string {
		var sc struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		data, _ := json.Marshal(tools[tool].InputSchema)
		if err := json.Unmarshal(data, &sc); err != nil {
			t.Fatal(err)
		}
		if name == "" {
			return strings.Join(sc.Required, ",")
		}
		return string(sc.Properties[name])
	}
	desc := func(tool, name string) string {
		var p struct{ Description string }
		json.Unmarshal([]byte(prop(tool, name)), &p)
		d, _ := json.Marshal(p.Description)
		return `"description":` + string(d)
	}
	for _, c := range []struct{ tool, name, want string }{
		{"receive", "max_messages", `{"default":10,` + desc("receive", "max_messages") + `,"maximum":100,"minimum":1,"type":"integer"}`},
		{"receive", "wait_seconds", `{"default":0,` + desc("receive", "wait_seconds") + `,"maximum":900,"minimum":0,"type":"integer"}`},
		{"receive", "max_bytes", `{"default":4096,` + desc("receive", "max_bytes") + `,"maximum":4096,"minimum":1,"type":"integer"}`},
		{"send", "body", `{` + desc("send", "body") + `,"maxLength":4096,"minLength":1,"type":"string"}`},
		{"send", "timeout_seconds", `{"default":45,` + desc("send", "timeout_seconds") + `,"maximum":900,"minimum":1,"type":"integer"}`},
		{"send", "", "to,body"},
		{"ask", "timeout_seconds", `{"default":45,` + desc("ask", "timeout_seconds") + `,"maximum":900,"minimum":1,"type":"integer"}`},
		{"roster", "group", `{` + desc("roster", "group") + `,"maxLength":64,"minLength":1,"pattern":"^[A-Za-z][A-Za-z0-9_-]{0,63}$","type":"string"}`},
		{"roster", "host", `{` + desc("roster", "host") + `,"maxLength":63,"minLength":1,"pattern":"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$","type":"string"}`},
		{"spawn", "name", `{` + desc("spawn", "name") + `,"maxLength":64,"minLength":1,"pattern":"^[A-Za-z][A-Za-z0-9_-]{0,63}$","type":"string"}`},
		{"spawn", "profile", `{"default":"default",` + desc("spawn", "profile") + `,"maxLength":64,"minLength":1,"pattern":"^[A-Za-z][A-Za-z0-9_-]{0,63}$","type":"string"}`},
		{"spawn", "groups", `{` + desc("spawn", "groups") + `,"items":{"maxLength":64,"minLength":1,"pattern":"^[A-Za-z][A-Za-z0-9_-]{0,63}$","type":"string"},"type":"array"}`},
		{"spawn", "", "name"},
		{"stop", "timeout_seconds", `{"default":30,` + desc("stop", "timeout_seconds") + `,"maximum":900,"minimum":1,"type":"integer"}`},
		{"trace", "timeout_seconds", `{"default":5,` + desc("trace", "timeout_seconds") + `,"maximum":60,"minimum":1,"type":"integer"}`},
		{"trace", "", "trace_id"},
	} {
		if got := prop(c.tool, c.name); got != c.want {
			t.Errorf("%s %s:\n got %s\nwant %s", c.tool, c.name, got, c.want)
		}
	}
}

// An argument out of bounds is refused before the handler, as a tool
// error in the house form, naming the argument and its bounds.
func TestArgumentsOutOfBounds(t *testing.T) {
	cs, _ := listed(t, 4096)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"receive", map[string]any{"max_messages": 1000}, "usage (64): max_messages must be from 1 to 100, not 1000"},
		{"receive", map[string]any{"wait_seconds": -1}, "usage (64): wait_seconds must be from 0 to 900, not -1"},
		{"send", map[string]any{"to": "bob", "body": strings.Repeat("x", 4097)}, "usage (64): body is 4097 characters, over its limit of 4096"},
		{"send", map[string]any{"to": "bob", "body": ""}, "usage (64): body is empty"},
		{"send", map[string]any{"to": "bob"}, `usage (64): arguments: required: missing properties: ["body"]`},
		{"spawn", map[string]any{"name": "no/such"}, `usage (64): name "no/such" is not a valid name (a letter, then up to 63 letters, digits, '-' or '_')`},
		{"spawn", map[string]any{"name": "w1", "groups": []any{"ok", "not ok"}}, `usage (64): groups[1] "not ok" is not a valid name`},
		{"trace", map[string]any{"trace_id": "t", "timeout_seconds": 61}, "usage (64): timeout_seconds must be from 1 to 60, not 61"},
		{"whoami", map[string]any{"extra": 1}, "usage (64): arguments: "},
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Fatalf("%s %v: %v", c.tool, c.args, err)
		}
		text := ""
		if len(res.Content) > 0 {
			text = res.Content[0].(*mcp.TextContent).Text
		}
		if !res.IsError || !strings.HasPrefix(text, c.want) {
			t.Errorf("%s %v: isError %v, %q; want %q", c.tool, c.args, res.IsError, text, c.want)
		}
	}
}

// The installer's list of tools (Codex's per-tool approval takes these
// names: fleet-roster hooks install codex --mcp NAME --approve TOOLS) is
// this server's.
func TestInstallerKnowsTheTools(t *testing.T) {
	_, tools := listed(t, 1<<20)
	var names []string
	for n := range tools {
		names = append(names, n)
	}
	sort.Strings(names)
	want := slices.Clone(hooks.MCPTools)
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Fatalf("pkg/hooks.MCPTools %v, the server's tools %v", want, names)
	}
}
