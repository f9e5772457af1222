package fleet_test

import (
	"encoding/json"
	"github.com/fleetd/fleet/internal/testnode"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
)

// The real Claude Code in a tmux pane of the rig, talking to the stub
// model (ANTHROPIC_BASE_URL), configured the way a user would so that it
// starts straight at its input prompt (docs/agent-clis/claude.md says which
// dialogs that skips), with the shipped hook snippet
// (scripts/hooks/claude-code-settings.json) wiring fleet-turn to its
// turns.

// claudeKey is the fake API key; Claude Code asks once whether to use a
// key from the environment and remembers the answer by its last 20
// characters (customApiKeyResponses).
const claudeKey = "sk-ant-api03-fleet-stub-model-key-0123456789abcdef"

// claudeReady is the idle prompt's status line (manual permission mode);
// mid-turn the same line says "esc to interrupt" instead.
const claudeReady = `\? for shortcuts`

// claudeShell is the pane's shell prompt (bash, no rc file).
const claudeShell = `[#$] $`

// claudeHookEvents are the hook events the test records (every one the
// recipe uses, and the tool and session ones around them).
var claudeHookEvents = []string{"SessionStart", "SessionEnd", "UserPromptSubmit", "Stop", "StopFailure",
	"Notification", "PreToolUse", "PostToolUse", "PostToolUseFailure"}

type claudeRun struct {
	r     *agentRig
	name  string // the entity
	pane  string
	token string
	hooks string // the hook events as Claude Code passed them, JSON lines
}

// claudeConfig writes the user's configuration under the rig's HOME:
// ~/.claude.json (onboarding done, the project folder trusted, the key
// approved, the auto-mode offer seen) and ~/.claude/settings.json (the
// shipped hook snippet, a recording hook on every event, and Bash
// allowed in manual permission mode).
func claudeConfig(t *testing.T, r *agentRig, hooksLog string) {
	t.Helper()
	state := map[string]any{
		"hasCompletedOnboarding":  true,
		"theme":                   "dark",
		"hasSeenAutoDefaultNudge": true,
		"customApiKeyResponses": map[string]any{
			"approved": []string{claudeKey[len(claudeKey)-20:]}, "rejected": []string{}},
		"projects": map[string]any{r.work: map[string]any{"hasTrustDialogAccepted": true}},
	}
	writeJSONFile(t, filepath.Join(r.home, ".claude.json"), state)

	// the user's own settings first: a recording hook on every event and
	// Bash allowed in manual permission mode; then fleet's recipe merged
	// in by its installer, as a user would
	rec := map[string]any{"type": "command", "timeout": 10,
		"command": "cat >> '" + hooksLog + "'; echo >> '" + hooksLog + "'"}
	hooks := map[string]any{}
	for _, ev := range claudeHookEvents {
		hooks[ev] = []any{map[string]any{"hooks": []any{rec}}}
	}
	settings := map[string]any{"hooks": hooks,
		"permissions": map[string]any{"defaultMode": "default", "allow": []string{"Bash"}}}
	writeJSONFile(t, filepath.Join(r.home, ".claude", "settings.json"), settings)
	r.fleet("fleet-roster", "hooks", "install", "claude")
	st := r.fleet("fleet-roster", "hooks", "status", "claude", "--json")
	if !strings.Contains(st, `"missing":[],"blockers":[]`) {
		t.Fatalf("fleet-roster hooks status claude after install: %s", st)
	}
}

func writeJSONFile(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// claudeEnv is Claude Code's environment: the stub, the fake key, no
// updater, telemetry or other traffic, and no retries of a failed
// request (an error is a StopFailure at once, not minutes of backoff).
func claudeEnv(r *agentRig) []string {
	return []string{
		"ANTHROPIC_BASE_URL=" + r.stub.URL(),
		"ANTHROPIC_API_KEY=" + claudeKey,
		"ANTHROPIC_AUTH_TOKEN=",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"CLAUDE_CODE_MAX_RETRIES=0",
	}
}

// startClaude starts a shell in a pane, joins it as entity name (inject
// mode), and runs claude in it with the entity's credential, waiting for
// its idle prompt.
func startClaude(t *testing.T, r *agentRig, name string, join ...string) *claudeRun {
	t.Helper()
	agentBin(t, "claude")
	c := &claudeRun{r: r, name: name, hooks: filepath.Join(r.dir, "claude-hooks.jsonl")}
	claudeConfig(t, r, c.hooks)
	c.pane = r.pane(name, "bash --norc --noprofile -i", claudeEnv(r)...)
	r.waitScreen(c.pane, claudeShell, 10*time.Second)
	if cmd := paneCommand(r, c.pane); cmd != "bash" {
		t.Errorf("the pane's command before claude is %q, want bash", cmd)
	}
	// claude writes under HOME until it is gone: end it before the
	// test's folder is removed (cleanups run last first)
	shell := r.tmux("display", "-p", "-t", c.pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(r, c.pane, shell) })
	if join == nil {
		join = []string{"--idle-screen", "2s", "--paste", "bracketed"}
	}
	out := r.fleet("fleet-roster", append([]string{"join", name, "--mode", "inject", "--tmux-target", c.pane}, join...)...)
	c.token = strings.Fields(out)[0]
	start := time.Now()
	r.tmux("send-keys", "-t", c.pane, "-l", "FLEET_TOKEN="+c.token+" claude")
	r.tmux("send-keys", "-t", c.pane, "Enter")
	r.waitScreen(c.pane, claudeReady, 30*time.Second)
	t.Logf("claude ready after %v", time.Since(start).Round(10*time.Millisecond))
	c.waitHook(t, "SessionStart", 1)
	return c
}

// endClaude kills pane's session and waits for the processes under its
// shell (pid shell) to exit.
func endClaude(r *agentRig, pane, shell string) {
	var pids []string
	var walk func(pid string)
	walk = func(pid string) {
		b, _ := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children")
		for _, k := range strings.Fields(string(b)) {
			pids = append(pids, k)
			walk(k)
		}
	}
	walk(shell)
	cmd := exec.Command("tmux", "kill-session", "-t", pane)
	cmd.Env = r.env()
	cmd.Run()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if _, err := os.Stat("/proc/" + pid); err != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// paneCommand is tmux's #{pane_current_command} of pane.
func paneCommand(r *agentRig, pane string) string {
	return r.tmux("display", "-p", "-t", pane, "#{pane_current_command}")
}

// hookEvents are the hook events recorded so far, in order.
func (c *claudeRun) hookEvents(t *testing.T) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(c.hooks)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var evs []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("hook log line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// hookNames are the recorded hook event names, in order.
func (c *claudeRun) hookNames(t *testing.T) []string {
	var names []string
	for _, ev := range c.hookEvents(t) {
		names = append(names, ev["hook_event_name"].(string))
	}
	return names
}

// waitHook waits until event has fired n times in all.
func (c *claudeRun) waitHook(t *testing.T, event string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		k := 0
		for _, name := range c.hookNames(t) {
			if name == event {
				k++
			}
		}
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hook %s fired %d time(s), want %d; events: %v", event, k, n, c.hookNames(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// send sends body to the entity as alice and returns the message id.
func (c *claudeRun) send(t *testing.T, body string) string {
	t.Helper()
	return c.r.sub(t).sendID(c.name, body)
}

// waitState waits until message id reads state.
func (c *claudeRun) waitState(t *testing.T, id, state string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, _ := c.r.fleetTry("fleet-send", "--as", "alice", "--json", "--status", id)
		if strings.Contains(out, `"state":"`+state+`"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s never read %s: %s%s", id, state, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// turnsWith are the stub's turns whose prompt contains s.
func turnsWith(r *agentRig, s string) []stubmodel.Request {
	var out []stubmodel.Request
	for _, q := range r.stub.Turns() {
		if strings.Contains(q.Prompt, s) {
			out = append(out, q)
		}
	}
	return out
}

// waitTurnsWith waits until the stub has seen n turns whose prompt
// contains s.
func waitTurnsWith(t *testing.T, r *agentRig, s string, n int) []stubmodel.Request {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if turns := turnsWith(r, s); len(turns) >= n {
			return turns
		}
		if time.Now().After(deadline) {
			t.Fatalf("the model saw %d turn(s) with %q, want %d; all requests: %+v", len(turnsWith(r, s)), s, n, r.stub.Requests())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRow waits until entity name's roster row matches re.
func waitRow(t *testing.T, r *agentRig, name, re string, within time.Duration) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for {
		out, _, _ := r.fleetTry("fleet-roster", "--json")
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, `"name":"`+name+`"`) && rx.MatchString(line) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's row never matched %q within %v; roster:\n%s", name, re, within, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sub is the rig reporting to the subtest t.
func (r *agentRig) sub(t *testing.T) *agentRig {
	c := *r
	c.t = t
	return &c
}

func TestClaudeCode(t *testing.T) {
	agentTest(t)
	agentBin(t, "claude")
	// an interrupted turn runs no hook: the safety net's stuck-after and
	// idle-screen bring the entity back (short here)
	rig := newAgentRig(t, "FLEET_STUCK_AFTER=3s")
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := startClaude(t, rig, "claude")
	if cmd := paneCommand(rig, c.pane); cmd != "claude" {
		t.Errorf("the pane's command at claude's prompt is %q, want claude", cmd)
	}
	rig.waitStatus(c.name, "idle", 10*time.Second)

	t.Run("message", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		// slow enough that the roster reads busy while the turn runs
		body := "hello from alice, message one STUB:SLOW=2"
		id := c.send(t, body)
		waitTurnsWith(t, r, body, 1)
		r.waitStatus(c.name, "busy", 10*time.Second)
		if cmd := paneCommand(r, c.pane); cmd != "claude" {
			t.Errorf("the pane's command mid-turn is %q, want claude", cmd)
		}
		c.waitHook(t, "Stop", 1)
		r.waitStatus(c.name, "idle", 10*time.Second)
		c.waitState(t, id, "delivered")
		r.waitScreen(c.pane, claudeReady, 10*time.Second)

		turns := turnsWith(r, body)
		if len(turns) != 1 {
			t.Fatalf("the model saw %d turns with the message, want 1: %+v", len(turns), turns)
		}
		q := turns[0]
		if q.Vendor != "anthropic" || q.Model == "" || q.Status != 200 {
			t.Errorf("the turn: vendor %q model %q status %d", q.Vendor, q.Model, q.Status)
		}
		if n := strings.Count(q.Prompt, body); n != 1 {
			t.Errorf("the prompt holds the body %d times, want 1: %q", n, q.Prompt)
		}
		if n := strings.Count(strings.Join(q.Texts, "\n"), body); n != 1 {
			t.Errorf("the user texts hold the body %d times, want 1: %q", n, q.Texts)
		}
		if !strings.HasPrefix(q.Prompt, "[fleet send from alice@h1 · msg "+id) {
			t.Errorf("the prompt does not start with the gateway's header: %q", q.Prompt)
		}
		if got := len(r.stub.Turns()); got != 1 {
			t.Errorf("the model saw %d turns in all, want 1: %+v", got, r.stub.Turns())
		}
		if names := c.hookNames(t); !containsSeq(names, "SessionStart", "UserPromptSubmit", "Stop") {
			t.Errorf("hooks fired %v, want SessionStart, UserPromptSubmit, Stop in order", names)
		}
	})

	t.Run("tool", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		marker := filepath.Join(r.dir, "claude-tool-marker")
		body := "please run STUB:TOOL=touch " + marker
		id := c.send(t, body)
		waitTurnsWith(t, r, body, 2)
		c.waitHook(t, "Stop", 2)
		r.waitStatus(c.name, "idle", 10*time.Second)
		c.waitState(t, id, "delivered")
		turns := turnsWith(r, body)
		if len(turns) != 2 {
			t.Fatalf("the model saw %d requests for the tool turn, want 2 (the call, its result): %+v", len(turns), turns)
		}
		if turns[0].ToolResult != "" || !strings.HasPrefix(turns[0].Answer, "tool_use Bash: touch ") {
			t.Errorf("the first request: tool result %q, answer %q", turns[0].ToolResult, turns[0].Answer)
		}
		if turns[1].ToolResult == "" {
			t.Errorf("the second request carries no tool result: %+v", turns[1])
		}
		if _, err := os.Stat(marker); err != nil {
			t.Errorf("the Bash tool did not run: %v", err)
		}
		if names := c.hookNames(t); !containsSeq(names, "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop") {
			t.Errorf("hooks fired %v, want UserPromptSubmit, PreToolUse, PostToolUse, Stop", names)
		}
	})

	// the cases of agentcases_test.go: two messages back to back are two
	// turns, the second sent only after the first ended; one sent during a
	// slow turn waits for it; three lines are one prompt of three lines
	t.Run("back-to-back", func(t *testing.T) { backToBack(t, rig.sub(t), c.name) })
	t.Run("during-slow-turn", func(t *testing.T) {
		r := rig.sub(t)
		bodyA, bodyB := "a slow one STUB:SLOW=6", "sent while the slow one runs"
		idA := r.sendID(c.name, bodyA)
		a := r.turnWith(bodyA, 30*time.Second)
		r.waitScreen(c.pane, `esc to interrupt`, 10*time.Second)
		idB := r.sendID(c.name, bodyB)
		b := r.turnWith(bodyB, 60*time.Second)
		checkTwoTurns(t, r.stub.Requests(), a, b, bodyA, idA, bodyB, idB, 6*time.Second)
		r.waitState(idB, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
	})
	t.Run("urgent-first", func(t *testing.T) {
		r := rig.sub(t)
		urgentFirst(t, r, c.name, 5*time.Second, func() { r.waitScreen(c.pane, `esc to interrupt`, 10*time.Second) })
	})
	t.Run("multi-line", func(t *testing.T) {
		r := rig.sub(t)
		body := "line one\nline two\nline three"
		id := r.sendID(c.name, body)
		turn := r.turnWith("line one", 30*time.Second)
		if !strings.Contains(turn.Prompt, body) || count(turn.Texts, "line one") != 1 || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the prompt is not the three lines once: %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
	})

	t.Run("error", func(t *testing.T) {
		// a failing request ends the turn with StopFailure (no retries:
		// CLAUDE_CODE_MAX_RETRIES=0), which the recipe makes idle
		r := rig.sub(t)
		c.r = r
		body := "this one fails STUB:ERROR=529"
		id := c.send(t, body)
		waitTurnsWith(t, r, body, 1)
		c.waitHook(t, "StopFailure", 1)
		r.waitStatus(c.name, "idle", 10*time.Second)
		c.waitState(t, id, "delivered")
		r.waitScreen(c.pane, `API Error: 529`, 10*time.Second)
		r.waitScreen(c.pane, claudeReady, 10*time.Second)
		turns := turnsWith(r, body)
		if len(turns) != 1 || turns[0].Status != 529 {
			t.Errorf("the model saw %+v, want one request answered 529", turns)
		}
		// and the next message goes through
		body2 := "after the error, message two"
		c.send(t, body2)
		waitTurnsWith(t, r, body2, 1)
		c.waitHook(t, "Stop", 3)
		r.waitStatus(c.name, "idle", 10*time.Second)
	})

	t.Run("escape", func(t *testing.T) {
		// Escape mid-turn: Claude Code puts the interrupted prompt back in
		// its input box and fires no Stop or StopFailure (see
		// docs/agent-clis/claude.md): the entity stays busy.
		r := rig.sub(t)
		c.r = r
		body := "interrupt me STUB:SLOW=30"
		c.send(t, body)
		waitTurnsWith(t, r, body, 1)
		r.waitStatus(c.name, "busy", 10*time.Second)
		r.waitScreen(c.pane, `esc to interrupt`, 10*time.Second)
		before := len(c.hookEvents(t))
		r.tmux("send-keys", "-t", c.pane, "Escape")
		// the input box (between two rules), not the transcript's copy
		// (pasted bracketed: the header line, then the body line)
		scr := r.waitScreen(c.pane, `─\n❯[ \x{a0}]\[fleet send from alice@h1 [^\n]*\] *\n +interrupt me STUB:SLOW=30 *\n─`, 10*time.Second)
		t.Logf("after Escape:\n%s", scr)
		var after []string
		for _, ev := range c.hookEvents(t)[before:] {
			after = append(after, ev["hook_event_name"].(string))
		}
		t.Logf("hooks after Escape: %v", after)
		// no hook says the turn ended: busy, then stuck past stuck-after;
		// idle is not read from the screen while the interrupted message
		// sits in the input (a paste would send it again)
		r.waitStatus(c.name, "stuck", 15*time.Second)
		waitRow(t, r, c.name, `"status":"stuck","status_reason":"an interrupted message is back in the agent's input`, 15*time.Second)
		// the person at the pane clears it: idle from the still screen,
		// and the next message is one turn of its own
		// (Ctrl-U clears a line: the body's, then, joined by a backspace,
		// the header's)
		r.tmux("send-keys", "-t", c.pane, "C-u")
		r.tmux("send-keys", "-t", c.pane, "BSpace")
		r.tmux("send-keys", "-t", c.pane, "C-u")
		r.waitScreen(c.pane, claudeReady, 10*time.Second)
		waitRow(t, r, c.name, `"status":"idle","status_reason":"read from the screen`, 15*time.Second)
		next := "after the escape, a message of its own"
		c.send(t, next)
		turns := waitTurnsWith(t, r, next, 1)
		if strings.Contains(turns[0].Prompt, "interrupt me") {
			t.Errorf("the interrupted message was sent again with the next: %q", turns[0].Prompt)
		}
		r.waitStatus(c.name, "idle", 15*time.Second)
	})

	t.Run("exit", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		r.tmux("send-keys", "-t", c.pane, "-l", "/exit")
		time.Sleep(300 * time.Millisecond) // the command menu
		r.tmux("send-keys", "-t", c.pane, "Enter")
		r.waitScreen(c.pane, claudeShell, 20*time.Second)
		if cmd := paneCommand(r, c.pane); cmd != "bash" {
			t.Errorf("the pane's command after claude exits is %q, want bash", cmd)
		}
		c.waitHook(t, "SessionEnd", 1)
		// the pane is back at bash: a message is never typed into it (its
		// body would run as a command), it is held, the entity detached
		marker := filepath.Join(r.dir, "PWNED")
		id := c.send(t, "status please; touch "+marker)
		waitRow(t, r, c.name, `"status":"detached","status_reason":"pane %[0-9]+ runs bash, not claude"`, 15*time.Second)
		// the sentinel: the delivery loop saw the message and held it
		r.waitLog(0, `"msg":"held: the agent is not idle".*"entity":"`+c.name+`","status":"detached","msg_id":"`+id+`"`, 15*time.Second)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the body ran as a shell command in the pane claude left")
		}
		if st := r.fleet("fleet-send", "--as", "alice", "--json", "--status", id); !strings.Contains(st, `"state":"accepted"`) {
			t.Fatalf("the held message: %s", st)
		}
		if strings.Contains(r.screen(c.pane), "status please") {
			t.Fatalf("the message was typed into the shell:\n%s", r.screen(c.pane))
		}
		for _, q := range r.stub.Requests() {
			if q.Vendor != "anthropic" {
				t.Errorf("claude asked the stub for something it does not serve: %s %s", q.Method, q.Path)
			}
		}
	})
}

// containsSeq says whether want occurs in names in order (not
// necessarily adjacent).
func containsSeq(names []string, want ...string) bool {
	i := 0
	for _, n := range names {
		if i < len(want) && n == want[i] {
			i++
		}
	}
	return i == len(want)
}

// twoHostRig is an agent rig on host h1 and a second gateway h2, each
// with its own login on a fresh vhost of the private broker node, trusting
// each other, presence every second (a TTL of 3 s: a
// loaded machine delays presence past 900 ms). The vhost goes when the test ends,
// after the gateways.
func twoHostRig(t *testing.T, vhost string) (*agentRig, *testGW) {
	t.Helper()
	brokerLock.RLock()
	t.Cleanup(brokerLock.RUnlock)
	url, drop, err := testnode.Vhost(vhost, "h1", "h2") // with their logins
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	login := func(host string) string {
		u, err := testnode.Login(url, host)
		if err != nil {
			t.Fatal(err)
		}
		return "FLEET_BROKER=" + u
	}
	rig := newAgentRig(t, login("h1"), "FLEET_PRESENCE_INTERVAL=1s")
	h2 := newTestGW(t, rig.dir, "h2", login("h2"), "FLEET_PRESENCE_INTERVAL=1s")
	enrolGWs(t, rig.gw, h2)
	return rig, h2
}

// startInPane starts Claude Code with c's credential in a new pane's
// shell, as its user would, and waits for its prompt and its first
// SessionStart hook; the pane's processes end with the test.
func (c *claudeRun) startInPane(t *testing.T) {
	t.Helper()
	r := c.r
	c.pane = r.pane(c.name, "bash --norc --noprofile -i", claudeEnv(r)...)
	r.waitScreen(c.pane, claudeShell, 10*time.Second)
	shell := r.tmux("display", "-p", "-t", c.pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(r, c.pane, shell) })
	r.tmux("send-keys", "-t", c.pane, "-l", "FLEET_TOKEN="+c.token+" claude")
	r.tmux("send-keys", "-t", c.pane, "Enter")
	r.waitScreen(c.pane, claudeReady, 30*time.Second)
	c.waitHook(t, "SessionStart", 1)
}

// prompt types a prompt into Claude Code, as its user would.
func (c *claudeRun) prompt(text string) {
	c.r.waitScreen(c.pane, claudeReady, 20*time.Second)
	c.r.tmux("send-keys", "-t", c.pane, "-l", text)
	time.Sleep(200 * time.Millisecond)
	c.r.tmux("send-keys", "-t", c.pane, "Enter")
}

// hookCount is how many times Claude Code has run its hooks for event.
func (c *claudeRun) hookCount(t *testing.T, event string) int {
	n := 0
	for _, h := range c.hookNames(t) {
		if h == event {
			n++
		}
	}
	return n
}

// The agent answers through its own tool call: a message from boss on
// host h2 (fleet-send --wait, across the broker) is pasted into Claude
// Code on h1; the model's Bash call runs `fleet-send --reply-to ID ...`
// with the entity's credential, and the reply reaches boss's open send on
// h2 — the whole U1 loop through a real agent CLI and a real broker.
func TestClaudeCodeReplyAcrossHosts(t *testing.T) {
	agentBrokerTest(t)
	agentBin(t, "claude")
	rig, h2 := twoHostRig(t, "t-go-agent-reply")
	bossTok := h2.join("boss")
	c := startClaude(t, rig, "claude")
	rig.waitStatus(c.name, "idle", 10*time.Second)

	// boss on h2 asks claude@h1 and holds its send open for the reply
	wait := exec.Command(filepath.Join(binDir, "fleet-send"), "--wait", "--timeout", "90s", "--json",
		"claude@h1", "please reply STUB:TOOL=fleet-send --reply-to {MSGID} done, from the agent")
	wait.Env = append(h2.env, "FLEET_TOKEN="+bossTok, "PATH="+binDir+":"+os.Getenv("PATH"))
	var out, errOut strings.Builder
	wait.Stdout, wait.Stderr = &out, &errOut
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		// h2 hears of claude@h1 within a presence interval or two
		out.Reset()
		errOut.Reset()
		err = wait.Run()
		if exitCode(err) != 75 || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
		wait = exec.Command(wait.Path, wait.Args[1:]...)
		wait.Env = append(h2.env, "FLEET_TOKEN="+bossTok, "PATH="+binDir+":"+os.Getenv("PATH"))
		wait.Stdout, wait.Stderr = &out, &errOut
	}
	if err != nil {
		t.Fatalf("fleet-send --wait: %v\nstdout: %s\nstderr: %s\nscreen:\n%s", err, out.String(), errOut.String(), rig.screen(c.pane))
	}
	if !strings.Contains(out.String(), `"kind":"REPLY"`) || !strings.Contains(out.String(), "done, from the agent") {
		t.Fatalf("boss got %s", out.String())
	}
	// the model called the tool with the message's id, and saw its result
	turns := rig.waitTurns(2, 30*time.Second)
	if len(turns) < 2 || !strings.Contains(turns[0].Answer, "fleet-send --reply-to ") || turns[1].ToolResult == "" {
		for i, q := range turns {
			t.Logf("turn %d: answer %q, tool result %q", i, q.Answer, q.ToolResult)
		}
		t.Fatal("the model did not call fleet-send --reply-to and see its result")
	}
}

// "I already have Claude running in tmux": a Claude Code started in a
// folder it does not trust yet, with no fleet credential in its
// environment, and the pane joined afterwards. Its workspace-trust dialog
// is on the screen, and Claude runs no hook until it is answered: the
// entity reads starting with the dialog as the reason, and a message sent
// meanwhile is held — nothing lands on the dialog (whose default, "No,
// exit", an Enter would pick). Once the person trusts the folder, the
// agent's hooks find their entity by the pane (fleet-turn, no
// credential), the held message is one turn, and hooks doctor --watch
// sees the live loop: busy, then idle.
func TestClaudeCodeJoinedAfterStart(t *testing.T) {
	agentTest(t)
	agentBin(t, "claude")
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := &claudeRun{r: rig, name: "late", hooks: filepath.Join(rig.dir, "claude-hooks.jsonl")}
	claudeConfig(t, rig, c.hooks)
	fresh := filepath.Join(rig.dir, "fresh-project") // not in ~/.claude.json's trusted projects
	if err := os.MkdirAll(fresh, 0o700); err != nil {
		t.Fatal(err)
	}
	c.pane = rig.pane(c.name, "bash --norc --noprofile -i", claudeEnv(rig)...)
	rig.waitScreen(c.pane, claudeShell, 10*time.Second)
	shell := rig.tmux("display", "-p", "-t", c.pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(rig, c.pane, shell) })
	rig.tmux("send-keys", "-t", c.pane, "-l", "cd "+fresh+" && claude")
	rig.tmux("send-keys", "-t", c.pane, "Enter")
	rig.waitScreen(c.pane, `Yes, I trust this folder`, 30*time.Second)

	rig.fleet("fleet-roster", "join", c.name, "--mode", "inject", "--tmux-target", c.pane, "--idle-screen", "1s")
	body := "the first message, held while the dialog is open"
	id := c.send(t, body)
	waitRow(t, rig, c.name, `"status":"starting","status_reason":"a dialog is open in the pane \(.*\): answer it there","program":"claude"`, 15*time.Second)
	// the sentinels: the delivery loop saw the message and held it, and
	// the screen was read with the dialog on it and not taken for idle
	rig.waitLog(0, `"msg":"held: the agent is not idle".*"entity":"`+c.name+`","status":"starting","msg_id":"`+id+`"`, 15*time.Second)
	rig.waitLog(0, `"msg":"not read as idle from the screen: a dialog is open".*"entity":"`+c.name+`","status":"starting"`, 15*time.Second)
	if n := len(turnsWith(rig, body)); n != 0 {
		t.Fatalf("the model saw the message while the trust dialog was open (%d turns)", n)
	}
	if !strings.Contains(rig.screen(c.pane), "Yes, I trust this folder") {
		t.Fatalf("the dialog is gone:\n%s", rig.screen(c.pane))
	}
	if st := rig.fleet("fleet-send", "--as", "alice", "--json", "--status", id); !strings.Contains(st, `"state":"accepted"`) {
		t.Fatalf("the held message: %s", st)
	}

	// the doctor watches while the person answers the dialog
	doctor := exec.Command(filepath.Join(binDir, "fleet-roster"), "hooks", "doctor", "claude", "--entity", c.name, "--watch", "60s", "--json")
	doctor.Env = rig.env()
	var dout, derr strings.Builder
	doctor.Stdout, doctor.Stderr = &dout, &derr
	// (the doctor refuses to watch while the entity reads a held state;
	// it reads starting, which is not one, so it watches)
	if err := doctor.Start(); err != nil {
		t.Fatal(err)
	}
	rig.tmux("send-keys", "-t", c.pane, "Down")
	time.Sleep(300 * time.Millisecond)
	rig.tmux("send-keys", "-t", c.pane, "Enter")
	turns := waitTurnsWith(t, rig, body, 1)
	if n := strings.Count(turns[0].Prompt, body); n != 1 {
		t.Fatalf("the prompt holds the body %d times: %q", n, turns[0].Prompt)
	}
	c.waitState(t, id, "delivered")
	rig.waitStatus(c.name, "idle", 15*time.Second)
	if err := doctor.Wait(); err != nil {
		t.Fatalf("hooks doctor --watch: %v\n%s\n%s", err, dout.String(), derr.String())
	}
	if !strings.Contains(dout.String(), `"loop":["starting","busy","idle"]`) && !strings.Contains(dout.String(), `"busy","idle"]`) {
		t.Fatalf("hooks doctor saw no busy then idle: %s", dout.String())
	}
}

// Two real Claude Code sessions told to answer each other (issue 37.2):
// every message's body makes the model run `fleet-send --reply-to ID`
// with the same body, so ca and cb reply to each other for as long as
// fleet lets them. The gateway cuts the trace past max-hops (3 here): the
// send of hop 4 exits 77 (loop) and the model sees that in its tool's
// result, no turn follows it, the messages delivered are exactly hops 0 to
// 3 (each pasted once), and fleet-trace shows where the loop was cut.
func TestClaudeCodeLoopCut(t *testing.T) {
	agentTest(t)
	agentBin(t, "claude")
	rig := newAgentRig(t, "FLEET_MAX_HOPS=3")
	loop := filepath.Join(rig.dir, "loop.txt")
	body := `answer it STUB:TOOL=fleet-send --reply-to {MSGID} "$(cat ` + loop + `)"`
	if err := os.WriteFile(loop, []byte(body+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := startClaude(t, rig, "ca")
	cb := startClaude(t, rig, "cb")
	rig.waitStatus(ca.name, "idle", 10*time.Second)
	rig.waitStatus(cb.name, "idle", 10*time.Second)

	out := rig.fleet("fleet-send", "--as", "cb", "--json", "ca", body)
	trace := regexp.MustCompile(`"trace_id":"([^"]+)"`).FindStringSubmatch(out)
	if trace == nil {
		t.Fatalf("fleet-send printed %s", out)
	}
	// the model's tool results: three replies sent, the fourth refused
	var cut time.Time
	deadline := time.Now().Add(3 * time.Minute)
	for cut.IsZero() {
		for _, q := range rig.stub.Turns() {
			if strings.Contains(q.ToolResult, "past max-hops 3: a loop, cut here") {
				cut = q.Time
			}
		}
		if time.Now().After(deadline) {
			for i, q := range rig.stub.Turns() {
				t.Logf("turn %d: answer %q, tool result %q", i, q.Answer, q.ToolResult)
			}
			t.Fatalf("no tool result said the loop was cut within 3m; ca's screen:\n%s\ncb's screen:\n%s", rig.screen(ca.pane), rig.screen(cb.pane))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// it stays stopped: both agents go idle, and the only turn after the
	// cut's is the other party's NOTICE of it (issue 37.2: both told),
	// which answers no one
	rig.waitStatus(ca.name, "idle", 30*time.Second)
	rig.waitStatus(cb.name, "idle", 30*time.Second)
	time.Sleep(3 * time.Second)
	calls, after, notices := 0, 0, 0
	for _, q := range rig.stub.Turns() {
		if strings.Contains(q.Answer, "fleet-send --reply-to ") {
			calls++
		}
		if q.Time.After(cut) {
			after++
			if strings.Contains(q.Prompt, "[fleet notice from ") && !strings.Contains(q.Answer, "fleet-send") {
				notices++
			}
		}
	}
	if calls != 4 || after > 1 || after != notices {
		for i, q := range rig.stub.Turns() {
			t.Logf("turn %d at %s: prompt %q, answer %q, tool result %q", i, q.Time.Format(time.StampMilli), q.Prompt, q.Answer, q.ToolResult)
		}
		t.Fatalf("%d reply tool calls (want 4: hops 1 to 3 sent, the 4th cut), %d turns after the cut (want at most the NOTICE's, %d)", calls, after, notices)
	}
	tr := rig.fleet("fleet-trace", "--as", "cb", trace[1])
	if !regexp.MustCompile(`"event":"loop_cut","size":\d+,"reason":"hop 4 past max-hops 3`).MatchString(tr) {
		t.Fatalf("fleet-trace does not show the cut:\n%s", tr)
	}
	notice := len(regexp.MustCompile(`"event":"injected"[^\n]*"kind":"NOTICE"|"kind":"NOTICE"[^\n]*"event":"injected"`).FindAllString(tr, -1))
	if n := strings.Count(tr, `"event":"injected"`) - notice; n != 4 {
		t.Errorf("fleet-trace shows %d messages pasted besides the NOTICE, want 4 (hops 0 to 3):\n%s", n, tr)
	}
}

// The real Claude Code started by a compound command, as `tmux
// new-session "claude; exec bash"` starts it (issue 40.3): claude runs in
// the process group of the pane's shell, so nothing can prove at paste
// time that claude, not the shell, reads what is typed. At its first hook
// the entity goes unhooked at once, with the reason and the fix; the
// message sent before its first prompt is held, never typed into the
// pane; hooks doctor names the reason.
func TestClaudeCodeCompoundStart(t *testing.T) {
	agentTest(t)
	claude := agentBin(t, "claude")
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := &claudeRun{r: rig, name: "compound", hooks: filepath.Join(rig.dir, "claude-hooks.jsonl")}
	claudeConfig(t, rig, c.hooks)
	pane, start := rig.gatedPane(c.name, claude+"; exec bash --norc --noprofile", claudeEnv(rig)...)
	c.pane = pane
	shell := rig.tmux("display", "-p", "-t", pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(rig, pane, shell) })
	rig.fleet("fleet-roster", "join", c.name, "--mode", "inject", "--tmux-target", pane)
	body := "sent before claude started, in a compound command"
	id := c.send(t, body)
	start()
	rig.waitScreen(pane, claudeReady, 30*time.Second)
	waitRow(t, rig, c.name, `"status":"unhooked","status_reason":"claude \(pid [0-9]+\) runs in the process group of the pane's shell (sh|bash) \(started by a compound command`, 30*time.Second)
	// the sentinel: the delivery loop saw the message and held it
	rig.waitLog(0, `"msg":"held: the agent is not idle".*"entity":"`+c.name+`","status":"(starting|unhooked)","msg_id":"`+id+`"`, 15*time.Second)
	if n := len(turnsWith(rig, body)); n != 0 {
		t.Fatalf("the model saw the message (%d turns): it was typed into a compound-started pane", n)
	}
	if strings.Contains(rig.screen(pane), body) {
		t.Fatalf("the message shows in the pane:\n%s", rig.screen(pane))
	}
	if st := rig.fleet("fleet-send", "--as", "alice", "--json", "--status", id); !strings.Contains(st, `"state":"accepted"`) {
		t.Fatalf("the held message: %s", st)
	}
	doc, _, _ := rig.fleetTry("fleet-roster", "hooks", "doctor", "claude", "--entity", c.name)
	if !strings.Contains(doc, "process group of the pane's shell") && !strings.Contains(doc, "compound command") {
		t.Errorf("hooks doctor does not name the reason:\n%s", doc)
	}
}

// An interrupt with the defaults (issue 40.4): Claude Code runs no hook
// on an Escape mid-turn, so its entity stayed busy, mail held, until
// stuck-after (10 minutes). Its screen says it instead: the interrupted
// fleet message back in its input keeps it busy with the reason (a paste
// would send it again) within seconds, and once the box is cleared its
// ready prompt, which shows only with an empty box, reads idle. No
// --idle-screen, no short stuck-after.
func TestClaudeCodeInterruptToIdle(t *testing.T) {
	agentTest(t)
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := startClaude(t, rig, "claude", "--paste", "bracketed")
	rig.waitStatus(c.name, "idle", 15*time.Second)
	body := "interrupt me STUB:SLOW=60"
	c.send(t, body)
	waitTurnsWith(t, rig, body, 1)
	rig.waitStatus(c.name, "busy", 10*time.Second)
	rig.waitScreen(c.pane, `esc to interrupt`, 10*time.Second)
	escaped := time.Now()
	rig.tmux("send-keys", "-t", c.pane, "Escape")
	waitRow(t, rig, c.name, `"status":"busy","status_reason":"an interrupted message is back in the agent's input: clear it there`, 10*time.Second)
	t.Logf("Escape to busy with the reason: %v", time.Since(escaped).Round(100*time.Millisecond))
	// held meanwhile: a message sent now is not pasted onto the old one
	next := "after the interrupt, a message of its own"
	id := c.send(t, next)
	// the person clears the box (Ctrl-U a line: the body's, then, joined
	// by a backspace, the header's)
	rig.tmux("send-keys", "-t", c.pane, "C-u")
	rig.tmux("send-keys", "-t", c.pane, "BSpace")
	rig.tmux("send-keys", "-t", c.pane, "C-u")
	cleared := time.Now()
	rig.waitScreen(c.pane, claudeReady, 10*time.Second)
	turns := waitTurnsWith(t, rig, next, 1)
	t.Logf("cleared to the next message's turn: %v; Escape to it: %v", time.Since(cleared).Round(100*time.Millisecond), time.Since(escaped).Round(100*time.Millisecond))
	if d := time.Since(cleared); d > 10*time.Second {
		t.Errorf("the next message came %v after the box was cleared", d)
	}
	if strings.Contains(turns[0].Prompt, "interrupt me") || strings.Count(turns[0].Prompt, next) != 1 {
		t.Errorf("the turn after the interrupt: %q", turns[0].Prompt)
	}
	c.waitState(t, id, "delivered")
	rig.waitLog(0, `"msg":"agent idle".*"entity":"claude","reason":"read from the screen: its turn ended with no hook \(an interrupt\), its input empty"`, 10*time.Second)
}
