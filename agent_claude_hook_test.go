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
	"github.com/fleetd/fleet/pkg/deliver"
)

// Hook delivery mode with the real Claude Code: the entity is joined
// --mode hook, so the gateway types nothing into its pane; the shipped
// recipe's fleet-recv --hook hands its mail to the model — after a tool
// call (PostToolUse), at a turn's start (UserPromptSubmit), at its end
// (Stop) and to an idle agent (asyncRewake) — framed, once, and
// acknowledged only then. What the model received is read from the
// stub's record of each request as sent.
func TestClaudeCodeHookMode(t *testing.T) {
	agentTest(t)
	agentBin(t, "claude")
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := &claudeRun{r: rig, name: "hooked", hooks: filepath.Join(rig.dir, "claude-hooks.jsonl")}
	claudeConfig(t, rig, c.hooks)
	out := rig.fleet("fleet-roster", "join", c.name, "--mode", "hook")
	c.token = strings.Fields(out)[0]
	c.startInPane(t)
	count := func(event string) int { return c.hookCount(t, event) }
	header := func(id string) string { return "[fleet message from alice@h1 · msg " + id + " · send]" }

	// before the first turn's end no wake hook runs: a message sent now
	// waits, and the next turn's start hands it over
	t.Run("pending-while-no-hook", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		r.waitScreen(c.pane, claudeReady, 20*time.Second)
		id := c.send(t, "sent while the agent is idle")
		stillPending(t, r, id)
		p := "a turn of its own"
		c.prompt(p)
		q := r.turnWith(p, 30*time.Second)
		takenBy(t, r, id, p)
		if n := strings.Count(q.Body, jsonText(header(id)+"\n│ sent while the agent is idle\n")); n != 1 {
			t.Errorf("the turn's request holds the message %d times, want 1:\n%s", n, q.Body)
		}
		c.waitState(t, id, "delivered")
		onceInEach(t, r.stub.Requests(), header(id), 1)
	})

	t.Run("mid-turn", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		stops := count("Stop")
		p := "run a slow tool STUB:TOOL=sleep 3"
		c.prompt(p)
		c.waitHook(t, "PreToolUse", count("PreToolUse")+1)
		body := "mid-turn mail, line one\nline two"
		id := c.send(t, body)
		c.waitHook(t, "Stop", stops+1)
		c.waitState(t, id, "delivered")
		turns := waitTurnsWith(t, r, p, 2)
		if len(turns) != 2 || turns[1].ToolResult == "" {
			for i, q := range turns {
				t.Logf("request %d: answer %q tool result %q prompt %q; the header:%s", i, q.Answer, q.ToolResult, q.Prompt, around(q.Body, jsonText(header(id))))
			}
			t.Fatalf("the tool turn: %d requests, want 2 (the call, its result)", len(turns))
		}
		if strings.Contains(turns[0].Body, id) {
			t.Errorf("the request before the tool call holds the message")
		}
		frame := header(id) + "\n│ mid-turn mail, line one\n│ line two\n[end of fleet message " + id +
			" · reply: fleet-send --reply-to " + id + " TEXT]"
		if n := strings.Count(turns[1].Body, jsonText(frame)); n != 1 {
			t.Errorf("the request after the tool call holds the exact frame %d times, want 1:\n%s", n, turns[1].Body)
		}
		onceInEach(t, r.stub.Requests(), header(id), 1)
		if strings.Contains(r.screen(c.pane), "mid-turn mail") && strings.Contains(r.screen(c.pane), "❯ [fleet") {
			t.Errorf("the message was typed into the pane:\n%s", r.screen(c.pane))
		}
	})

	// idle after a turn: the recipe's asyncRewake hook (fleet-recv --event
	// wake) takes the message, and its exit 2 wakes the agent with it —
	// no prompt typed; a 50 KiB body comes as a pointer to its whole text
	t.Run("idle-wakes-50KiB-pointer", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		r.waitScreen(c.pane, claudeReady, 20*time.Second)
		before := len(r.stub.Requests())
		big := strings.Repeat("0123456789abcdef", 50<<10/16)
		id := c.send(t, big)
		c.waitState(t, id, "delivered")
		// the pointer line, by its prefix; the command after it is
		// followed as the model would: fleet-recv --id ID (or, before it,
		// cat 'PATH')
		want := regexp.MustCompile(regexp.QuoteMeta(jsonText(header(id)+"\n│ (a body of 51200 bytes, too long for this hook: read it with ")) +
			`(?:fleet-recv --id ([A-Za-z0-9._:-]+)|cat '([^']+)')\)`)
		var q stubmodel.Request
		deadline := time.Now().Add(30 * time.Second)
		for q.Body == "" || !want.MatchString(q.Body) {
			if time.Now().After(deadline) {
				t.Fatalf("no request after the wake holds the pointer; requests since: %+v", r.stub.Requests()[before:])
			}
			time.Sleep(200 * time.Millisecond)
			if reqs := r.stub.Requests(); len(reqs) > before {
				q = reqs[len(reqs)-1]
			}
		}
		if strings.Contains(q.Body, big[:4096]) {
			t.Fatal("the 50 KiB body went to the model")
		}
		m := want.FindStringSubmatch(q.Body)
		if m[2] != "" {
			if b, err := os.ReadFile(m[2]); err != nil || string(b) != big {
				t.Fatalf("the pointer's file %s: %v, %d bytes", m[2], err, len(b))
			}
		} else {
			if m[1] != id {
				t.Fatalf("the pointer names %q, not %s", m[1], id)
			}
			// run as the agent's shell tool would: its credential in
			// FLEET_TOKEN; the body whole inside its frame, and as JSON
			show := func(args ...string) string {
				cmd := exec.Command(filepath.Join(binDir, "fleet-recv"), append([]string{"--id", m[1]}, args...)...)
				cmd.Env = r.env("FLEET_TOKEN=" + c.token)
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("fleet-recv --id %s %v: %v", m[1], args, err)
				}
				return string(out)
			}
			if out, frame := show(), header(id)+"\n│ "+big+"\n[end of fleet message "+id+" · reply: fleet-send --reply-to "+id+" TEXT]\n"; out != frame {
				t.Errorf("fleet-recv --id printed %d bytes, want the frame with the body whole (%d bytes): %.300s", len(out), len(frame), out)
			}
			var msg struct {
				Type, Body string
			}
			if out := show("--json"); json.Unmarshal([]byte(out), &msg) != nil || msg.Type != "message" || msg.Body != big {
				t.Errorf("fleet-recv --id --json: %.300s", out)
			}
		}
		onceInEach(t, r.stub.Requests(), header(id), 1)
	})

	// mail that arrives while the model writes its last answer: the Stop
	// hook keeps the turn going with it, one more request
	t.Run("turn-end", func(t *testing.T) {
		r := rig.sub(t)
		c.r = r
		stops := count("Stop")
		p := "a slow answer STUB:SLOW=4"
		c.prompt(p)
		r.waitScreen(c.pane, `esc to interrupt`, 10*time.Second)
		c.waitHook(t, "UserPromptSubmit", count("UserPromptSubmit"))
		time.Sleep(500 * time.Millisecond)
		id := c.send(t, "arrived at the turn's end")
		c.waitHook(t, "Stop", stops+1)
		c.waitState(t, id, "delivered")
		turns := waitTurnsWith(t, r, p, 1)
		if strings.Contains(turns[0].Body, id) {
			t.Fatal("the slow request holds the message sent after it")
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			n := 0
			for _, q := range r.stub.Requests() {
				if strings.Contains(q.Body, jsonText(header(id)+"\n│ arrived at the turn's end\n")) {
					n++
				}
			}
			if n >= 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no request carried the message after the Stop hook")
			}
			time.Sleep(200 * time.Millisecond)
		}
		onceInEach(t, r.stub.Requests(), header(id), 2)
	})
}

// deliverBar starts every body line of a frame (deliver.FrameBar).
const deliverBar = deliver.FrameBar

// jsonText is s as it stands inside a JSON string (the request bodies).
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// onceInEach: the message was handed into the conversation once. Hook text
// stays in it, so each request from the first that holds s on holds it
// the same number of times (a second hand-over would add to it): want
// times, or for a Stop hook's block two (Claude Code shows the reason to
// the model twice, as "Stop hook feedback" and as the "blocking error").
func onceInEach(t *testing.T, reqs []stubmodel.Request, s string, want int) {
	t.Helper()
	seen := false
	for i, q := range reqs {
		n := strings.Count(q.Body, jsonText(s))
		if n == 0 && !seen {
			continue
		}
		seen = true
		if n != want {
			t.Errorf("request %d holds %q %d times, want %d:%s", i, s, n, want, around(q.Body, jsonText(s)))
		}
	}
	if !seen {
		t.Errorf("no request holds %q", s)
	}
}

// around is each place s occurs in body, with what stands before it.
func around(body, s string) string {
	var b strings.Builder
	for i := 0; ; {
		j := strings.Index(body[i:], s)
		if j < 0 {
			return b.String()
		}
		j += i
		b.WriteString("\n  …" + body[max(0, j-300):min(len(body), j+len(s)+200)])
		i = j + len(s)
	}
}
