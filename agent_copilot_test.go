package fleet_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The real GitHub Copilot CLI (1.0.102) in a tmux pane, offline against
// the stub model through its bring-your-own-key provider (Anthropic
// Messages), as an inject entity whose busy and idle come from fleet's
// hook file (scripts/hooks/copilot-hooks.json, installed by fleet-roster
// hooks install copilot as ~/.copilot/hooks/fleet.json).
// docs/agent-clis/copilot.md has what was found out.

// copilotReady is Copilot's prompt hint line; copilotWorking its turn's
// spinner line.
const (
	copilotReady   = `/ commands · \? help`
	copilotWorking = `Working esc`
)

// copilotEnv is the pane's environment for a Copilot that reaches nothing
// but the stub: offline (no GitHub login, no update check, no telemetry),
// the stub as its Anthropic provider, its one model, every other HTTP
// request to a closed port; the package it unpacks at its first start
// (235 MB) kept in one cache for all the tests.
func copilotEnv(r *agentRig) []string {
	dead := "http://127.0.0.1:9"
	cache := filepath.Join(filepath.Dir(npmBin), "..", "copilot-pkg")
	return []string{"COPILOT_OFFLINE=true", "COPILOT_PROVIDER_TYPE=anthropic", "COPILOT_PROVIDER_BASE_URL=" + r.stub.URL(),
		"COPILOT_PROVIDER_API_KEY=stub-key", "COPILOT_MODEL=stub-model", "COPILOT_AUTO_UPDATE=false",
		"COPILOT_PKG_CACHE_HOME=" + cache,
		"HTTP_PROXY=" + dead, "HTTPS_PROXY=" + dead, "http_proxy=" + dead, "https_proxy=" + dead,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}
}

// copilotConfig writes ~/.copilot/config.json as a user who trusted the
// project folder at Copilot's first start would have it, a recorder hook
// file of the test's own beside fleet's (each event's name and input, one
// JSON line each), and fleet's, by fleet-roster hooks install copilot.
func copilotConfig(t *testing.T, r *agentRig, events string) {
	t.Helper()
	dir := filepath.Join(r.home, ".copilot")
	writeJSONFile(t, filepath.Join(dir, "config.json"), map[string]any{"trustedFolders": []string{r.work}, "banner": "never"})
	rec := map[string]any{}
	for _, ev := range []string{"sessionStart", "userPromptSubmitted", "preToolUse", "postToolUse", "agentStop", "sessionEnd", "errorOccurred"} {
		rec[ev] = []any{map[string]any{"type": "command", "timeoutSec": 10,
			"bash": `{ printf '{"name":"` + ev + `","input":'; tr -d '\n'; printf '}\n'; } >> ` + events}}
	}
	writeJSONFile(t, filepath.Join(dir, "hooks", "record.json"), map[string]any{"version": 1, "hooks": rec})
	r.fleet("fleet-roster", "hooks", "install", "copilot")
	if st := r.fleet("fleet-roster", "hooks", "status", "copilot", "--json"); !strings.Contains(st, `"missing":[],"blockers":[]`) {
		t.Fatalf("fleet-roster hooks status copilot after install: %s", st)
	}
}

// copilotEvents are the recorder's lines so far.
func copilotEvents(events string) []map[string]any {
	b, _ := os.ReadFile(events)
	var out []map[string]any
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// copilotNames are the names of the recorded events.
func copilotNames(events string) []string {
	var out []string
	for _, m := range copilotEvents(events) {
		out = append(out, m["name"].(string))
	}
	return out
}

// screenWithin says whether pane's screen matches re within d.
func screenWithin(r *agentRig, pane, re string, d time.Duration) bool {
	rx := regexp.MustCompile(re)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if rx.MatchString(r.screen(pane)) {
			return true
		}
	}
	return false
}

// lastFrame is the last fleet message of a prompt: Copilot sends a
// prompt whose turn failed or was interrupted again with the next one, in
// one user message.
func lastFrame(prompt string) string {
	if i := strings.LastIndex(prompt, "[fleet send from "); i >= 0 {
		return prompt[i:]
	}
	return prompt
}

// copilotRun is one Copilot started in a pane's interactive bash, as its
// user types it, joined as entity name.
type copilotRun struct {
	r      *agentRig
	name   string
	pane   string
	token  string
	events string
}

// copilotLine is Copilot as the tests start it: every tool allowed
// without asking (the tests' markers are outside the project folder).
const copilotLine = "copilot --allow-all-tools"

// startCopilot sets Copilot up, starts an interactive bash in a pane,
// joins it as name (inject, bracketed paste), types copilot with the
// entity's credential, and waits for its prompt and the entity's idle:
// no hook runs before the first prompt, so the entity is recognised from
// its process in the pane (a late-hook CLI) and idle read from its
// screen.
func startCopilot(t *testing.T, r *agentRig, name string) *copilotRun {
	t.Helper()
	agentBin(t, "copilot")
	c := &copilotRun{r: r, name: name, events: filepath.Join(r.dir, "copilot-events.jsonl")}
	copilotConfig(t, r, c.events)
	c.pane = r.pane(name, "bash --norc --noprofile -i", append(copilotEnv(r), "PATH="+npmBin+":"+os.Getenv("PATH"))...)
	r.waitScreen(c.pane, claudeShell, 10*time.Second)
	shell := r.tmux("display", "-p", "-t", c.pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(r, c.pane, shell) })
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(c.events)
			t.Logf("screen:\n%s\nhook events:\n%s", r.screen(c.pane), b)
		}
	})
	out := r.fleet("fleet-roster", "join", name, "--mode", "inject", "--tmux-target", c.pane, "--paste", "bracketed")
	c.token = strings.Fields(out)[0]
	start := time.Now()
	r.tmux("send-keys", "-t", c.pane, "-l", "FLEET_TOKEN="+c.token+" "+copilotLine)
	r.tmux("send-keys", "-t", c.pane, "Enter")
	r.waitScreen(c.pane, copilotReady, 60*time.Second)
	r.waitStatus(name, "idle", 30*time.Second)
	t.Logf("copilot ready after %v", time.Since(start).Round(10*time.Millisecond))
	return c
}

func TestCopilot(t *testing.T) {
	agentTest(t)
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := startCopilot(t, rig, "cp")
	program := paneCommand(rig, c.pane)
	t.Logf("the pane's command at Copilot's prompt: %q", program)
	if program == "bash" {
		t.Fatalf("the pane's command at Copilot's prompt is bash")
	}
	rig.waitLog(0, `"msg":"agent recognised from its process: its first hook comes late".*"entity":"cp","cli":"copilot"`, 10*time.Second)

	t.Run("message", func(t *testing.T) {
		r := rig.sub(t)
		doctor := exec.Command(filepath.Join(binDir, "fleet-roster"), "hooks", "doctor", "copilot", "--entity", c.name, "--watch", "90s")
		doctor.Env = r.env()
		var dout, derr strings.Builder
		doctor.Stdout, doctor.Stderr = &dout, &derr
		if err := doctor.Start(); err != nil {
			t.Fatal(err)
		}
		body := "hello from alice, message one STUB:SLOW=2"
		id := r.sendID(c.name, body)
		r.turnWith(body, 60*time.Second)
		r.waitStatus(c.name, "busy", 10*time.Second)
		r.waitStatus(c.name, "idle", 30*time.Second)
		r.waitState(id, "delivered", 20*time.Second)
		turns := turnsWith(r, body)
		if len(turns) != 1 {
			t.Fatalf("the model saw %d turns with the message, want 1: %+v", len(turns), promptsOf(turns))
		}
		q := turns[0]
		if q.Vendor != "anthropic" || q.Model != "stub-model" || q.Status != 200 {
			t.Errorf("the turn: vendor %q model %q status %d", q.Vendor, q.Model, q.Status)
		}
		if n := strings.Count(q.Prompt, body); n != 1 {
			t.Errorf("the prompt holds the body %d times, want 1: %q", n, q.Prompt)
		}
		// Copilot puts the time before the user's text
		if _, p, _ := strings.Cut(q.Prompt, "</current_datetime>\n\n"); !strings.HasPrefix(p, "[fleet send from alice@h1 · msg "+id) {
			t.Errorf("the prompt does not start with the gateway's header: %q", q.Prompt)
		}
		if got := len(r.stub.Turns()); got != 1 {
			t.Errorf("the model saw %d turns in all, want 1: %q", got, promptsOf(r.stub.Turns()))
		}
		if ev := copilotNames(c.events); !containsSeq(ev, "sessionStart", "userPromptSubmitted", "agentStop") {
			t.Errorf("hook events %v, want sessionStart, userPromptSubmitted, agentStop in order", ev)
		}
		if err := doctor.Wait(); err != nil || !strings.Contains(dout.String(), "loop: idle → busy → idle") {
			t.Errorf("hooks doctor copilot --watch: %v\n%s%s", err, dout.String(), derr.String())
		}
	})

	t.Run("tool", func(t *testing.T) {
		r := rig.sub(t)
		marker := filepath.Join(r.dir, "copilot-tool-marker")
		body := "please run STUB:TOOL=touch " + marker
		id := r.sendID(c.name, body)
		waitTurnsWith(t, r, body, 2)
		r.waitStatus(c.name, "idle", 30*time.Second)
		r.waitState(id, "delivered", 20*time.Second)
		turns := turnsWith(r, body)
		if len(turns) != 2 {
			t.Fatalf("the model saw %d requests for the tool turn, want 2 (the call, its result): %q", len(turns), promptsOf(turns))
		}
		if turns[0].ToolResult != "" || !strings.Contains(turns[0].Answer, "touch "+marker) {
			t.Errorf("the first request: tool result %q, answer %q", turns[0].ToolResult, turns[0].Answer)
		}
		if turns[1].ToolResult == "" {
			t.Errorf("the second request carries no tool result: %+v", turns[1])
		} else {
			t.Logf("the tool's result: %q", turns[1].ToolResult)
		}
		if _, err := os.Stat(marker); err != nil {
			t.Errorf("the bash tool did not run: %v", err)
		}
		if ev := copilotNames(c.events); !containsSeq(ev, "userPromptSubmitted", "preToolUse", "postToolUse", "agentStop") {
			t.Errorf("hook events %v, want userPromptSubmitted, preToolUse, postToolUse, agentStop", ev)
		}
		// the recipe's hook-mode hooks ran in an inject entity's agent:
		// they took nothing (the gateway refuses them), said why on
		// stderr, and Copilot showed none of it
		if s := r.screen(c.pane); strings.Contains(s, "fleet-recv") || strings.Contains(s, "fleet-turn") {
			t.Errorf("the hooks showed something on screen:\n%s", s)
		}
	})

	t.Run("back-to-back", func(t *testing.T) { backToBack(t, rig.sub(t), c.name) })

	t.Run("during-slow-turn", func(t *testing.T) {
		r := rig.sub(t)
		bodyA, bodyB := "a slow one STUB:SLOW=6", "sent while the slow one runs"
		idA := r.sendID(c.name, bodyA)
		a := r.turnWith(bodyA, 60*time.Second)
		r.waitScreen(c.pane, copilotWorking, 10*time.Second)
		mark := r.logMark()
		idB := r.sendID(c.name, bodyB)
		r.waitLog(mark, `"msg":"held: the agent is not idle".*"msg_id":"`+idB+`"`, 10*time.Second)
		b := r.turnWith(bodyB, 60*time.Second)
		checkTwoTurns(t, r.stub.Requests(), a, b, bodyA, idA, bodyB, idB, 6*time.Second)
		r.waitState(idB, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
	})

	t.Run("multi-line", func(t *testing.T) {
		r := rig.sub(t)
		body := "line one\nline two\nline three"
		id := r.sendID(c.name, body)
		turn := r.turnWith("line one", 60*time.Second)
		if !strings.Contains(turn.Prompt, body) || count(turn.Texts, "line one") != 1 || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the prompt is not the three lines once: %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
		for _, u := range r.stub.Turns() {
			if strings.Contains(u.Prompt, "line t") && !strings.Contains(u.Prompt, "line one") {
				t.Errorf("a turn with a part of the lines: %q", u.Prompt)
			}
		}
	})

	// an API error Copilot does not retry (400): one request; Copilot
	// runs errorOccurred (recoverable: true, even for a 400) and no
	// agentStop, so no hook ends the turn: the gateway reads its end from
	// the screen (its ready footer back, the input empty). The next
	// message is a turn of its own; Copilot keeps the failed prompt in
	// its history, so the model sees it before the new one
	t.Run("api-error", func(t *testing.T) {
		r := rig.sub(t)
		bodyErr := "this one fails STUB:ERROR=400"
		idErr := r.sendID(c.name, bodyErr)
		r.turnWith(bodyErr, 60*time.Second)
		r.waitState(idErr, "delivered", 20*time.Second)
		start := time.Now()
		r.waitStatus(c.name, "idle", 20*time.Second)
		t.Logf("the error to idle: %v", time.Since(start).Round(10*time.Millisecond))
		r.waitLog(0, `"msg":"agent idle".*"entity":"cp","reason":"read from the screen: its turn ended with no hook`, 10*time.Second)
		body := "after the error"
		id := r.sendID(c.name, body)
		turn := r.turnWith(body, 60*time.Second)
		if last := lastFrame(turn.Prompt); strings.Count(last, body) != 1 || strings.Contains(last, "STUB:ERROR") || !strings.Contains(last, "· msg "+id) {
			t.Errorf("the turn after the error has the prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
		n := 0
		for _, q := range r.stub.Requests() {
			if q.Status == 400 {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the failing request was sent %d times, want 1", n)
		}
		var recoverable []any
		for _, e := range copilotEvents(c.events) {
			if e["name"] == "errorOccurred" {
				recoverable = append(recoverable, e["input"].(map[string]any)["recoverable"])
			}
		}
		t.Logf("errorOccurred's recoverable: %v", recoverable)
		if len(recoverable) == 0 {
			t.Errorf("no errorOccurred among the hook events %v", copilotNames(c.events))
		}
	})

	// Ctrl-C mid-turn: the turn ends; the screen says so (the ready
	// footer back, the input empty) if no hook does, and the entity reads
	// idle
	t.Run("interrupt", func(t *testing.T) {
		r := rig.sub(t)
		before := len(copilotNames(c.events))
		r.sendID(c.name, "STUB:SLOW=60 a long one")
		r.turnWith("a long one", 60*time.Second)
		r.waitStatus(c.name, "busy", 10*time.Second)
		r.waitScreen(c.pane, copilotWorking, 10*time.Second)
		start := time.Now()
		// Copilot's footer says "Esc to cancel", but in tmux an Escape
		// (or CSI 27 u) left a turn waiting on the model running, five
		// times out of five; Ctrl-C cancels it
		r.tmux("send-keys", "-t", c.pane, "C-c")
		r.waitScreen(c.pane, copilotReady, 10*time.Second)
		t.Logf("the screen after Ctrl-C:\n%s", r.screen(c.pane))
		r.waitStatus(c.name, "idle", 15*time.Second)
		if ev := copilotNames(c.events)[before:]; slices.Contains(ev, "agentStop") {
			t.Logf("agentStop came after Ctrl-C: %v", ev)
		}
		t.Logf("Ctrl-C to idle: %v; hooks since the turn began: %v", time.Since(start).Round(10*time.Millisecond), copilotNames(c.events)[before:])
		body := "after the escape, a new one"
		id := r.sendID(c.name, body)
		turn := r.turnWith(body, 60*time.Second)
		if last := lastFrame(turn.Prompt); strings.Count(last, body) != 1 || strings.Contains(last, "a long one") || !strings.Contains(last, "· msg "+id) {
			t.Errorf("the turn after the interrupt has the prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
	})

	t.Run("exit", func(t *testing.T) {
		exitedGetsNothing(t, rig.sub(t), c.pane, c.name, `/quit`)
		for _, q := range rig.stub.Requests() {
			if q.Vendor != "anthropic" {
				t.Errorf("Copilot asked the stub for something it does not serve: %s %s", q.Method, q.Path)
			}
		}
	})
}
