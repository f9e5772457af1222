package fleet_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The real Codex CLI (0.169) in a tmux pane, on the stub model, with
// scripts/hooks/codex-hooks.json as its hooks (fleet-roster hooks install
// codex --trust): what docs/agent-clis/codex.md
// found, checked.

// codexIdleRE and codexWorkingRE tell Codex's screen at the prompt from
// mid-turn: a turn shows "• Working (Ns • esc to interrupt)" above the
// composer, the footer "? for shortcuts" is there in both.
var (
	codexWorkingRE = regexp.MustCompile(`esc to interrupt\)`)
	codexReadyRE   = regexp.MustCompile(`\? for shortcuts`)
)

// codexRig is a rig with a CODEX_HOME set up as a user would: the stub as
// a custom model provider, the project folder trusted, no approvals or
// sandbox, the shipped hooks installed and trusted.
type codexRig struct {
	*agentRig
	codexHome string
	turnLog   string // what the fleet-turn shim saw, a line a call
}

// codexSetup writes CODEX_HOME's config.toml for the stub, trusting the
// project folder, and installs fleet's recipe with its hook trust; it
// returns CODEX_HOME.
func codexSetup(t *testing.T, r *agentRig) string {
	t.Helper()
	home := filepath.Join(r.home, ".codex")
	if err := os.MkdirAll(home, 0o700); err != nil {
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
	if err := os.WriteFile(filepath.Join(home, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// the recipe and its hook trust, by fleet's installer, as a user would
	// (Codex runs no hook it has not trusted)
	r.fleet("fleet-roster", "hooks", "install", "codex", "--trust")
	if st := r.fleet("fleet-roster", "hooks", "status", "codex", "--json"); !strings.Contains(st, `"missing":[],"blockers":[]`) {
		t.Fatalf("fleet-roster hooks status codex after install: %s", st)
	}
	return home
}

func newCodexRig(t *testing.T, gwEnv ...string) *codexRig {
	t.Helper()
	r := &codexRig{agentRig: newAgentRig(t, gwEnv...)}
	r.codexHome = codexSetup(t, r.agentRig)
	r.turnLog = filepath.Join(r.dir, "fleet-turn.log")
	// a fleet-turn ahead of the real one on PATH that logs each call: its
	// argument, the pane it ran in, and the status of each inject entity
	// after the real one ran ("busy %0 codex=busy codex-b=idle")
	shim := filepath.Join(r.dir, "shim")
	if err := os.MkdirAll(shim, 0o700); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	script := fmt.Sprintf(`#!/bin/sh
%s "$@"
rc=$?
echo "$1 $TMUX_PANE" $(fleet-roster --json | sed -n 's/^{"name":"\([^"]*\)".*"mode":"inject".*"status":"\([a-z]*\)".*/\1=\2/p') >> %s
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
func (r *codexRig) start(name string, join ...string) string {
	r.t.Helper()
	// tmux (3.3) gives a new pane the client's PATH whatever -e says: the
	// shim goes on PATH in the command line
	pane, run := r.gatedPane(name, "PATH="+filepath.Join(r.dir, "shim")+":$PATH exec "+agentBin(r.t, "codex")+" --no-daemon",
		"CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key")
	r.fleet("fleet-roster", append([]string{"join", name, "--mode", "inject", "--tmux-target", pane,
		"--program", "node", "--paste", "bracketed", "--idle-screen", "2s"}, join...)...)
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

// turnCalls is what the fleet-turn shim logged so far, a call a line.
func (r *codexRig) turnCalls() []string {
	b, _ := os.ReadFile(r.turnLog)
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// call is a line of the shim's log: fleet-turn's argument, the pane it ran
// in, each inject entity's status after it ("codex=busy").
func call(arg, pane string, statuses ...string) string {
	return strings.Join(append([]string{arg, pane}, statuses...), " ")
}

// startInShell starts an interactive bash in a pane of session name, joins
// it as the inject entity name for the program node (Codex's launcher),
// and types Codex's command line into the shell: the entity reads
// detached while bash is in front, then idle from the screen once Codex
// is up; when Codex exits, the pane is back at bash.
func (r *codexRig) startInShell(name string) string {
	r.t.Helper()
	pane := r.pane(name, "bash --norc", "CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key")
	r.fleet("fleet-roster", "join", name, "--mode", "inject", "--tmux-target", pane,
		"--program", "node", "--paste", "bracketed", "--idle-screen", "2s")
	r.waitStatus(name, "detached", 10*time.Second)
	r.tmux("send-keys", "-t", pane, "-l", "PATH="+filepath.Join(r.dir, "shim")+":$PATH "+agentBin(r.t, "codex")+" --no-daemon")
	r.tmux("send-keys", "-t", pane, "Enter")
	r.waitScreen(pane, codexReadyRE.String(), 30*time.Second)
	r.waitStatus(name, "idle", 30*time.Second)
	return pane
}

func TestCodex(t *testing.T) {
	agentTest(t)
	r := newCodexRig(t)
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	pane := r.start("codex")
	r.waitStatus("codex", "idle", 30*time.Second) // read from the screen
	// no dialog, and no hook yet: Codex 0.169 starts its session (and runs
	// SessionStart) at the first prompt, not at launch
	if s := r.screen(pane); strings.Contains(s, "Hooks need review") || strings.Contains(s, "trust") {
		t.Fatalf("a dialog at start:\n%s", s)
	}
	roster, _, _ := r.fleetTry("fleet-roster", "--json")
	t.Logf("roster before the first turn:\n%s", roster)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(r.turnLog)
			t.Logf("fleet-turn calls:\n%s\nscreen of %s:\n%s", b, pane, r.screen(pane))
		}
	})

	t.Run("message", func(t *testing.T) {
		r.t = t
		body := "Please look at issue 7 of the codex rig."
		id := r.sendID("codex", body)
		r.waitTurns(1, 30*time.Second)
		// SessionStart, UserPromptSubmit, Stop
		calls := r.waitTurnCalls(3, 30*time.Second)
		if want := []string{call("idle", pane, "codex=idle"), call("busy", pane, "codex=busy"), call("idle", pane, "codex=idle")}; strings.Join(calls, "|") != strings.Join(want, "|") {
			t.Fatalf("fleet-turn calls %q, want %q", calls, want)
		}
		r.waitStatus("codex", "idle", 10*time.Second)
		turns := r.stub.Turns()
		if len(turns) != 1 {
			t.Fatalf("the model saw %d turns, want 1: %+v", len(turns), turns)
		}
		if n := count(turns[0].Texts, body); n != 1 || !strings.Contains(turns[0].Prompt, body) || !strings.Contains(turns[0].Prompt, "[fleet send from alice@h1 · msg "+id) {
			t.Fatalf("the body is in the user texts %d times (want 1); prompt %q", n, turns[0].Prompt)
		}
		if st := r.msgState(id); st != "delivered" {
			t.Fatalf("status: %s", st)
		}
		r.waitScreen(pane, `stub reply`, 10*time.Second)
		// the recipe's fleet-recv hooks ran with no FLEET_TOKEN: they say
		// so on stderr only, which Codex does not show (exit 0)
		if s := r.screen(pane); regexp.MustCompile(`(?i)hook failed|blocked by hook|fleet-recv`).MatchString(s) {
			t.Errorf("the hooks showed something:\n%s", s)
		}
	})

	t.Run("tool", func(t *testing.T) {
		r.t = t
		marker := filepath.Join(r.dir, "marker")
		before := len(r.stub.Turns())
		r.sendID("codex", "STUB:TOOL=touch "+marker)
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
		r.waitStatus("codex", "idle", 10*time.Second)
	})

	// (3) Escape mid-turn: Codex runs Interrupt (no Stop), whose hook
	// marks the entity idle; the next message is a turn of its own
	t.Run("interrupt", func(t *testing.T) {
		r.t = t
		n := len(r.turnCalls())
		r.sendID("codex", "STUB:SLOW=60 a long one")
		r.turnWith("a long one", 30*time.Second)
		r.waitStatus("codex", "busy", 10*time.Second)
		r.waitScreen(pane, codexWorkingRE.String(), 10*time.Second)
		escaped := time.Now()
		r.tmux("send-keys", "-t", pane, "Escape")
		// UserPromptSubmit, then Interrupt (not Stop): idle
		calls := r.waitTurnCalls(n+2, 20*time.Second)
		if got, want := calls[n+1], call("idle", pane, "codex=idle"); got != want {
			t.Fatalf("fleet-turn calls %q, want %q last", calls[n:], want)
		}
		r.waitStatus("codex", "idle", 10*time.Second)
		t.Logf("Escape to idle (issue 40.4): %v", time.Since(escaped).Round(10*time.Millisecond))
		r.waitScreen(pane, `Conversation interrupted`, 10*time.Second)
		body := "after the interrupt, a new one"
		id := r.sendID("codex", body)
		turn := r.turnWith(body, 30*time.Second)
		if strings.Count(turn.Prompt, body) != 1 || strings.Contains(turn.Prompt, "a long one") || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the turn after the interrupt has the prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus("codex", "idle", 20*time.Second)
	})

	// (1) two messages sent back to back are two turns, the second sent
	// once the first turn ended (its answer takes 2 s: time enough to
	// paste the second into the running turn, which the gateway must not)
	t.Run("back-to-back", func(t *testing.T) {
		r.t = t
		backToBack(t, r.agentRig, "codex")
	})

	// (2) a message sent while a slow turn runs waits for its end: Codex
	// would steer the running turn with it (docs/agent-clis/codex.md: the
	// in-flight request cancelled, a new one of the same turn with both
	// messages, no answer to the first in it)
	t.Run("during-slow-turn", func(t *testing.T) {
		r.t = t
		bodyA, bodyB := "a slow one STUB:SLOW=8", "sent while the slow one runs"
		idA := r.sendID("codex", bodyA)
		a := r.turnWith(bodyA, 30*time.Second)
		r.waitScreen(pane, codexWorkingRE.String(), 10*time.Second)
		idB := r.sendID("codex", bodyB)
		b := r.turnWith(bodyB, 60*time.Second)
		checkTwoTurns(t, r.stub.Requests(), a, b, bodyA, idA, bodyB, idB, 8*time.Second)
		r.waitState(idB, "delivered", 20*time.Second)
		r.waitStatus("codex", "idle", 20*time.Second)
	})

	// urgent mail waits for the turn's end too, and is the next turn
	t.Run("urgent-first", func(t *testing.T) {
		r.t = t
		urgentFirst(t, r.agentRig, "codex", 6*time.Second, func() { r.waitScreen(pane, codexWorkingRE.String(), 10*time.Second) })
	})

	// (5) three lines are one prompt of three lines (bracketed paste)
	t.Run("multi-line", func(t *testing.T) {
		r.t = t
		body := "line one\nline two\nline three"
		id := r.sendID("codex", body)
		turn := r.turnWith("line one", 30*time.Second)
		if !strings.Contains(turn.Prompt, body) || count(turn.Texts, "line one") != 1 || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the prompt is not the three lines once: %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus("codex", "idle", 20*time.Second)
		for _, u := range r.stub.Turns() {
			if strings.Contains(u.Prompt, "line t") && !strings.Contains(u.Prompt, "line one") {
				t.Errorf("a turn with a part of the lines: %q", u.Prompt)
			}
		}
	})

	// (7) two Codex entities in two panes on one CODEX_HOME: each one's
	// hooks mark its own entity only
	var paneB string
	t.Run("two-panes", func(t *testing.T) {
		r.t = t
		paneB = r.startInShell("codex-b")
		n := len(r.turnCalls())
		body := "to the second codex"
		id := r.sendID("codex-b", body)
		r.turnWith(body, 30*time.Second)
		// its SessionStart, UserPromptSubmit and Stop, in pane B
		calls := r.waitTurnCalls(n+3, 30*time.Second)[n:]
		want := []string{call("idle", paneB, "codex=idle", "codex-b=idle"), call("busy", paneB, "codex=idle", "codex-b=busy"),
			call("idle", paneB, "codex=idle", "codex-b=idle")}
		if strings.Join(calls, "|") != strings.Join(want, "|") {
			t.Errorf("fleet-turn calls %q, want %q", calls, want)
		}
		r.waitState(id, "delivered", 20*time.Second)
		n += 3
		body = "to the first codex"
		id = r.sendID("codex", body)
		r.turnWith(body, 30*time.Second)
		calls = r.waitTurnCalls(n+2, 30*time.Second)[n:]
		want = []string{call("busy", pane, "codex=busy", "codex-b=idle"), call("idle", pane, "codex=idle", "codex-b=idle")}
		if strings.Join(calls, "|") != strings.Join(want, "|") {
			t.Errorf("fleet-turn calls %q, want %q", calls, want)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus("codex", "idle", 20*time.Second)
		r.waitStatus("codex-b", "idle", 20*time.Second)
	})

	// (6) the agent exited, its pane is back at bash: nothing is typed
	// there, the message is held
	t.Run("exited", func(t *testing.T) {
		r.t = t
		if paneB == "" {
			t.Skip("no second pane")
		}
		// an Enter right after the typed keys left /quit in the composer
		// (likely Codex's paste-burst detection): the Enter once /quit
		// shows, and a pause
		exitedGetsNothing(t, r.agentRig, paneB, "codex-b", `› /quit`)
	})

	// (8) --interrupt-on-urgent codex (issue 37.3): urgent mail for a
	// Codex in a long turn presses its Escape; the Interrupt hook marks it
	// idle and the urgent message is the next turn, long before the slow
	// one would have ended; the routine mail sent before it follows. Last:
	// a third pane's entity would change every status line above.
	t.Run("interrupt-on-urgent", func(t *testing.T) {
		r.t = t
		paneU := r.start("codex-u", "--interrupt-on-urgent", "codex")
		r.waitStatus("codex-u", "idle", 30*time.Second)
		bodyA, bodyN, bodyU := "STUB:SLOW=90 a long one, interrupted", "routine, sent during the long one", "urgent: stop the long one"
		r.sendID("codex-u", bodyA)
		a := r.turnWith("a long one, interrupted", 30*time.Second)
		r.waitStatus("codex-u", "busy", 10*time.Second)
		r.waitScreen(paneU, codexWorkingRE.String(), 10*time.Second)
		idN := r.sendID("codex-u", bodyN)
		out := r.fleet("fleet-send", "--as", "alice", "--json", "--urgent", "codex-u", bodyU)
		m := regexp.MustCompile(`"msg_id":"([^"]+)"`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("fleet-send --urgent printed no msg_id: %s", out)
		}
		idU := m[1]
		u := r.turnWith(bodyU, 30*time.Second)
		if d := u.Time.Sub(a.Time); d > 60*time.Second {
			t.Errorf("the urgent turn came %v after the long one: not interrupted", d)
		}
		r.waitScreen(paneU, `Conversation interrupted`, 10*time.Second)
		if strings.Count(u.Prompt, bodyU) != 1 || strings.Contains(u.Prompt, bodyN) || !strings.Contains(u.Prompt, "[fleet urgent send from alice@") {
			t.Errorf("the urgent turn's prompt %q", u.Prompt)
		}
		n := r.turnWith(bodyN, 60*time.Second)
		if !n.Time.After(u.Time) {
			t.Errorf("the routine message came before the urgent one")
		}
		r.waitState(idU, "delivered", 20*time.Second)
		r.waitState(idN, "delivered", 20*time.Second)
		r.waitStatus("codex-u", "idle", 20*time.Second)
		audit, _ := os.ReadFile(filepath.Join(r.dir, "h1", "audit.log"))
		if !regexp.MustCompile(`"event":"interrupted".*"msg_id":"` + idU + `".*urgent: codex.s Escape pressed in `).Match(audit) {
			t.Errorf("no interrupted line for %s in the audit log", idU)
		}
	})

	// (9) joined at a shell with nothing named (no --program, no
	// --idle-screen), a message sent, then codex typed there, the usual
	// way (issue 40.3): Codex runs its first hook only with its first
	// prompt, so the gateway recognises it from its process in the pane,
	// reads idle from its ready prompt, and the message is that prompt.
	t.Run("typed-at-shell", func(t *testing.T) {
		r.t = t
		paneS := r.pane("codex-s", "bash --norc", "CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key")
		r.fleet("fleet-roster", "join", "codex-s", "--mode", "inject", "--tmux-target", paneS, "--paste", "bracketed")
		body := "sent before codex was typed"
		id := r.sendID("codex-s", body)
		if st := r.msgState(id); st != "accepted" {
			t.Fatalf("message %s reads %s before codex runs", id, st)
		}
		r.tmux("send-keys", "-t", paneS, "-l", "PATH="+filepath.Join(r.dir, "shim")+":$PATH "+agentBin(r.t, "codex")+" --no-daemon")
		r.tmux("send-keys", "-t", paneS, "Enter")
		turn := r.turnWith(body, 60*time.Second)
		if strings.Count(turn.Prompt, body) != 1 || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the first prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus("codex-s", "idle", 20*time.Second)
		if line := r.rosterLine("codex-s"); !strings.Contains(line, `"program":"node"`) {
			t.Errorf("the roster line %s", line)
		}
	})
}

// (4) An API error: Codex runs no hook after it (docs/agent-clis/codex.md),
// so the entity stays busy from its UserPromptSubmit; with a short
// stuck-after it goes stuck, then idle from its still screen (joined
// --idle-screen 2s), and the next message is a turn of its own. A rig of
// its own: stuck-after 5s would make every slow turn above stuck too.
func TestCodexAPIError(t *testing.T) {
	agentTest(t)
	r := newCodexRig(t, "FLEET_STUCK_AFTER=5s", "FLEET_CONFIRM_WITHIN=10s")
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	pane := r.start("codex")
	r.waitStatus("codex", "idle", 30*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(r.turnLog)
			t.Logf("fleet-turn calls:\n%s\nscreen:\n%s", b, r.screen(pane))
		}
	})
	for _, code := range []string{"500", "429"} {
		t.Run(code, func(t *testing.T) {
			r.t = t
			bodyErr := "this one fails STUB:ERROR=" + code
			idErr := r.sendID("codex", bodyErr)
			r.turnWith(bodyErr, 30*time.Second)
			r.waitState(idErr, "delivered", 20*time.Second) // its UserPromptSubmit came
			r.waitScreen(pane, `(?m)^■ `, 20*time.Second)
			r.waitStatus("codex", "stuck", 20*time.Second)
			r.waitStatus("codex", "idle", 20*time.Second) // from the screen
			body := "after the " + code
			id := r.sendID("codex", body)
			turn := r.turnWith(body, 30*time.Second)
			if strings.Count(turn.Prompt, body) != 1 || strings.Contains(turn.Prompt, "STUB:ERROR") || !strings.Contains(turn.Prompt, "· msg "+id) {
				t.Errorf("the turn after the error has the prompt %q", turn.Prompt)
			}
			r.waitState(id, "delivered", 20*time.Second)
			r.waitStatus("codex", "idle", 20*time.Second) // its Stop
			// retries cut: the failed message was one turn request
			n := 0
			for _, u := range r.stub.Turns() {
				if strings.Contains(u.Prompt, bodyErr) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("the failing message was sent %d times, want 1", n)
			}
		})
	}
}
