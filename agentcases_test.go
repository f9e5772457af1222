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

// The cases every agent CLI test runs on its started CLI (issue 21 point
// 7): what the model was shown is read from the stub's request log, never
// from timing.

// sendID sends body from alice to the entity and returns the message id.
func (r *agentRig) sendID(to, body string) string {
	r.t.Helper()
	out := r.fleet("fleet-send", "--as", "alice", "--json", to, body)
	m := regexp.MustCompile(`"msg_id":"([^"]+)"`).FindStringSubmatch(out)
	if m == nil {
		r.t.Fatalf("fleet-send printed no msg_id: %s", out)
	}
	return m[1]
}

// msgState is the state fleet-send --status reads for message id.
func (r *agentRig) msgState(id string) string {
	r.t.Helper()
	st := r.fleet("fleet-send", "--as", "alice", "--json", "--status", id)
	m := regexp.MustCompile(`"state":"([a-z_]+)"`).FindStringSubmatch(st)
	if m == nil {
		r.t.Fatalf("fleet-send --status %s: no state in %s", id, st)
	}
	return m[1]
}

// waitState waits until message id reads state.
func (r *agentRig) waitState(id, state string, within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := r.msgState(id)
		if got == state {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("message %s reads %s, not %s, after %v", id, got, state, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rosterLine is the entity's line of fleet-roster --json.
func (r *agentRig) rosterLine(name string) string {
	r.t.Helper()
	out, _, _ := r.fleetTry("fleet-roster", "--json")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"name":"`+name+`"`) {
			return line
		}
	}
	return ""
}

// turnWith waits for the first agent turn whose prompt (the last user
// text) holds s, and returns it.
func (r *agentRig) turnWith(s string, within time.Duration) stubmodel.Request {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, u := range r.stub.Turns() {
			if strings.Contains(u.Prompt, s) {
				return u
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no turn of the model had %q in its prompt within %v; turns: %+v", s, within, promptsOf(r.stub.Turns()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promptsOf is the prompts of requests, for a failure message.
func promptsOf(reqs []stubmodel.Request) []string {
	var out []string
	for _, u := range reqs {
		out = append(out, u.Time.Format("15:04:05.000")+" "+u.Prompt)
	}
	return out
}

// count is how many times s occurs in texts.
func count(texts []string, s string) int {
	n := 0
	for _, t := range texts {
		n += strings.Count(t, s)
	}
	return n
}

// checkTwoTurns checks that message b (body bodyB, id idB) came to the
// model as a turn of its own after message a's turn had ended: turn a's
// prompt holds a's body and header once and nothing of b, turn b's prompt
// b's and nothing of a, a never saw b, b's request came after the last
// request of message a (and, a's answer taking slow, at least slow after
// a's turn request), and b's conversation holds a's answer: the model
// answered a before b was sent, so b was neither folded into a's turn nor
// steered into it.
func checkTwoTurns(t *testing.T, reqs []stubmodel.Request, a, b stubmodel.Request, bodyA, idA, bodyB, idB string, slow time.Duration) {
	t.Helper()
	if n := strings.Count(a.Prompt, bodyA); n != 1 || !strings.Contains(a.Prompt, "· msg "+idA) || strings.Contains(a.Prompt, bodyB) || strings.Contains(a.Prompt, idB) {
		t.Errorf("the first turn's prompt (body %d times, want 1): %q", n, a.Prompt)
	}
	if n := strings.Count(b.Prompt, bodyB); n != 1 || !strings.Contains(b.Prompt, "· msg "+idB) || strings.Contains(b.Prompt, bodyA) || strings.Contains(b.Prompt, idA) {
		t.Errorf("the second turn's prompt (body %d times, want 1): %q", n, b.Prompt)
	}
	if n := count(a.Texts, bodyB); n != 0 {
		t.Errorf("the first turn saw the second message: %q", a.Texts)
	}
	if n := count(b.Texts, bodyB); n != 1 {
		t.Errorf("the second turn has the second body %d times in its user texts, want 1: %q", n, b.Texts)
	}
	var lastA stubmodel.Request
	for _, u := range reqs {
		if strings.Contains(u.Prompt, bodyA) && !strings.Contains(u.Prompt, bodyB) {
			lastA = u
		}
	}
	if !b.Time.After(lastA.Time) {
		t.Errorf("the second turn's request (%v) came before the first message's last request (%v): %q",
			b.Time, lastA.Time, promptsOf(reqs))
	}
	if slow > 0 && b.Time.Sub(a.Time) < slow {
		t.Errorf("the second turn's request came %v after the first turn's, before its answer (%v) was done",
			b.Time.Sub(a.Time), slow)
	}
	if a.Answer == "" || !strings.Contains(b.Body, a.Answer+`"`) {
		t.Errorf("the second turn's conversation lacks the first turn's answer %q", a.Answer)
	}
}

// noMarker waits a few seconds and fails if path appears meanwhile: what
// a pane's shell would have run had the message been typed into it.
func noMarker(t *testing.T, path string, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("%s appeared: the message was typed into the pane's shell", path)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// backToBack sends entity two messages right after each other: two turns,
// the second sent only after the first ended (its answer takes 2 s: time
// enough to paste the second into the running turn, which the gateway
// must not), each message delivered, the entity idle after.
func backToBack(t *testing.T, r *agentRig, entity string) {
	t.Helper()
	bodyA, bodyB := "the first of two STUB:SLOW=2", "the second of two"
	idA := r.sendID(entity, bodyA)
	idB := r.sendID(entity, bodyB)
	b := r.turnWith(bodyB, 60*time.Second)
	a := r.turnWith(bodyA, time.Second)
	checkTwoTurns(t, r.stub.Requests(), a, b, bodyA, idA, bodyB, idB, 2*time.Second)
	r.waitState(idA, "delivered", 20*time.Second)
	r.waitState(idB, "delivered", 20*time.Second)
	r.waitStatus(entity, "idle", 20*time.Second)
}

// urgentFirst: during a slow turn (busy waits until the screen shows it
// running), two routine messages and then an urgent one are sent to
// entity. Nothing is pasted into the running turn; at its end the urgent
// one is the next turn, framed as urgent, then the two routine ones in
// the order they came, each a turn of its own (issue 37.3).
func urgentFirst(t *testing.T, r *agentRig, entity string, slow time.Duration, busy func()) {
	t.Helper()
	bodyA := fmt.Sprintf("slow, before the urgent one STUB:SLOW=%d", int(slow.Seconds()))
	bodyN1, bodyN2, bodyU := "routine one of two", "routine two of two", "urgent: stop the deploy"
	idA := r.sendID(entity, bodyA)
	a := r.turnWith(bodyA, 30*time.Second)
	busy()
	idN1 := r.sendID(entity, bodyN1)
	idN2 := r.sendID(entity, bodyN2)
	out := r.fleet("fleet-send", "--as", "alice", "--json", "--urgent", entity, bodyU)
	m := regexp.MustCompile(`"msg_id":"([^"]+)"`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("fleet-send --urgent printed no msg_id: %s", out)
	}
	idU := m[1]
	u := r.turnWith(bodyU, 60*time.Second)
	n1 := r.turnWith(bodyN1, 60*time.Second)
	n2 := r.turnWith(bodyN2, 60*time.Second)
	reqs := r.stub.Requests()
	checkTwoTurns(t, reqs, a, u, bodyA, idA, bodyU, idU, slow)
	checkTwoTurns(t, reqs, u, n1, bodyU, idU, bodyN1, idN1, 0)
	checkTwoTurns(t, reqs, n1, n2, bodyN1, idN1, bodyN2, idN2, 0)
	if !strings.Contains(u.Prompt, "[fleet urgent send from alice@") {
		t.Errorf("the urgent turn's prompt does not say urgent: %q", u.Prompt)
	}
	if strings.Contains(n1.Prompt, "urgent send") {
		t.Errorf("a routine turn's prompt says urgent: %q", n1.Prompt)
	}
	for _, id := range []string{idU, idN1, idN2} {
		r.waitState(id, "delivered", 20*time.Second)
	}
	r.waitStatus(entity, "idle", 20*time.Second)
}

// exitedGetsNothing quits the agent CLI in pane (its /quit command, the
// Enter once the command shows on screen as shown, and a pause: an Enter
// right behind typed keys is a newline to Codex and Gemini), waits for the
// pane to be back at bash, and checks that a message sent to entity then
// is never typed into the shell: the entity reads detached, a marker
// command in the body never runs, the message stays accepted.
func exitedGetsNothing(t *testing.T, r *agentRig, pane, entity, shown string) {
	t.Helper()
	// a CLI that has not loaded its slash commands yet takes /quit for a
	// prompt (Gemini CLI did once in CI: "✦ stub reply"): typed again, up
	// to three times, once the first has had its turn
	quit := func() bool {
		r.tmux("send-keys", "-t", pane, "-l", "/quit")
		r.waitScreen(pane, shown, 10*time.Second)
		time.Sleep(500 * time.Millisecond)
		r.tmux("send-keys", "-t", pane, "Enter")
		deadline := time.Now().Add(20 * time.Second)
		for r.tmux("display", "-p", "-t", pane, "#{pane_current_command}") != "bash" {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
		return true
	}
	for try := 1; !quit(); try++ {
		if try == 3 {
			t.Fatalf("the agent did not quit after /quit three times:\n%s", r.screen(pane))
		}
		t.Logf("the agent did not quit at /quit (try %d): typing it again:\n%s", try, r.screen(pane))
	}
	// the gateway looks at an idle pane every few seconds: detached
	// before any mail comes
	r.waitStatus(entity, "detached", 15*time.Second)
	marker := filepath.Join(r.dir, "MARKER-"+entity)
	id := r.sendID(entity, "status please; touch "+marker)
	noMarker(t, marker, 5*time.Second)
	if line := r.rosterLine(entity); !strings.Contains(line, `"status":"detached"`) {
		t.Errorf("%s in the roster: %s", entity, line)
	}
	if st := r.msgState(id); st != "accepted" {
		t.Errorf("the message to the exited agent reads %s, want accepted", st)
	}
	if s := r.screen(pane); strings.Contains(s, "status please") {
		t.Errorf("the message was typed into the shell:\n%s", s)
	}
}

// stillPending: a message sent while no hook of the agent runs is still
// accepted (pending) and in none of the model's requests. No wait for
// "a while": nothing happens that could be waited for. The proof that no
// hook took it before the next turn is that turn (takenBy).
func stillPending(t *testing.T, r *agentRig, id string) {
	t.Helper()
	if st := r.msgState(id); st != "accepted" {
		t.Fatalf("with no hook run the message reads %s, want accepted (pending)", st)
	}
	for _, q := range r.stub.Requests() {
		if strings.Contains(q.Body, id) {
			t.Fatal("the model saw the message with no hook run")
		}
	}
}

// takenBy: the first of the model's requests to hold message id (a turn's
// or a side request) belongs to the turn of prompt, the turn that was to
// hand it over: no hook took it into a request while the agent idled
// (the sentinel stillPending leaves to the next turn).
func takenBy(t *testing.T, r *agentRig, id, prompt string) {
	t.Helper()
	for _, q := range r.stub.Requests() {
		if strings.Contains(q.Body, id) {
			if !strings.Contains(q.Body, jsonText(prompt)) {
				t.Errorf("a request at %s, before the turn of %q that was to hand it over, held the message:%s",
					q.Time.Format("15:04:05.000"), prompt, around(q.Body, id))
			}
			return
		}
	}
	t.Errorf("no request of the model holds the message")
}

// replyAcrossHosts is the shared case of a reply made by the agent's own
// tool call across hosts: boss on h2 (credential bossTok) holds
// fleet-send --wait open to to (NAME@h1, the agent in pane); the model's
// bash tool runs fleet-send --reply-to with the entity's credential, and
// the reply, signed "done, from who", reaches boss's send over the broker.
func replyAcrossHosts(t *testing.T, rig *agentRig, h2 *testGW, bossTok, to, pane, who string) {
	t.Helper()
	run := func() (string, string, error) {
		wait := exec.Command(filepath.Join(binDir, "fleet-send"), "--wait", "--timeout", "120s", "--json",
			to, "please reply STUB:TOOL=fleet-send --reply-to {MSGID} done, from "+who)
		wait.Env = append(h2.env, "FLEET_TOKEN="+bossTok, "PATH="+binDir+":"+os.Getenv("PATH"))
		var out, errOut strings.Builder
		wait.Stdout, wait.Stderr = &out, &errOut
		err := wait.Run()
		return out.String(), errOut.String(), err
	}
	var out, errOut string
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		// h2 hears of the agent's entity within a presence interval or two
		if out, errOut, err = run(); exitCode(err) != 75 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("fleet-send --wait: %v\nstdout: %s\nstderr: %s\nscreen:\n%s", err, out, errOut, rig.screen(pane))
	}
	if !strings.Contains(out, `"kind":"REPLY"`) || !strings.Contains(out, "done, from "+who) {
		t.Fatalf("boss got %s", out)
	}
	turns := rig.waitTurns(2, 30*time.Second)
	if !strings.Contains(turns[0].Answer, "fleet-send --reply-to ") || turns[1].ToolResult == "" {
		for i, q := range turns {
			t.Logf("turn %d: answer %q, tool result %q", i, q.Answer, q.ToolResult)
		}
		t.Fatal("the model did not call fleet-send --reply-to and see its result")
	}
}

// withText are the turn requests whose body holds s (as JSON text).
func withText(r *agentRig, s string) []stubmodel.Request {
	var out []stubmodel.Request
	for _, q := range r.stub.Turns() {
		if strings.Contains(q.Body, jsonText(s)) {
			out = append(out, q)
		}
	}
	return out
}

// waitText waits until n turn requests hold s, and returns them.
func waitText(t *testing.T, r *agentRig, s string, n int) []stubmodel.Request {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); len(withText(r, s)) < n; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d turn request(s) hold %q, want %d; turns: %q", len(withText(r, s)), s, n, promptsOf(r.stub.Turns()))
		}
	}
	return withText(r, s)
}
