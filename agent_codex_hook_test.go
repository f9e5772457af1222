package fleet_test

import (
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

// Hook delivery mode with the real Codex CLI (0.169): the entity is
// joined --mode hook (no pane: the gateway types nothing anywhere) and
// Codex runs with its FLEET_TOKEN; the shipped recipe's fleet-recv --hook
// codex hands the mail to the model — at a turn's start
// (UserPromptSubmit), after a tool call (PostToolUse), at a turn's end
// (Stop, keeping the turn going) — framed, once into the conversation,
// and acknowledged only then. What the model received is read from the
// stub's record of each request as sent (docs/agent-clis/codex.md).
func TestCodexHookMode(t *testing.T) {
	agentTest(t)
	r := newCodexRig(t)
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	token := strings.Fields(r.fleet("fleet-roster", "join", "cx", "--mode", "hook"))[0]
	hooks := r.recvShim()
	pane, run := r.gatedPane("cx", "PATH="+filepath.Join(r.dir, "shim")+":$PATH exec "+agentBin(t, "codex")+" --no-daemon",
		"CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key", "FLEET_TOKEN="+token)
	run()
	r.waitScreen(pane, codexReadyRE.String(), 30*time.Second)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(hooks)
			t.Logf("fleet-recv hooks:\n%s\nscreen:\n%s", b, r.screen(pane))
		}
	})
	c := &codexHooked{r: r, pane: pane, log: hooks}
	header := func(id string) string { return "[fleet message from alice@h1 · msg " + id + " · send]" }
	var ids []string

	// no hook runs while Codex waits at its prompt: a message sent now
	// stays pending, and the next turn's start hands it over
	t.Run("pending-while-no-hook", func(t *testing.T) {
		r := c.sub(t)
		id := r.sendID("cx", "sent while the agent is idle")
		ids = append(ids, id)
		stillPending(t, r, id)
		p := "a turn of its own"
		c.prompt(t, p)
		q := r.turnWith(p, 30*time.Second)
		takenBy(t, r, id, p)
		t.Logf("the turn's request, where the message is:%s", around(q.Body, jsonText(header(id))))
		if n := strings.Count(q.Body, jsonText(header(id)+"\n│ sent while the agent is idle\n")); n != 1 {
			t.Errorf("the turn's request holds the message %d times, want 1:\n%s", n, q.Body)
		}
		r.waitState(id, "delivered", 30*time.Second)
		c.waitHooks(t, "stop", 1)
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// mid-turn: sent while a tool call runs, handed by the PostToolUse
	// hook into the request that carries the call's output
	t.Run("mid-turn", func(t *testing.T) {
		r := c.sub(t)
		stops, tools := c.hooksRun("stop"), c.hooksStarted("tool")
		p := "run a slow tool STUB:TOOL=sleep 3"
		c.prompt(t, p)
		r.turnWith(p, 30*time.Second) // the call: sleep 3 runs now
		body := "mid-turn mail, line one\nline two"
		id := r.sendID("cx", body)
		ids = append(ids, id)
		// delivered only once the PostToolUse hook has it
		if st := r.msgState(id); st != "accepted" && c.hooksStarted("tool") == tools {
			t.Errorf("before the tool call's hook started the message reads %s, want accepted", st)
		}
		c.waitHooks(t, "stop", stops+1)
		r.waitState(id, "delivered", 30*time.Second)
		turns := waitTurnsWith(t, r, p, 2)
		if len(turns) != 2 || turns[1].ToolResult == "" {
			for i, q := range turns {
				t.Logf("request %d: answer %q tool result %q prompt %q; the header:%s", i, q.Answer, q.ToolResult, q.Prompt, around(q.Body, jsonText(header(id))))
			}
			t.Fatalf("the tool turn: %d requests, want 2 (the call, its result)", len(turns))
		}
		t.Logf("the request after the tool call, where the message is:%s", around(turns[1].Body, jsonText(header(id))))
		if strings.Contains(turns[0].Body, id) {
			t.Errorf("the request before the tool call holds the message")
		}
		frame := header(id) + "\n│ mid-turn mail, line one\n│ line two\n[end of fleet message " + id +
			" · reply: fleet-send --reply-to " + id + " TEXT]"
		if n := strings.Count(turns[1].Body, jsonText(frame)); n != 1 {
			t.Errorf("the request after the tool call holds the exact frame %d times, want 1:\n%s", n, turns[1].Body)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
		if s := r.screen(pane); strings.Contains(s, "mid-turn mail") {
			t.Errorf("the message shows in the pane:\n%s", s)
		}
	})

	// mail that arrives while the model writes its last answer: the Stop
	// hook's block keeps the turn going with it, one more request
	t.Run("turn-end", func(t *testing.T) {
		r := c.sub(t)
		stops := c.hooksRun("stop")
		p := "a slow answer STUB:SLOW=4"
		c.prompt(t, p)
		slow := r.turnWith(p, 30*time.Second)
		id := r.sendID("cx", "arrived at the turn's end")
		ids = append(ids, id)
		// the blocking Stop, and the one after the turn went on
		c.waitHooks(t, "stop", stops+2)
		r.waitState(id, "delivered", 30*time.Second)
		if strings.Contains(slow.Body, id) {
			t.Fatal("the slow request holds the message sent after it")
		}
		var with []stubmodel.Request
		for _, q := range r.stub.Turns() {
			if strings.Contains(q.Body, jsonText(header(id)+"\n│ arrived at the turn's end\n")) {
				with = append(with, q)
			}
		}
		if len(with) != 1 {
			t.Fatalf("%d requests carry the message after the Stop hook, want 1", len(with))
		}
		t.Logf("the request after the Stop hook's block: prompt %q; where the message is:%s", with[0].Prompt, around(with[0].Body, jsonText(header(id))))
		if !strings.Contains(with[0].Prompt, header(id)) {
			t.Errorf("the block's reason is not the request's last user message: prompt %q", with[0].Prompt)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// a 50 KiB body comes as a pointer to its whole text; the body itself
	// never reaches the model
	t.Run("50KiB-pointer", func(t *testing.T) {
		r := c.sub(t)
		big := strings.Repeat("0123456789abcdef", 50<<10/16)
		id := r.sendID("cx", big)
		ids = append(ids, id)
		p := "a turn for the long one"
		c.prompt(t, p)
		q := r.turnWith(p, 30*time.Second)
		r.waitState(id, "delivered", 30*time.Second)
		want := regexp.MustCompile(regexp.QuoteMeta(jsonText(header(id)+"\n│ (a body of 51200 bytes, too long for this hook: read it with ")) +
			`(cat '([^']+)'|fleet-recv --id ([A-Za-z0-9._:-]+))\)`)
		m := want.FindStringSubmatch(q.Body)
		if m == nil {
			t.Fatalf("the turn's request holds no pointer:%s", around(q.Body, jsonText(header(id))))
		}
		var got []byte
		if m[2] != "" {
			got, _ = os.ReadFile(m[2])
		} else {
			cmd := exec.Command(filepath.Join(binDir, "fleet-recv"), "--id", m[3])
			cmd.Env = r.env("FLEET_TOKEN=" + token)
			got, _ = cmd.Output()
		}
		// cat gives the body; fleet-recv --id the frame with the body whole
		if strings.TrimSuffix(string(got), "\n") != big && !strings.Contains(string(got), "\n"+deliverBar+big+"\n") {
			t.Fatalf("the pointer %q gives %d bytes, not the body", m[1], len(got))
		}
		for _, q := range r.stub.Requests() {
			if strings.Contains(q.Body, big[:4096]) {
				t.Fatal("the 50 KiB body went to the model")
			}
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// never twice into one conversation: every request from the one that
	// first carried a message on carries it once (hook text stays)
	t.Run("once-each", func(t *testing.T) {
		r := c.sub(t)
		stops := c.hooksRun("stop") // before the prompt: its Stop hook may end before the turn is seen
		c.prompt(t, "one more turn")
		r.turnWith("one more turn", 30*time.Second)
		c.waitHooks(t, "stop", stops+1)
		for _, id := range ids {
			onceInEach(t, r.stub.Turns(), header(id), 1)
		}

	})

	// the same recipe in the Codex of a pull entity (its FLEET_TOKEN
	// set): the hooks run, take nothing, show nothing, and the turn goes
	// as without them
	t.Run("pull-entity", func(t *testing.T) {
		r := c.sub(t)
		bob := strings.Fields(r.fleet("fleet-roster", "join", "bob", "--mode", "pull"))[0]
		pane, run := r.gatedPane("bob", "PATH="+filepath.Join(r.dir, "shim")+":$PATH exec "+agentBin(t, "codex")+" --no-daemon",
			"CODEX_HOME="+c.r.codexHome, "STUB_API_KEY=stub-key", "FLEET_TOKEN="+bob)
		run()
		r.waitScreen(pane, codexReadyRE.String(), 30*time.Second)
		b := &codexHooked{r: c.r, pane: pane, log: c.log}
		id := r.sendID("bob", "for bob's fleet-recv, not his hooks")
		stops := b.hooksRun("stop")
		b.prompt(t, "a turn of bob STUB:TOOL=true")
		r.waitScreen(pane, `stub reply`, 30*time.Second)
		b.waitHooks(t, "stop", stops+1)
		if log, _ := os.ReadFile(c.log); regexp.MustCompile(`rc=[1-9]`).Match(log) {
			t.Errorf("a hook exited non-zero:\n%s", log)
		}
		if st := r.msgState(id); st != "accepted" {
			t.Errorf("bob's message reads %s, want accepted (his hooks take nothing)", st)
		}
		for _, q := range r.stub.Requests() {
			if strings.Contains(q.Body, id) || strings.Contains(q.Body, "Fleet messages from") && strings.Contains(q.Prompt, "a turn of bob") {
				t.Errorf("a request of bob's turn holds fleet text: %q", q.Prompt)
			}
		}
		if s := r.screen(pane); regexp.MustCompile(`(?i)hook failed|blocked by hook|fleet-recv|fleet-turn`).MatchString(s) {
			t.Errorf("the hooks showed something:\n%s", s)
		}
		if n := len(turnsWith(r, "a turn of bob")); n != 2 {
			t.Errorf("bob's turn: %d requests, want 2 (the call, its result)", n)
		}
	})
}

// codexHooked is a Codex in a pane whose fleet-recv hooks are logged.
type codexHooked struct {
	r    *codexRig
	pane string
	log  string
}

func (c *codexHooked) sub(t *testing.T) *agentRig { return c.r.agentRig.sub(t) }

// prompt types text into Codex's composer as its user would: once the
// text shows, Enter after a pause (an Enter right behind typed keys is a
// newline to Codex's paste-burst detection).
func (c *codexHooked) prompt(t *testing.T, text string) {
	t.Helper()
	r := c.sub(t)
	deadline := time.Now().Add(30 * time.Second)
	for s := r.screen(c.pane); !codexReadyRE.MatchString(s) || codexWorkingRE.MatchString(s); s = r.screen(c.pane) {
		if time.Now().After(deadline) {
			t.Fatalf("Codex is not at its prompt:\n%s", s)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.tmux("send-keys", "-t", c.pane, "-l", text)
	r.waitScreen(c.pane, "› "+regexp.QuoteMeta(text), 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	r.tmux("send-keys", "-t", c.pane, "Enter")
}

// hooksRun is how many fleet-recv hooks of event have ended.
func (c *codexHooked) hooksRun(event string) int {
	b, _ := os.ReadFile(c.log)
	return strings.Count(string(b), "end "+event+" ")
}

// hooksStarted is how many fleet-recv hooks of event have started.
func (c *codexHooked) hooksStarted(event string) int {
	b, _ := os.ReadFile(c.log)
	return strings.Count(string(b), "start "+event+" ")
}

// waitHooks waits until n fleet-recv hooks of event have ended.
func (c *codexHooked) waitHooks(t *testing.T, event string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.hooksRun(event) < n {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(c.log)
			t.Fatalf("%d fleet-recv --event %s hook(s) ran, want %d:\n%s", c.hooksRun(event), event, n, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recvShim puts a fleet-recv ahead of the real one on the rig's shim
// PATH that logs each hook's start and end (its event, exit code and
// stdout's size) around the real one, stdout passed through as it is;
// it returns the log's path.
func (r *codexRig) recvShim() string {
	r.t.Helper()
	log := filepath.Join(r.dir, "fleet-recv.log")
	script := fmt.Sprintf(`#!/bin/sh
ev=$(echo "$*" | sed -n 's/.*--event \([a-z]*\).*/\1/p')
echo "start $ev " >> %[2]s
%[1]s "$@"
rc=$?
echo "end $ev rc=$rc" >> %[2]s
exit $rc
`, filepath.Join(binDir, "fleet-recv"), log)
	if err := os.WriteFile(filepath.Join(r.dir, "shim", "fleet-recv"), []byte(script), 0o755); err != nil {
		r.t.Fatal(err)
	}
	return log
}
