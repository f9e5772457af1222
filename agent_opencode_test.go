package fleet_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
)

// The real OpenCode (1.18.33) in a tmux pane, offline against the stub
// model through an OpenAI-compatible provider (Chat Completions), as an
// inject entity whose busy and idle come from fleet's OpenCode plugin
// (scripts/hooks/opencode-plugin.js, installed by fleet-roster hooks
// install opencode). docs/agent-clis/opencode.md has what was found out.

// opencodeReady is OpenCode's footer on its home and session screens (at
// its prompt and mid-turn alike); opencodeWorking the turn's spinner line.
const (
	opencodeReady   = `ctrl\+p commands`
	opencodeWorking = `esc interrupt`
)

// opencodeEnv is the pane's environment for an OpenCode that reaches
// nothing but the stub: no models.dev catalogue, no update check, and no
// registry for the dependency it installs into each config folder at
// start (@opencode-ai/plugin: offline that install waited on the network
// for over a minute before the TUI came up; npm_config_offline makes it
// fail at once), every other HTTP request to a closed port.
func opencodeEnv() []string {
	dead := "http://127.0.0.1:9"
	return []string{"OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_SHARE=1",
		"npm_config_offline=true", "HTTP_PROXY=" + dead, "HTTPS_PROXY=" + dead, "http_proxy=" + dead, "https_proxy=" + dead,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}
}

// opencodeConfig writes ~/.config/opencode/opencode.json as a user would
// set OpenCode up for the stub: one OpenAI-compatible provider on the
// stub's URL, its one model the default (and the small model, for
// titles), tools allowed without asking (bash, edits, folders outside the
// project: the tests' markers are there), and a recorder plugin of the
// test's own beside fleet's, which fleet-roster hooks install writes.
func opencodeConfig(t *testing.T, r *agentRig, events string) {
	t.Helper()
	dir := filepath.Join(r.home, ".config", "opencode")
	cfg := map[string]any{
		"$schema":     "https://opencode.ai/config.json",
		"autoupdate":  false,
		"share":       "disabled",
		"model":       "stub/stub-model",
		"small_model": "stub/stub-model",
		"provider": map[string]any{"stub": map[string]any{
			"npm":     "@ai-sdk/openai-compatible",
			"name":    "Stub",
			"options": map[string]any{"baseURL": r.stub.URL() + "/v1", "apiKey": "stub-key"},
			"models":  map[string]any{"stub-model": map[string]any{"name": "Stub model", "tool_call": true}},
		}},
		"permission": map[string]any{"bash": "allow", "edit": "allow", "external_directory": "allow", "webfetch": "deny"},
	}
	writeJSONFile(t, filepath.Join(dir, "opencode.json"), cfg)
	rec := `import { appendFileSync } from "node:fs"
const log = (name, v) => appendFileSync(` + jsString(events) + `, JSON.stringify({ t: Date.now(), name, ...v }) + "\n")
export const Record = async () => ({
  event: async ({ event }) => {
    if (event.type === "session.status") log("session.status:" + event.properties.status.type, {})
    else if (event.type === "session.idle" || event.type === "session.error") log(event.type, {})
  },
  "tool.execute.before": async (i) => log("tool.execute.before", { tool: i.tool }),
  "tool.execute.after": async (i) => log("tool.execute.after", { tool: i.tool }),
  "chat.message": async () => log("chat.message", {}),
})
`
	if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "record.js"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	r.fleet("fleet-roster", "hooks", "install", "opencode")
	if st := r.fleet("fleet-roster", "hooks", "status", "opencode", "--json"); !strings.Contains(st, `"missing":[],"blockers":[]`) {
		t.Fatalf("fleet-roster hooks status opencode after install: %s", st)
	}
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// opencodeEvents are the names the recorder plugin logged so far.
func opencodeEvents(events string) []string {
	b, _ := os.ReadFile(events)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m["name"].(string))
		}
	}
	return out
}

// opencodeRun is one OpenCode started in a pane's interactive bash, as
// its user types it, joined as entity name.
type opencodeRun struct {
	r      *agentRig
	name   string
	pane   string
	token  string
	events string
}

// startOpenCode sets OpenCode up, starts an interactive bash in a pane,
// joins it as name (inject, bracketed paste), types opencode with the
// entity's credential, and waits for its TUI and the entity's idle.
func startOpenCode(t *testing.T, r *agentRig, name string) *opencodeRun {
	t.Helper()
	bin := agentBin(t, "opencode")
	c := &opencodeRun{r: r, name: name, events: filepath.Join(r.dir, "opencode-events.jsonl")}
	opencodeConfig(t, r, c.events)
	c.pane = r.pane(name, "bash --norc --noprofile -i", opencodeEnv()...)
	r.waitScreen(c.pane, claudeShell, 10*time.Second)
	shell := r.tmux("display", "-p", "-t", c.pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(r, c.pane, shell) })
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(c.events)
			t.Logf("screen:\n%s\nplugin events:\n%s", r.screen(c.pane), b)
		}
	})
	out := r.fleet("fleet-roster", "join", name, "--mode", "inject", "--tmux-target", c.pane, "--paste", "bracketed")
	c.token = strings.Fields(out)[0]
	start := time.Now()
	r.tmux("send-keys", "-t", c.pane, "-l", "FLEET_TOKEN="+c.token+" "+bin)
	r.tmux("send-keys", "-t", c.pane, "Enter")
	r.waitScreen(c.pane, opencodeReady, 60*time.Second)
	r.waitStatus(name, "idle", 30*time.Second)
	t.Logf("opencode ready after %v", time.Since(start).Round(10*time.Millisecond))
	return c
}

func TestOpenCode(t *testing.T) {
	agentTest(t)
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := startOpenCode(t, rig, "oc")
	if cmd := paneCommand(rig, c.pane); cmd != "opencode" {
		t.Errorf("the pane's command at OpenCode's prompt is %q, want opencode", cmd)
	}

	t.Run("message", func(t *testing.T) {
		r := rig.sub(t)
		// hooks doctor --watch sees the live loop through the plugin
		doctor := exec.Command(filepath.Join(binDir, "fleet-roster"), "hooks", "doctor", "opencode", "--entity", c.name, "--watch", "90s")
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
		if cmd := paneCommand(r, c.pane); cmd != "opencode" {
			t.Errorf("the pane's command mid-turn is %q, want opencode", cmd)
		}
		r.waitStatus(c.name, "idle", 30*time.Second)
		r.waitState(id, "delivered", 20*time.Second)
		turns := turnsWith(r, body)
		if len(turns) != 1 {
			t.Fatalf("the model saw %d turns with the message, want 1: %+v", len(turns), promptsOf(turns))
		}
		q := turns[0]
		if q.Vendor != "openai-chat" || q.Model != "stub-model" || q.Status != 200 {
			t.Errorf("the turn: vendor %q model %q status %d", q.Vendor, q.Model, q.Status)
		}
		if n := strings.Count(q.Prompt, body); n != 1 {
			t.Errorf("the prompt holds the body %d times, want 1: %q", n, q.Prompt)
		}
		if n := count(q.Texts, body); n != 1 {
			t.Errorf("the user texts hold the body %d times, want 1: %q", n, q.Texts)
		}
		if !strings.HasPrefix(q.Prompt, "[fleet send from alice@h1 · msg "+id) {
			t.Errorf("the prompt does not start with the gateway's header: %q", q.Prompt)
		}
		if got := len(r.stub.Turns()); got != 1 {
			t.Errorf("the model saw %d turns in all, want 1: %q", got, promptsOf(r.stub.Turns()))
		}
		if ev := opencodeEvents(c.events); !containsSeq(ev, "chat.message", "session.status:busy", "session.status:idle", "session.idle") {
			t.Errorf("plugin events %v, want chat.message, busy, idle, session.idle in order", ev)
		}
		if err := doctor.Wait(); err != nil || !strings.Contains(dout.String(), "loop: idle → busy → idle") {
			t.Errorf("hooks doctor opencode --watch: %v\n%s%s", err, dout.String(), derr.String())
		}
	})

	t.Run("tool", func(t *testing.T) {
		r := rig.sub(t)
		marker := filepath.Join(r.dir, "opencode-tool-marker")
		body := "please run STUB:TOOL=touch " + marker
		id := r.sendID(c.name, body)
		waitTurnsWith(t, r, body, 2)
		r.waitStatus(c.name, "idle", 30*time.Second)
		r.waitState(id, "delivered", 20*time.Second)
		turns := turnsWith(r, body)
		if len(turns) != 2 {
			t.Fatalf("the model saw %d requests for the tool turn, want 2 (the call, its result): %q", len(turns), promptsOf(turns))
		}
		if turns[0].ToolResult != "" || turns[0].Answer != "tool bash: touch "+marker {
			t.Errorf("the first request: tool result %q, answer %q", turns[0].ToolResult, turns[0].Answer)
		}
		if turns[1].ToolResult == "" {
			t.Errorf("the second request carries no tool result: %+v", turns[1])
		}
		if _, err := os.Stat(marker); err != nil {
			t.Errorf("the bash tool did not run: %v", err)
		}
		if ev := opencodeEvents(c.events); !containsSeq(ev, "chat.message", "tool.execute.before", "tool.execute.after", "session.idle") {
			t.Errorf("plugin events %v, want chat.message, tool.execute.before/after, session.idle", ev)
		}
	})

	t.Run("back-to-back", func(t *testing.T) { backToBack(t, rig.sub(t), c.name) })

	// a message sent while a slow turn runs waits for its end: OpenCode
	// would queue a prompt submitted mid-turn and run it right after, in
	// the same busy stretch (no idle between), so the second turn's
	// request coming after the first's answer is not enough: checkTwoTurns
	// also wants it after the slow answer's time
	t.Run("during-slow-turn", func(t *testing.T) {
		r := rig.sub(t)
		bodyA, bodyB := "a slow one STUB:SLOW=6", "sent while the slow one runs"
		idA := r.sendID(c.name, bodyA)
		a := r.turnWith(bodyA, 60*time.Second)
		r.waitScreen(c.pane, opencodeWorking, 10*time.Second)
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

	// an API error OpenCode does not retry (400): one request, the error
	// on screen, session.error and idle at once; the next message is a
	// turn of its own
	t.Run("api-error", func(t *testing.T) {
		r := rig.sub(t)
		bodyErr := "this one fails STUB:ERROR=400"
		idErr := r.sendID(c.name, bodyErr)
		r.turnWith(bodyErr, 60*time.Second)
		r.waitState(idErr, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
		r.waitScreen(c.pane, `stub error 400`, 10*time.Second)
		body := "after the error"
		id := r.sendID(c.name, body)
		turn := r.turnWith(body, 60*time.Second)
		if strings.Count(turn.Prompt, body) != 1 || strings.Contains(turn.Prompt, "STUB:ERROR") || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the turn after the error has the prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
		if n := len(turnsWith(r, bodyErr)); n != 1 {
			t.Errorf("the failing message was sent %d times, want 1", n)
		}
		if ev := opencodeEvents(c.events); !containsSeq(ev, "session.error") {
			t.Errorf("no session.error among the plugin events %v", ev)
		}
	})

	// Escape mid-turn (twice: the first only arms it, "esc again to
	// interrupt"): the turn ends, session.status idle comes, the entity is
	// idle; the next message is a turn of its own
	t.Run("interrupt", func(t *testing.T) {
		r := rig.sub(t)
		r.sendID(c.name, "STUB:SLOW=60 a long one")
		r.turnWith("a long one", 60*time.Second)
		r.waitStatus(c.name, "busy", 10*time.Second)
		r.waitScreen(c.pane, opencodeWorking, 10*time.Second)
		start := time.Now()
		r.tmux("send-keys", "-t", c.pane, "Escape")
		r.waitScreen(c.pane, `esc again to interrupt`, 10*time.Second)
		r.tmux("send-keys", "-t", c.pane, "Escape")
		r.waitStatus(c.name, "idle", 10*time.Second)
		t.Logf("Escape to idle: %v", time.Since(start).Round(10*time.Millisecond))
		body := "after the escape, a new one"
		id := r.sendID(c.name, body)
		turn := r.turnWith(body, 60*time.Second)
		if strings.Count(turn.Prompt, body) != 1 || strings.Contains(turn.Prompt, "a long one") || !strings.Contains(turn.Prompt, "· msg "+id) {
			t.Errorf("the turn after the escape has the prompt %q", turn.Prompt)
		}
		r.waitState(id, "delivered", 20*time.Second)
		r.waitStatus(c.name, "idle", 20*time.Second)
	})

	// /exit: the pane is back at bash; a message is never typed into it,
	// it is held, the entity detached
	t.Run("exit", func(t *testing.T) {
		r := rig.sub(t)
		r.tmux("send-keys", "-t", c.pane, "-l", "/exit")
		r.waitScreen(c.pane, `/exit`, 10*time.Second)
		time.Sleep(300 * time.Millisecond) // the command menu
		r.tmux("send-keys", "-t", c.pane, "Enter")
		r.waitScreen(c.pane, claudeShell, 20*time.Second)
		if cmd := paneCommand(r, c.pane); cmd != "bash" {
			t.Errorf("the pane's command after OpenCode exits is %q, want bash", cmd)
		}
		marker := filepath.Join(r.dir, "PWNED")
		id := r.sendID(c.name, "status please; touch "+marker)
		waitRow(t, r, c.name, `"status":"detached","status_reason":"pane %[0-9]+ runs bash, not opencode"`, 15*time.Second)
		r.waitLog(0, `"msg":"held: the agent is not idle".*"entity":"`+c.name+`","status":"detached","msg_id":"`+id+`"`, 15*time.Second)
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("the body ran as a shell command in the pane OpenCode left")
		}
		if st := r.msgState(id); st != "accepted" {
			t.Fatalf("the held message reads %s, want accepted", st)
		}
		if strings.Contains(r.screen(c.pane), "status please") {
			t.Fatalf("the message was typed into the shell:\n%s", r.screen(c.pane))
		}
		for _, q := range r.stub.Requests() {
			if q.Vendor != "openai-chat" {
				t.Errorf("OpenCode asked the stub for something it does not serve: %s %s", q.Method, q.Path)
			}
		}
	})
}

// The agent answers through its own tool call across hosts: boss on h2
// holds fleet-send --wait open; the message is pasted into OpenCode on
// h1, whose bash tool runs fleet-send --reply-to ID with the entity's
// credential, and the reply reaches boss's send on h2.
func TestOpenCodeReplyAcrossHosts(t *testing.T) {
	agentBrokerTest(t)
	agentBin(t, "opencode")
	rig, h2 := twoHostRig(t, "t-go-opencode-reply")
	bossTok := h2.join("boss")
	c := startOpenCode(t, rig, "oc")
	replyAcrossHosts(t, rig, h2, bossTok, "oc@h1", c.pane, "opencode")
}

// Hook delivery mode with the real OpenCode: the entity is joined --mode
// hook, OpenCode runs in a tmux pane with its FLEET_TOKEN, and fleet's
// plugin runs fleet-recv --hook opencode at a turn's start (chat.message:
// the frames appended to the prompt's text) and after each tool call
// (tool.execute.after: appended to the tool's result, which the model
// reads in the turn's next request). OpenCode's plugin API has no hook
// that goes on with a turn at its end, and nothing runs while it idles:
// mail sent then waits for the next turn.
func TestOpenCodeHookMode(t *testing.T) {
	agentTest(t)
	bin := agentBin(t, "opencode")
	rig := newAgentRig(t)
	events := filepath.Join(rig.dir, "opencode-events.jsonl")
	opencodeConfig(t, rig, events)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	token := strings.Fields(rig.fleet("fleet-roster", "join", "oc", "--mode", "hook"))[0]
	pane := rig.pane("oc", "exec "+bin, append(opencodeEnv(), "FLEET_TOKEN="+token)...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(events)
			t.Logf("screen:\n%s\nplugin events:\n%s", rig.screen(pane), b)
		}
	})
	rig.waitScreen(pane, opencodeReady, 60*time.Second)
	count := func(name string) int {
		n := 0
		for _, e := range opencodeEvents(events) {
			if e == name {
				n++
			}
		}
		return n
	}
	waitEvent := func(t *testing.T, name string, n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for count(name) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s came %d time(s), want %d; events %v", name, count(name), n, opencodeEvents(events))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// idle: as many session.idle as turns begun, no spinner, two looks
	idle := func(r *agentRig) {
		r.t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for still := 0; still < 2; {
			s := r.screen(pane)
			if count("session.idle") >= count("chat.message") && !strings.Contains(s, "esc interrupt") && strings.Contains(s, "ctrl+p commands") {
				still++
			} else {
				still = 0
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("OpenCode never went idle:\n%s", s)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	// prompt types a prompt as OpenCode's user would: the Enter once the
	// text shows
	prompt := func(r *agentRig, text string) {
		r.t.Helper()
		idle(r)
		starts := count("chat.message")
		r.tmux("send-keys", "-t", pane, "-l", text)
		r.waitScreen(pane, regexp.QuoteMeta(text), 10*time.Second)
		time.Sleep(300 * time.Millisecond)
		r.tmux("send-keys", "-t", pane, "Enter")
		waitEvent(r.t, "chat.message", starts+1)
	}
	header := func(id string) string { return "[fleet message from alice@h1 · msg " + id + " · send]" }
	frame := func(id, body string) string {
		return header(id) + "\n│ " + strings.ReplaceAll(body, "\n", "\n│ ") + "\n[end of fleet message " + id +
			" · reply: fleet-send --reply-to " + id + " TEXT]"
	}
	withText := func(r *agentRig, s string) []stubmodel.Request {
		var out []stubmodel.Request
		for _, q := range r.stub.Turns() {
			if strings.Contains(q.Body, jsonText(s)) {
				out = append(out, q)
			}
		}
		return out
	}
	waitText := func(r *agentRig, s string, n int) []stubmodel.Request {
		r.t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for len(withText(r, s)) < n {
			if time.Now().After(deadline) {
				r.t.Fatalf("%d turn request(s) hold %q, want %d; turns: %q", len(withText(r, s)), s, n, promptsOf(r.stub.Turns()))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return withText(r, s)
	}

	// (a) nothing takes mail while OpenCode idles: pending, in no
	// request; the next turn's chat.message hands it over, once, after
	// the prompt's own text
	t.Run("pending-until-turn-start", func(t *testing.T) {
		r := rig.sub(t)
		idle(r)
		body := "sent while the agent is idle"
		id := r.sendID("oc", body)
		stillPending(t, r, id)
		p := "a turn of its own"
		prompt(r, p)
		q := waitText(r, p, 1)[0]
		takenBy(t, r, id, p)
		if n := strings.Count(q.Body, jsonText(frame(id, body))); n != 1 {
			t.Errorf("the turn's first request holds the exact frame %d times, want 1:%s", n, around(q.Body, jsonText(header(id))))
		}
		if i, j := strings.Index(q.Body, jsonText(p)), strings.Index(q.Body, jsonText(header(id))); i < 0 || j < i {
			t.Errorf("the frame does not follow the prompt:%s", around(q.Body, jsonText(header(id))))
		}
		t.Logf("the turn's request, where the frame stands:%s", around(q.Body, jsonText(header(id))))
		r.waitState(id, "delivered", 30*time.Second)
		idle(r)
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (b) mid-turn: sent while a slow tool call runs, it is in the request
	// right after the call, inside the tool's result, exactly once, and
	// delivered only once the tool ended
	t.Run("mid-turn", func(t *testing.T) {
		r := rig.sub(t)
		p := "run a slow tool STUB:TOOL=sleep 5"
		after := count("tool.execute.after")
		prompt(r, p)
		waitEvent(t, "tool.execute.before", count("tool.execute.before")+1)
		body := "mid-turn mail, line one\nline two"
		id := r.sendID("oc", body)
		if st := r.msgState(id); count("tool.execute.after") == after && st != "accepted" {
			t.Errorf("before the tool ended the message reads %s, want accepted", st)
		}
		waitEvent(t, "tool.execute.after", after+1)
		r.waitState(id, "delivered", 30*time.Second)
		idle(r)
		turns := waitText(r, p, 2)
		if len(turns) != 2 || turns[1].ToolResult == "" {
			for i, q := range turns {
				t.Logf("request %d: answer %q tool result %q prompt %q", i, q.Answer, q.ToolResult, q.Prompt)
			}
			t.Fatalf("the tool turn: %d requests, want 2 (the call, its result)", len(turns))
		}
		if strings.Contains(turns[0].Body, id) {
			t.Errorf("the request before the tool call holds the message")
		}
		t.Logf("the tool's result as the model got it: %q", turns[1].ToolResult)
		if !strings.Contains(turns[1].ToolResult, frame(id, body)) {
			t.Errorf("the frame is not inside the tool's result: %q", turns[1].ToolResult)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	if s := rig.screen(pane); strings.Contains(s, "fleet-recv:") || strings.Contains(s, "fleet-turn:") {
		t.Errorf("the plugin showed something on screen:\n%s", s)
	}
}

// fleet-mcp in OpenCode, as hooks install opencode --mcp main writes it
// (opencode.json's mcp.fleet, a local server), loaded by the real
// OpenCode run headless (opencode run PROMPT): the model is offered
// fleet's tools as fleet_TOOL, a send reaches bob, a receive hands the
// model main's mail.
func TestMCPOpenCode(t *testing.T) {
	agentTest(t)
	bin := agentBin(t, "opencode")
	r := newAgentRig(t)
	opencodeConfig(t, r, filepath.Join(r.dir, "opencode-events.jsonl"))
	mcpInstall(t, r, "opencode", nil)
	run := func(prompt string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// the prompt on stdin: as an argument, opencode run 1.18.33
		// sends a message with quotes in it JSON-quoted ("say {\"a\"...}"
		// with its quotes and backslashes); and PWD set, which OpenCode
		// takes for its folder over the process's own
		cmd := exec.CommandContext(ctx, bin, "run")
		cmd.Stdin = strings.NewReader(prompt)
		cmd.Dir = r.work
		cmd.Env = r.env(append(opencodeEnv(), "PWD="+r.work)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("opencode run: %v\n%s", err, out)
		}
	}
	mcpSendReceive(t, r, run, "", "fleet_")
}
