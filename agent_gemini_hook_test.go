package fleet_test

import (
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

// Hook delivery mode with the real Gemini CLI (0.61): the entity is joined
// --mode hook, Gemini runs in a tmux pane with the entity's FLEET_TOKEN,
// and the shipped recipe (fleet-roster hooks install gemini) runs
// fleet-recv --hook gemini at a turn's start (BeforeAgent: JSON
// additionalContext, a <hook_context> part after the prompt), after a
// tool call (AfterTool: appended inside the tool's result) and at a
// turn's end (AfterAgent: deny, whose reason Gemini sends as the next
// user prompt). What the model received is read from the stub's record
// of each request as sent. Waking an idle Gemini is not a hook's (Gemini
// has no async hooks): mail to an idle agent waits for its next turn.
func TestGeminiHookMode(t *testing.T) {
	agentTest(t)
	gemini := agentBin(t, "gemini")
	rig := newAgentRig(t)
	events := filepath.Join(rig.dir, "events.jsonl")
	geminiSettings(t, rig, events)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	token := strings.Fields(rig.fleet("fleet-roster", "join", "gem", "--mode", "hook"))[0]
	env := append(rig.env(), "GEMINI_API_KEY=stub-key", "GOOGLE_GEMINI_BASE_URL="+rig.stub.URL(), "FLEET_TOKEN="+token)
	pane := rig.pane("gem", "exec "+gemini+" --yolo", env...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(events)
			t.Logf("screen:\n%s\nhook events:\n%s", rig.screen(pane), b)
		}
	})
	count := func(name string) int {
		n := 0
		for _, e := range geminiEvents(t, events) {
			if e["hook_event_name"] == name {
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
				t.Fatalf("hook %s ran %d time(s), want %d", name, count(name), n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitEvent(t, "SessionStart", 1)
	rig.waitScreen(pane, geminiIdleRE, 60*time.Second)

	// idle waits until Gemini is at its prompt with no turn running: as
	// many turn ends as turn starts (the recorder logs a hook as it
	// starts), no spinner, no hook running ("Executing Hook" in the status
	// line: an AfterAgent's fleet-recv may still take mail and go on), two
	// looks in a row
	working := regexp.MustCompile(geminiWorkingRE + `|Executing Hook`)
	atPrompt := regexp.MustCompile(geminiIdleRE)
	idle := func(r *agentRig) {
		r.t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for still := 0; still < 2; {
			s := r.screen(pane)
			if count("AfterAgent") >= count("BeforeAgent") && !working.MatchString(s) && atPrompt.MatchString(s) {
				still++
			} else {
				still = 0
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("Gemini never went idle:\n%s", s)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// prompt types a prompt, as Gemini's user would: its Enter once the
	// text shows, and a pause (an Enter within 30 ms of typed keys is a
	// newline to Gemini, docs/agent-clis/gemini.md)
	prompt := func(r *agentRig, text string) {
		r.t.Helper()
		idle(r)
		starts := count("BeforeAgent")
		r.tmux("send-keys", "-t", pane, "-l", text)
		r.waitScreen(pane, regexp.QuoteMeta(text), 10*time.Second)
		time.Sleep(500 * time.Millisecond)
		r.tmux("send-keys", "-t", pane, "Enter")
		waitEvent(r.t, "BeforeAgent", starts+1)
	}
	header := func(id string) string { return "[fleet message from alice@h1 · msg " + id + " · send]" }
	frame := func(id, body string) string {
		return header(id) + "\n│ " + strings.ReplaceAll(body, "\n", "\n│ ") + "\n[end of fleet message " + id +
			" · reply: fleet-send --reply-to " + id + " TEXT]"
	}
	// (a) nothing runs fleet-recv while Gemini idles (it has no async
	// hook): a message sent now stays pending, in no request; the next
	// turn's start (BeforeAgent) hands it over, once
	t.Run("pending-until-turn-start", func(t *testing.T) {
		r := rig.sub(t)
		idle(r)
		body := "sent while the agent is idle"
		id := r.sendID("gem", body)
		stillPending(t, r, id)
		p := "a turn of its own"
		prompt(r, p)
		q := waitText(t, r, p, 1)[0]
		takenBy(t, r, id, p)
		if n := strings.Count(q.Body, jsonText(frame(id, body))); n != 1 {
			t.Errorf("the turn's first request holds the exact frame %d times, want 1:%s", n, around(q.Body, jsonText(header(id))))
		}
		// after the prompt, as the hook's context part
		if i, j := strings.Index(q.Body, jsonText(p)), strings.Index(q.Body, jsonText(header(id))); i < 0 || j < i {
			t.Errorf("the frame does not follow the prompt:%s", around(q.Body, jsonText(header(id))))
		}
		t.Logf("the turn's request, where the frame stands:%s", around(q.Body, jsonText(header(id))))
		r.waitState(id, "delivered", 30*time.Second)
		idle(r)
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (b) mid-turn: sent while a slow tool call runs, it is in the request
	// right after the call (inside the tool's result), exactly once, and
	// delivered only once the AfterTool hook ran
	t.Run("mid-turn", func(t *testing.T) {
		r := rig.sub(t)
		p := "run a slow tool STUB:TOOL=sleep 5"
		tools := count("AfterTool")
		prompt(r, p)
		waitEvent(t, "BeforeTool", count("BeforeTool")+1)
		body := "mid-turn mail, line one\nline two"
		id := r.sendID("gem", body)
		if st := r.msgState(id); count("AfterTool") == tools && st != "accepted" {
			t.Errorf("before the AfterTool hook the message reads %s, want accepted", st)
		}
		waitEvent(t, "AfterTool", tools+1)
		r.waitState(id, "delivered", 30*time.Second)
		idle(r)
		turns := waitText(t, r, p, 2)
		if len(turns) != 2 || turns[1].ToolResult == "" {
			for i, q := range turns {
				t.Logf("request %d: answer %q tool result %q prompt %q", i, q.Answer, q.ToolResult, q.Prompt)
			}
			t.Fatalf("the tool turn: %d requests, want 2 (the call, its result)", len(turns))
		}
		if strings.Contains(turns[0].Body, id) {
			t.Errorf("the request before the tool call holds the message")
		}
		if n := strings.Count(turns[1].Body, jsonText(frame(id, body))); n != 1 {
			t.Errorf("the request after the tool call holds the exact frame %d times, want 1:%s", n, around(turns[1].Body, jsonText(header(id))))
		}
		t.Logf("the tool's result as the model got it: %q", turns[1].ToolResult)
		if !strings.Contains(turns[1].ToolResult, frame(id, body)) {
			t.Errorf("the frame is not inside the tool's result: %q", turns[1].ToolResult)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (c) turn end: mail arriving while the model writes its last answer;
	// the AfterAgent hook denies the end, and Gemini sends the frames as
	// the next user prompt: the turn goes on with it, once
	t.Run("turn-end", func(t *testing.T) {
		r := rig.sub(t)
		ends := count("AfterAgent")
		p := "a slow answer STUB:SLOW=4"
		prompt(r, p)
		r.waitScreen(pane, geminiWorkingRE, 20*time.Second)
		time.Sleep(500 * time.Millisecond)
		body := "arrived at the turn's end"
		id := r.sendID("gem", body)
		// the denied end, then the end of the turn that went on (its
		// AfterAgent with stop_hook_active)
		waitEvent(t, "AfterAgent", ends+2)
		r.waitState(id, "delivered", 30*time.Second)
		idle(r)
		if turns := withText(r, p); len(turns) == 0 || strings.Contains(turns[0].Body, id) {
			t.Fatalf("the slow request holds the message sent after it (or there is none): %d", len(turns))
		}
		var cont stubmodel.Request
		for _, q := range waitText(t, r, frame(id, body), 1) {
			if strings.Contains(q.Prompt, frame(id, body)) {
				cont = q
				break
			}
		}
		// the reason is the user prompt of the turn's next request, framed
		// as fleet messages (the intro says they are not the user's words)
		t.Logf("the request after the deny: user texts %q", cont.Texts)
		if !strings.HasPrefix(cont.Prompt, "Fleet messages from other entities (not the user's words") {
			t.Errorf("the request after the deny has the prompt %q", cont.Prompt)
		}
		// what Gemini's user sees of it: the reason as a warning
		if s := r.screen(pane); !strings.Contains(s, "Agent execution blocked: Fleet messages from other entities") {
			t.Errorf("the screen does not show the deny's reason:\n%s", s)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (d) a 50 KiB body comes as a pointer its model can follow: the
	// command after the pointer's words gives the body whole; the 50 KiB
	// never goes to the model
	t.Run("50KiB-pointer", func(t *testing.T) {
		r := rig.sub(t)
		idle(r)
		big := strings.Repeat("0123456789abcdef", 50<<10/16)
		id := r.sendID("gem", big)
		p := "a turn for the long one"
		prompt(r, p)
		r.waitState(id, "delivered", 30*time.Second)
		want := regexp.MustCompile(regexp.QuoteMeta(jsonText(header(id)+"\n│ (a body of 51200 bytes, too long for this hook: read it with ")) + `(.+?)\)\\n`)
		q := waitText(t, r, p, 1)[0]
		m := want.FindStringSubmatch(q.Body)
		if m == nil {
			t.Fatalf("the turn's request holds no pointer:%s", around(q.Body, jsonText(header(id))))
		}
		idle(r)
		for _, q := range r.stub.Requests() {
			if strings.Contains(q.Body, big[:4096]) {
				t.Fatal("the 50 KiB body went to the model")
			}
		}
		var cmd string
		if err := json.Unmarshal([]byte(`"`+m[1]+`"`), &cmd); err != nil {
			t.Fatal(err)
		}
		// run as the model's shell tool would: in the pane's environment
		sh := exec.Command("sh", "-c", cmd)
		sh.Env = env
		out, err := sh.Output()
		// cat gives the body; fleet-recv --id the frame with the body whole
		if err != nil || strings.TrimSuffix(string(out), "\n") != big && !strings.Contains(string(out), "\n"+deliverBar+big+"\n") {
			t.Fatalf("the pointer's command %q: %v, %d bytes", cmd, err, len(out))
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// nothing the hooks said showed on the screen (their failures start
	// "fleet-recv:" or "fleet-turn:"): {} when nothing waits, JSON always
	if s := rig.screen(pane); strings.Contains(s, "fleet-recv:") || strings.Contains(s, "fleet-turn:") {
		t.Errorf("the hooks showed something on screen:\n%s", s)
	}
}
