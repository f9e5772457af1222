package mcpapp

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/google/jsonschema-go/jsonschema"
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
