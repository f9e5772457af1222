package fleet_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
)

// The real Codex CLI (0.169) in a tmux pane, on the stub model, with
// scripts/hooks/codex-hooks.json as its hooks: what agent-notes-codex.md
// found, checked.

// codexIdleRE and codexWorkingRE tell Codex's screen at the prompt from
// mid-turn: a turn shows "• Working (Ns • esc to interrupt)" above the
// composer, the footer "? for shortcuts" is there in both.
var (
	codexWorkingRE = regexp.MustCompile(`esc to interrupt\)`)
	codexReadyRE   = regexp.MustCompile(`\? for shortcuts`)
)

// codexHookLabel is an event's label in Codex's hook keys (SessionStart →
// session_start).
func codexHookLabel(event string) string {
	var b strings.Builder
	for i, c := range event {
		if unicode.IsUpper(c) {
			if i > 0 {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

// codexHookTrust is the [hooks.state] of config.toml that trusts every
// command hook of the hooks.json at path as Codex's /hooks review does:
// per handler the key PATH:EVENT:GROUP:HANDLER and trusted_hash, the
// sha256 of the handler's normalized identity as canonical JSON (sorted
// keys, no spaces; absent fields left out; the timeout as Codex runs it:
// 600 when unset, Interrupt's clamped to 3).
func codexHookTrust(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Hooks map[string][]struct {
			Matcher *string `json:"matcher"`
			Hooks   []struct {
				Type          string  `json:"type"`
				Command       string  `json:"command"`
				Timeout       *uint64 `json:"timeout"`
				Async         bool    `json:"async"`
				StatusMessage *string `json:"statusMessage"`
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out strings.Builder
	for event, groups := range f.Hooks {
		label := codexHookLabel(event)
		for gi, g := range groups {
			for hi, h := range g.Hooks {
				timeout := uint64(600)
				if h.Timeout != nil {
					timeout = max(*h.Timeout, 1)
				}
				if event == "Interrupt" {
					timeout = min(timeout, 3)
				}
				handler := map[string]any{"type": h.Type, "command": h.Command, "timeout": timeout, "async": h.Async}
				if h.StatusMessage != nil {
					handler["statusMessage"] = *h.StatusMessage
				}
				id := map[string]any{"event_name": label, "hooks": []any{handler}}
				if g.Matcher != nil {
					id["matcher"] = *g.Matcher
				}
				var js bytes.Buffer
				enc := json.NewEncoder(&js)
				enc.SetEscapeHTML(false) // as serde_json writes it
				enc.Encode(id)           // maps: keys sorted
				sum := sha256.Sum256(bytes.TrimRight(js.Bytes(), "\n"))
				fmt.Fprintf(&out, "\n[hooks.state.%s]\ntrusted_hash = \"sha256:%s\"\n",
					strconv.Quote(fmt.Sprintf("%s:%s:%d:%d", path, label, gi, hi)), hex.EncodeToString(sum[:]))
			}
		}
	}
	return out.String()
}

// codexRig is a rig with a CODEX_HOME set up as a user would: the stub as
// a custom model provider, the project folder trusted, no approvals or
// sandbox, the shipped hooks installed and trusted.
type codexRig struct {
	*agentRig
	codexHome string
	turnLog   string // what the fleet-turn shim saw, a line a call
}

func newCodexRig(t *testing.T) *codexRig {
	t.Helper()
	r := &codexRig{agentRig: newAgentRig(t)}
	r.codexHome = filepath.Join(r.home, ".codex")
	r.turnLog = filepath.Join(r.dir, "fleet-turn.log")
	if err := os.MkdirAll(r.codexHome, 0o700); err != nil {
		t.Fatal(err)
	}
	hooks, err := os.ReadFile(filepath.Join("scripts", "hooks", "codex-hooks.json"))
	if err != nil {
		t.Fatal(err)
	}
	hooksPath := filepath.Join(r.codexHome, "hooks.json")
	if err := os.WriteFile(hooksPath, hooks, 0o600); err != nil {
		t.Fatal(err)
	}
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

[tui]
animations = false
`, r.stub.URL()+"/v1", r.work)
	config += codexHookTrust(t, hooksPath)
	if err := os.WriteFile(filepath.Join(r.codexHome, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// a fleet-turn ahead of the real one on PATH that logs each call and
	// the entity's status the real one left
	shim := filepath.Join(r.dir, "shim")
	if err := os.MkdirAll(shim, 0o700); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	script := fmt.Sprintf(`#!/bin/sh
%s "$@"
rc=$?
echo "$1 $(fleet-roster --json | grep '"name":"codex"' | grep -o '"status":"[a-z]*"')" >> %s
exit $rc
`, filepath.Join(wd, "scripts", "hooks", "fleet-turn"), r.turnLog)
	if err := os.WriteFile(filepath.Join(shim, "fleet-turn"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs Codex in a pane of session name, joined as the inject entity
// name first (as a user who joins the pane, then starts the agent), and
// waits for its prompt. Codex runs no hook at launch (SessionStart comes
// with the first prompt), so the entity names its program (node: the npm
// launcher) and reads idle from a screen that stood still 2 s, no dialog
// on it; its pastes are bracketed (Codex enables bracketed paste).
func (r *codexRig) start(name string) string {
	r.t.Helper()
	// tmux (3.3) gives a new pane the client's PATH whatever -e says: the
	// shim goes on PATH in the command line
	pane, run := r.gatedPane(name, "PATH="+filepath.Join(r.dir, "shim")+":$PATH exec "+agentBin(r.t, "codex")+" --no-daemon",
		"CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key")
	r.fleet("fleet-roster", "join", name, "--mode", "inject", "--tmux-target", pane,
		"--program", "node", "--paste", "bracketed", "--idle-screen", "2s")
	run()
	r.waitScreen(pane, codexReadyRE.String(), 30*time.Second)
	return pane
}

// waitTurnCalls waits until fleet-turn was called n times and returns the
// calls.
func (r *codexRig) waitTurnCalls(n int, within time.Duration) []string {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		b, _ := os.ReadFile(r.turnLog)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(b) > 0 && len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("fleet-turn was called %d time(s), want %d, within %v:\n%s", len(lines), n, within, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// send sends body from alice to the entity and returns the message id.
func (r *codexRig) send(to, body string) string {
	r.t.Helper()
	out := r.fleet("fleet-send", "--as", "alice", "--json", to, body)
	m := regexp.MustCompile(`"msg_id":"([^"]+)"`).FindStringSubmatch(out)
	if m == nil {
		r.t.Fatalf("fleet-send printed no msg_id: %s", out)
	}
	return m[1]
}

func TestCodex(t *testing.T) {
	r := newCodexRig(t)
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	pane := r.start("codex")
	r.waitStatus("codex", "idle", 30*time.Second) // read from the screen
	// SessionStart ran the hook: idle
	// no dialog, and no hook yet: Codex 0.169 starts its session (and runs
	// SessionStart) at the first prompt, not at launch
	if s := r.screen(pane); strings.Contains(s, "Hooks need review") || strings.Contains(s, "trust") {
		t.Fatalf("a dialog at start:\n%s", s)
	}
	roster, _, _ := r.fleetTry("fleet-roster", "--json")
	t.Logf("roster before the first turn:\n%s", roster)

	t.Run("message", func(t *testing.T) {
		r.t = t
		body := "Please look at issue 7 of the codex rig."
		id := r.send("codex", body)
		r.waitTurns(1, 30*time.Second)
		// SessionStart, UserPromptSubmit, Stop
		calls := r.waitTurnCalls(3, 30*time.Second)
		if want := []string{`idle "status":"idle"`, `busy "status":"busy"`, `idle "status":"idle"`}; strings.Join(calls, "|") != strings.Join(want, "|") {
			t.Fatalf("fleet-turn calls %q, want %q", calls, want)
		}
		r.waitStatus("codex", "idle", 10*time.Second)
		turns := r.stub.Turns()
		if len(turns) != 1 {
			t.Fatalf("the model saw %d turns, want 1: %+v", len(turns), turns)
		}
		n := 0
		for _, text := range turns[0].Texts {
			n += strings.Count(text, body)
		}
		if n != 1 || !strings.Contains(turns[0].Prompt, body) || !strings.Contains(turns[0].Prompt, "[fleet send from alice@h1 · msg "+id) {
			t.Fatalf("the body is in the user texts %d times (want 1); prompt %q", n, turns[0].Prompt)
		}
		st := r.fleet("fleet-send", "--as", "alice", "--status", id, "--json")
		if !strings.Contains(st, `"state":"delivered"`) {
			t.Fatalf("status: %s", st)
		}
		r.waitScreen(pane, `stub reply`, 10*time.Second)
	})

	t.Run("tool", func(t *testing.T) {
		r.t = t
		marker := filepath.Join(r.dir, "marker")
		before := len(r.stub.Turns())
		r.send("codex", "STUB:TOOL=touch "+marker)
		turns := r.waitTurns(before+2, 30*time.Second)
		r.waitTurnCalls(5, 30*time.Second)
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("the tool call did not run: %v; turns %+v", err, turns[before:])
		}
		last := turns[before+1]
		if !strings.Contains(last.ToolResult, "Process exited with code 0") {
			t.Fatalf("the tool result: %q", last.ToolResult)
		}
		if !strings.HasPrefix(turns[before].Answer, "tool exec_command: touch ") {
			t.Fatalf("the stub answered %q", turns[before].Answer)
		}
	})

	t.Run("interrupt", func(t *testing.T) {
		r.t = t
		before := len(r.stub.Turns())
		r.send("codex", "STUB:SLOW=60 a long one")
		r.waitTurns(before+1, 30*time.Second)
		r.waitStatus("codex", "busy", 10*time.Second)
		r.waitScreen(pane, codexWorkingRE.String(), 10*time.Second)
		r.tmux("send-keys", "-t", pane, "Escape")
		// Interrupt, not Stop, runs: its hook marks the entity idle
		calls := r.waitTurnCalls(7, 20*time.Second)
		if calls[6] != `idle "status":"idle"` {
			t.Fatalf("fleet-turn calls %q", calls)
		}
		r.waitScreen(pane, `Conversation interrupted`, 10*time.Second)
	})
}
