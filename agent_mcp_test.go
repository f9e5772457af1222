package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
)

// fleet-mcp loaded by a real agent CLI from its own MCP configuration,
// run headless (one prompt per run) against the stub model, whose
// STUB:MCP marker makes the model call a fleet tool by name: the tools
// are offered to the model, a send reaches the other side, and a receive
// hands the model its mail (the stub's log shows the tool results the
// model was given).

// mcpTurn finds the request that carried the result of the model's tool
// call during the prompts since from, and returns its tool result.
func mcpToolResult(t *testing.T, stub *stubmodel.Server, from int, want string) string {
	t.Helper()
	reqs := stub.Requests()
	for _, q := range reqs[from:] {
		if q.ToolResult != "" {
			if !strings.Contains(q.ToolResult, want) {
				t.Fatalf("the tool result the model got lacks %q: %s", want, q.ToolResult)
			}
			return q.ToolResult
		}
	}
	t.Fatalf("no tool result reached the model; its requests: %+v", reqs[from:])
	return ""
}

func TestMCPClaudeCode(t *testing.T) {
	agentTest(t)
	claude := agentBin(t, "claude")
	r := newAgentRig(t)
	writeJSONFile(t, filepath.Join(r.home, ".claude.json"), map[string]any{
		"hasCompletedOnboarding": true, "theme": "dark", "hasSeenAutoDefaultNudge": true,
		"customApiKeyResponses": map[string]any{"approved": []string{claudeKey[len(claudeKey)-20:]}, "rejected": []string{}},
		"projects":              map[string]any{r.work: map[string]any{"hasTrustDialogAccepted": true}},
	})
	// as a user sets it up: the installer writes the user's ~/.claude.json
	// (mcpServers.fleet: fleet-mcp --as main), keeping what is there
	mcpInstall(t, r, "claude", nil)
	run := func(prompt string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, claude, "-p", prompt, "--allowedTools", "mcp__fleet")
		cmd.Dir = r.work
		cmd.Env = r.env(append(claudeEnv(r), mcpClaudeEnv...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("claude -p: %v\n%s", err, out)
		}
	}

	mcpSendReceive(t, r, run, "", "mcp__fleet__")
}

// mcpInstall configures the CLI's MCP client through the installer
// (fleet-roster hooks install CLI --mcp main, with env added to the rig's
// and args after), and checks that hooks status sees the entry.
func mcpInstall(t *testing.T, r *agentRig, cli string, env []string, args ...string) {
	t.Helper()
	for _, argv := range [][]string{
		append([]string{"hooks", "install", cli, "--mcp", "main"}, args...),
		{"hooks", "status", cli, "--json"},
	} {
		cmd := exec.Command(filepath.Join(binDir, "fleet-roster"), argv...)
		cmd.Env = r.env(env...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("fleet-roster %s: %v\n%s", strings.Join(argv, " "), err, stderr.String())
		}
		if argv[1] == "status" {
			var st struct {
				MCP struct{ State, Entity string }
			}
			if err := json.Unmarshal([]byte(stdout.String()), &st); err != nil || st.MCP.State != "present" || st.MCP.Entity != "main" {
				t.Fatalf("hooks status %s after the install: %v\n%s", cli, err, stdout.String())
			}
		}
	}
}

// mcpSendReceive drives a send and a receive through the CLI's MCP client
// (run runs one prompt headless) and checks both sides, and that the model
// was offered the tools (by the CLI's names for them: prefix + tool, after
// the text also, when given, that groups them).
func mcpSendReceive(t *testing.T, r *agentRig, run func(string), also, prefix string) {
	t.Helper()
	r.fleet("fleet-roster", "join", "main", "--mode", "pull")
	r.fleet("fleet-roster", "join", "bob", "--mode", "pull")
	// a send: the model's call reaches bob
	from := len(r.stub.Requests())
	run(`tell bob STUB:MCP=send {"to":"bob","body":"hello from the model"}`)
	turns := r.stub.Turns()
	if len(turns) == 0 {
		t.Fatal("no turn reached the stub")
	}
	body := turns[len(turns)-1].Body
	if also != "" {
		i := strings.Index(body, also)
		if i < 0 {
			t.Errorf("the request lacks %s", also)
		}
		body = body[max(i, 0):]
	}
	for _, tool := range []string{"send", "receive", "roster", "spawn", "stop", "trace"} {
		if !strings.Contains(body, `"name":"`+prefix+tool+`"`) {
			t.Errorf("the model was not offered %s%s", prefix, tool)
		}
	}
	if t.Failed() {
		if i := strings.Index(body, `"tools":`); i >= 0 {
			names := regexp.MustCompile(`"name":"([^"]+)"`).FindAllStringSubmatch(body[i:], -1)
			t.Logf("the tools offered: %v", names)
			if j := strings.Index(body, `"name":"mcp__fleet"`); j > 200 {
				t.Logf("around it: %s", body[j-200:min(len(body), j+600)])
			}
		}
	}
	mcpToolResult(t, r.stub, from, `"outcome":"sent"`)
	got := r.fleet("fleet-recv", "--as", "bob", "--json")
	if !strings.Contains(got, `"body":"hello from the model"`) || !strings.Contains(got, `"name":"main"`) {
		t.Fatalf("bob's inbox: %s", got)
	}

	// a receive: the model is handed main's mail, which leaves the inbox
	r.fleet("fleet-send", "--as", "bob", "main", "hello main, from bob")
	from = len(r.stub.Requests())
	run(`check mail STUB:MCP=receive {}`)
	mcpToolResult(t, r.stub, from, "hello main, from bob")
	if got := r.fleet("fleet-recv", "--as", "main", "--json"); got != "" {
		t.Fatalf("taken by receive, yet still in main's inbox: %s", got)
	}
}

// mcpClaudeEnv: Claude Code's tool search would offer the MCP tools by
// name only, until the model looked them up (fleet-agents(7)); off, the
// request carries them whole.
var mcpClaudeEnv = []string{"ENABLE_TOOL_SEARCH=false"}

// Codex passes an MCP server only a few variables of its own (HOME, PATH,
// USER, ...): the installer's entry names the gateway's with env_vars. A
// tool that is not read-only needs approval (the entry's
// default_tools_approval_mode = "writes", by the tools' readOnlyHint)
// unless the user approved it (--approve TOOLS): the TUI asks; codex exec
// runs with approval "never" whatever config.toml says, so outside full
// access it refuses the call ("MCP tool call requires approval, but
// approval policy is never") — seen here with sandbox_mode =
// "workspace-write": whoami runs, send does not until it is approved.
// With full access (the rig's danger-full-access) nothing needs approval.
func TestMCPCodex(t *testing.T) {
	agentTest(t)
	codex := agentBin(t, "codex")
	r := newAgentRig(t)
	home := filepath.Join(r.home, ".codex")
	config := fmt.Sprintf(`model = "stub-model"
model_provider = "stub"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.stub]
name = "stub model"
base_url = %q
wire_api = "responses"
env_key = "STUB_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[projects.%q]
trust_level = "trusted"
`, r.stub.URL()+"/v1", r.work)
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	mcpInstall(t, r, "codex", []string{"CODEX_HOME=" + home})
	if b, _ := os.ReadFile(filepath.Join(home, "config.toml")); !strings.HasPrefix(string(b), config) {
		t.Fatalf("the installer changed the user's part of config.toml:\n%s", b)
	}
	run := func(prompt string, codexArgs ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append([]string{"exec", "--skip-git-repo-check"}, codexArgs...)
		cmd := exec.CommandContext(ctx, codex, append(args, prompt)...)
		cmd.Dir = r.work
		cmd.Env = r.env("CODEX_HOME="+home, "STUB_API_KEY=stub")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("codex exec: %v\n%s", err, out)
		}
	}
	// Codex offers a server's tools as a namespace of functions
	mcpSendReceive(t, r, func(p string) { run(p) }, `{"type":"namespace","name":"mcp__fleet"`, "")

	// the approval the installer set, honoured: a read-only tool runs, a
	// writing one is not run while it is not approved
	noFullAccess := []string{"-c", `sandbox_mode="workspace-write"`}
	from := len(r.stub.Requests())
	run(`who am I STUB:MCP=whoami {}`, noFullAccess...)
	mcpToolResult(t, r.stub, from, `"name":"main"`)
	from = len(r.stub.Requests())
	run(`tell bob STUB:MCP=send {"to":"bob","body":"not approved"}`, noFullAccess...)
	res := mcpAnyToolResult(t, r.stub, from)
	if strings.Contains(res, `"outcome":"sent"`) || !strings.Contains(res, "requires approval") {
		t.Fatalf("send, not approved: %s", res)
	}
	if got := r.fleet("fleet-recv", "--as", "bob", "--json"); got != "" {
		t.Fatalf("bob got mail the user did not approve: %s", got)
	}
	mcpInstall(t, r, "codex", []string{"CODEX_HOME=" + home}, "--approve", "send")
	from = len(r.stub.Requests())
	run(`tell bob STUB:MCP=send {"to":"bob","body":"approved"}`, noFullAccess...)
	mcpToolResult(t, r.stub, from, `"outcome":"sent"`)
	if got := r.fleet("fleet-recv", "--as", "bob", "--json"); !strings.Contains(got, `"body":"approved"`) {
		t.Fatalf("bob's inbox after send was approved: %s", got)
	}
}

// mcpAnyToolResult is the first tool result the model got since from.
func mcpAnyToolResult(t *testing.T, stub *stubmodel.Server, from int) string {
	t.Helper()
	for _, q := range stub.Requests()[from:] {
		if q.ToolResult != "" {
			return q.ToolResult
		}
	}
	t.Fatalf("no tool result reached the model; its requests: %+v", stub.Requests()[from:])
	return ""
}

// Gemini CLI passes an MCP server its environment but for any variable
// whose name holds TOKEN (KEY, SECRET, ...), unless the entry's env names
// it: the installer's entry names the entity with --as, which needs
// nothing passed; an entry written by hand that passes FLEET_TOKEN on
// (the README's way for a credential in the environment) works too.
func TestMCPGemini(t *testing.T) {
	agentTest(t)
	gemini := agentBin(t, "gemini")
	for _, tc := range []struct {
		name  string
		entry map[string]any // nil: the installer's
	}{
		{"installer", nil},
		{"token", map[string]any{"command": "fleet-mcp", "env": map[string]string{"FLEET_TOKEN": "$FLEET_TOKEN"}}},
	} {
		t.Run(tc.name, func(t *testing.T) { testMCPGemini(t, gemini, tc.entry) })
	}
}

func testMCPGemini(t *testing.T, gemini string, entry map[string]any) {
	r := newAgentRig(t)
	dir := filepath.Join(r.home, ".gemini")
	settings := map[string]any{
		"general":   map[string]any{"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
		"privacy":   map[string]any{"usageStatisticsEnabled": false},
		"telemetry": map[string]any{"enabled": false},
		"ide":       map[string]any{"enabled": false, "hasSeenNudge": true},
		"security":  map[string]any{"auth": map[string]any{"selectedType": "gemini-api-key"}},
	}
	if entry != nil {
		settings["mcpServers"] = map[string]any{"fleet": entry}
	}
	writeJSONFile(t, filepath.Join(dir, "settings.json"), settings)
	if entry == nil {
		mcpInstall(t, r, "gemini", nil)
	}
	writeJSONFile(t, filepath.Join(dir, "trustedFolders.json"), map[string]string{r.work: "TRUST_FOLDER"})
	run := func(prompt string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, gemini, "--yolo", "-p", prompt)
		cmd.Dir = r.work
		env := []string{"GEMINI_API_KEY=stub-key", "GOOGLE_GEMINI_BASE_URL=" + r.stub.URL()}
		if entry != nil {
			// main's credential, as a user has it in the environment (main
			// is joined by mcpSendReceive before the first run)
			tok, err := os.ReadFile(filepath.Join(r.dir, "h1", "credentials", "main.token"))
			if err != nil {
				t.Fatal(err)
			}
			env = append(env, "FLEET_TOKEN="+strings.TrimSpace(string(tok)))
		}
		cmd.Env = r.env(env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("gemini -p: %v\n%s", err, out)
		}
	}
	mcpSendReceive(t, r, run, "", "mcp_fleet_")
}
