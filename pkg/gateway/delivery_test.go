package gateway_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// waitFor is fleet-send --until STATE (OpWait) as e.
func (e entity) waitFor(msgID, until string, timeoutMS int64) (*api.Record, error) {
	resp, err := e.gw.call(e.Token, &api.WaitRequest{MsgID: msgID, Until: until, TimeoutMS: timeoutMS})
	if err != nil {
		return nil, err
	}
	return resp.Record, nil
}

// An inject entity (exec adapter) gets its messages one at a time, in
// the order they were sent, each once, as envelopes on stdin.
func TestLocalInjectInOrder(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", nil)
	alice := g.join("alice")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out})
	var want, ids []string
	for i := range 10 {
		b := "message " + strconv.Itoa(i)
		want = append(want, b)
		ids = append(ids, alice.mustSend("hook", b).MsgID)
	}
	got := waitLines(t, out, len(want))
	if b := envBodies(got); !slices.Equal(b, want) {
		t.Fatalf("injected %q", b)
	}
	for i, env := range got {
		if env.Kind != envelope.Send || env.MsgID != ids[i] || env.Sender.Gid != alice.Gid || env.Recipient.Gid != hook.Gid {
			t.Fatalf("line %d: %+v", i, env)
		}
	}
	for _, id := range ids {
		if rec := alice.waitState(id, "delivered"); rec.Attempts != 1 || rec.Recipient != "hook@h1" {
			t.Fatalf("record %+v", rec)
		}
	}
	r, _ := g.rosterRow("hook")
	if r.Mode != "inject" || r.Target != "cat >> "+out || r.Pending != 0 || r.LastDelivery.IsZero() {
		t.Fatalf("hook row %+v", r)
	}
	// fleet-recv is for pull entities only
	_, err := hook.tryTake(0)
	faultOf(t, err, fault.Usage)
	if n := g.logCount(`"msg":"delivered"`); n != len(want) {
		t.Errorf("%d delivered lines logged, want %d", n, len(want))
	}
}

// A failing delivery is retried with backoff and the queue behind it
// waits: the first message gets through on its third attempt, the second
// after it.
func TestLocalInjectRetriesThenDelivers(t *testing.T) {
	dir := t.TempDir()
	out, count := filepath.Join(dir, "hook.out"), filepath.Join(dir, "count")
	cmd := fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s; `+
		`if [ "$n" -lt 3 ]; then echo "not yet $n" >&2; exit 1; fi; cat >> %[2]s`, count, out)
	g := startGW(t, dir, "h1", settings{"delivery-attempts": "5"})
	alice := g.join("alice")
	g.join("hook", api.JoinRequest{Mode: "inject", Exec: cmd})
	s1 := alice.mustSend("hook", "first")
	s2 := alice.mustSend("hook", "second")
	if b := envBodies(waitLines(t, out, 2)); !slices.Equal(b, []string{"first", "second"}) {
		t.Fatalf("injected %q", b)
	}
	if rec := alice.waitState(s1.MsgID, "delivered"); rec.Attempts != 3 {
		t.Errorf("first: %+v, want 3 attempts", rec)
	}
	if rec := alice.waitState(s2.MsgID, "delivered"); rec.Attempts != 1 {
		t.Errorf("second: %+v, want 1 attempt", rec)
	}
	logs := g.logs.String()
	// each failure logged by its status and stderr's size, never its text
	if n := strings.Count(logs, "exec adapter: exit status 1 (stderr 10 bytes, sha256 "); n != 2 {
		t.Errorf("%d failed attempts logged with their status, want 2:\n%s", n, logs)
	}
	if strings.Contains(logs, "not yet") {
		t.Errorf("the hook's stderr is in the gateway's log:\n%s", logs)
	}
	if n := g.logCount(`"msg":"delivery failed"`); n != 2 {
		t.Errorf("%d failed attempts logged, want 2", n)
	}
}

// A delivery that keeps failing is dead-lettered after delivery-attempts
// with the reason; the sender's --until hears it, its record says so,
// fleet-roster dead lists it, and the sender gets a BOUNCE in its inbox.
func TestLocalBounceAfterFailedDeliveries(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"delivery-attempts": "3"})
	alice := g.join("alice")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "echo boom >&2; exit 3"})
	s := alice.mustSend("hook", "doomed")

	_, err := alice.waitFor(s.MsgID, "delivered", 15_000)
	fe := faultOf(t, err, fault.TempFail)
	if !strings.Contains(fe.Msg, "is dead, not delivered") || !strings.Contains(fe.Msg, "delivery failed 3 times") {
		t.Fatalf("--until delivered: %v", fe)
	}
	rec, err := alice.waitFor(s.MsgID, "dead", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != "dead" || rec.Attempts != 3 || !strings.HasPrefix(rec.Reason, "delivery failed 3 times: ") ||
		!strings.Contains(rec.Reason, "exit status 3 (stderr 5 bytes, sha256 ") || strings.Contains(rec.Reason, "boom") || rec.Recipient != "hook@h1" || rec.Done.IsZero() {
		t.Fatalf("dead record: %+v", rec)
	}
	// the recipient may ask too; a stranger may not
	if _, err := hook.waitFor(s.MsgID, "dead", 1000); err != nil {
		t.Errorf("recipient's --until dead: %v", err)
	}
	carol := g.join("carol")
	_, err = carol.waitFor(s.MsgID, "dead", 1000)
	faultOf(t, err, fault.NoRecipient)

	got := alice.collect("your message " + s.MsgID + " to hook@h1 was dead-lettered: " + rec.Reason)
	if b := got[0].Envelope; b.Kind != envelope.Bounce || b.InReplyTo != s.MsgID || b.TraceID != s.TraceID || b.Sender.Name != "fleet" {
		t.Fatalf("bounce %+v", b)
	}

	for _, c := range []struct {
		name string
		n    int
	}{{"", 1}, {"hook", 1}, {"alice", 0}} {
		resp := g.must("", &api.DeadRequest{Name: c.name})
		if len(resp.Dead) != c.n {
			t.Fatalf("dead %q: %d letters, want %d", c.name, len(resp.Dead), c.n)
		}
		if c.n == 1 {
			d := resp.Dead[0]
			if d.Record.MsgID != s.MsgID || d.Record.State != "dead" || d.Record.Attempts != 3 || d.Record.Reason != rec.Reason ||
				d.Envelope == nil || d.Envelope.Body != "doomed" {
				t.Fatalf("dead letter %+v / %+v", d.Record, d.Envelope)
			}
		}
	}
	_, err = g.call("", &api.DeadRequest{Name: "nobody"})
	faultOf(t, err, fault.NoRecipient)
	if r, _ := g.rosterRow("hook"); r.Dead != 1 || r.Pending != 0 {
		t.Errorf("hook row %+v", r)
	}
	if n := g.logCount(`"msg":"delivery failed"`); n != 3 {
		t.Errorf("%d failed attempts logged, want 3", n)
	}
	if n := g.logCount(`"msg":"dead-lettered"`); n != 1 {
		t.Errorf("%d dead-lettered lines logged, want 1", n)
	}
	// the bounce does not bounce, and nothing more comes: the next thing
	// in alice's inbox is a sentinel
	alice.empty(carol)
}

// --until gives up with 75 naming the state reached; waiting on a message
// the caller neither sent nor received is 67.
func TestLocalWaitUntil(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	s := alice.mustSend("bob", "pull me")
	_, err := alice.waitFor(s.MsgID, "delivered", 30)
	if fe := faultOf(t, err, fault.TempFail); !strings.Contains(fe.Msg, "is still accepted, not delivered") {
		t.Fatalf("--until before delivery: %v", fe)
	}
	done := make(chan error, 1)
	go func() {
		rec, err := alice.waitFor(s.MsgID, "delivered", 15_000)
		if err == nil && (rec.State != "delivered" || rec.Attempts != 1) {
			err = fmt.Errorf("record %+v", rec)
		}
		done <- err
	}()
	bob.collect("pull me")
	if err := <-done; err != nil {
		t.Fatalf("--until across the delivery: %v", err)
	}
	_, err = alice.waitFor("01a22a93-8b62-7719-997e-dae6eae12382", "delivered", 100)
	faultOf(t, err, fault.NoRecipient)
	_, err = g.call("", &api.WaitRequest{MsgID: s.MsgID, Until: "delivered"})
	faultOf(t, err, fault.Refused)
}

// While an inject entity says busy, its mail waits; idle delivers it. The
// status and the waiting mail survive a restart.
func TestLocalInjectBusyHolds(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", nil)
	alice := g.join("alice")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out})
	setStatus(t, hook, "busy")
	s := alice.mustSend("hook", "held")
	_, err := alice.waitFor(s.MsgID, "delivered", 200)
	if fe := faultOf(t, err, fault.TempFail); !strings.Contains(fe.Msg, "still accepted") {
		t.Fatalf("while busy: %v", fe)
	}
	if got := lines(t, out); len(got) != 0 {
		t.Fatalf("injected while busy: %q", envBodies(got))
	}
	if r, _ := g.rosterRow("hook"); r.Status != "busy" || r.Pending != 1 {
		t.Fatalf("hook row %+v", r)
	}
	g.restart()
	if r, _ := g.rosterRow("hook"); r.Status != "busy" || r.Pending != 1 {
		t.Fatalf("hook row after restart %+v", r)
	}
	alice.mustSend("hook", "held too")
	setStatus(t, hook, "idle")
	if b := envBodies(waitLines(t, out, 2)); !slices.Equal(b, []string{"held", "held too"}) {
		t.Fatalf("injected %q", b)
	}
	alice.waitState(s.MsgID, "delivered")

	_, err = g.call(hook.Token, &api.StatusRequest{Status: "asleep"})
	faultOf(t, err, fault.Usage)
	_, err = g.call("", &api.StatusRequest{Status: "busy"})
	faultOf(t, err, fault.Refused)
}

// nudgeLines reads a nudge hook's lines "NAME PENDING NUMBER" as
// NAME_PENDING_NUMBER.
func nudgeLines(path string) []string {
	data, _ := os.ReadFile(path)
	return strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(data)), " ", "_"))
}

// A pull entity's nudge hook runs while unread mail waits, with the count
// and a nudge number that grows by one; never about read mail; new mail
// after a drain is nudged about with its own count.
func TestLocalNudge(t *testing.T) {
	dir := t.TempDir()
	nudges := filepath.Join(dir, "nudges")
	g := startGW(t, dir, "h1", settings{"nudge-after": "50ms", "nudge-max": "100ms"})
	alice := g.join("alice")
	bob := g.join("bob", api.JoinRequest{Mode: "pull", Nudge: `echo "$FLEET_ENTITY $FLEET_PENDING $FLEET_NUDGE" >> ` + nudges})
	alice.mustSend("bob", "one")
	alice.mustSend("bob", "two")
	eventually(t, "two nudges", func() error {
		if n := len(nudgeLines(nudges)); n < 2 {
			return fmt.Errorf("%d nudges", n)
		}
		return nil
	})
	bob.collect("one", "two")
	alice.mustSend("bob", "three")
	eventually(t, "a nudge for the new mail", func() error {
		if !slices.ContainsFunc(nudgeLines(nudges), func(l string) bool { return strings.HasPrefix(l, "bob_1_") }) {
			return fmt.Errorf("nudges %q", nudgeLines(nudges))
		}
		return nil
	})
	// before the drain: 2 waiting, nudges 1, 2, ...; after: 1 waiting,
	// numbered on by one (from 1: see TestLocalNudgeResetsAfterDrain)
	got := nudgeLines(nudges)
	i := slices.IndexFunc(got, func(l string) bool { return strings.HasPrefix(l, "bob_1_") })
	first, _ := strconv.Atoi(strings.TrimPrefix(got[i], "bob_1_"))
	for k, l := range got {
		want := fmt.Sprintf("bob_2_%d", k+1)
		if k >= i {
			want = fmt.Sprintf("bob_1_%d", first+k-i)
		}
		if l != want {
			t.Fatalf("nudge %d is %q, want %q (all: %q)", k, l, want, got)
		}
	}
	g.waitLog(`"msg":"nudged"`)

	// a failing hook is logged, and delivery is not affected
	carol := g.join("carol", api.JoinRequest{Mode: "pull", Nudge: "echo nope >&2; exit 5"})
	alice.mustSend("carol", "for carol")
	g.waitLog(`"msg":"nudge hook failed","host":"h1","entity":"carol"`)
	carol.collect("for carol")
}

// Mail that arrives after the inbox was drained starts the nudges over at
// 1 ("an emptied inbox resets the backoff"), also when the drain happened
// while a nudge hook was running. (It once carried on counting: the
// nudge loop only looked at the inbox between hook runs.)
func TestLocalNudgeResetsAfterDrain(t *testing.T) {
	dir := t.TempDir()
	nudges := filepath.Join(dir, "nudges")
	g := startGW(t, dir, "h1", settings{"nudge-after": "50ms", "nudge-max": "100ms"})
	alice := g.join("alice")
	// the hook says it ran, then takes a moment
	bob := g.join("bob", api.JoinRequest{Mode: "pull", Nudge: `echo "$FLEET_ENTITY $FLEET_PENDING $FLEET_NUDGE" >> ` + nudges + "; sleep 1"})
	alice.mustSend("bob", "one")
	eventually(t, "a nudge", func() error {
		if len(nudgeLines(nudges)) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	bob.collect("one") // while the hook still runs
	alice.mustSend("bob", "two")
	eventually(t, "a nudge for the new mail", func() error {
		if len(nudgeLines(nudges)) < 2 {
			return errors.New("none yet")
		}
		return nil
	})
	if got := nudgeLines(nudges); got[1] != "bob_1_1" {
		t.Fatalf("nudges %q: the new mail's first nudge is not nudge 1", got)
	}
}

// join refuses entities that cannot be delivered to.
func TestLocalJoinRefusals(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	for _, c := range []struct {
		name string
		req  api.JoinRequest
	}{
		{"inject without a target", api.JoinRequest{Name: "a", Mode: "inject"}},
		{"inject with two targets", api.JoinRequest{Name: "a", Mode: "inject", Exec: "cat", TmuxTarget: "s:1.0"}},
		{"inject with a nudge", api.JoinRequest{Name: "a", Mode: "inject", Exec: "cat", Nudge: "true"}},
		{"pull with an exec", api.JoinRequest{Name: "a", Mode: "pull", Exec: "cat"}},
		{"unknown mode", api.JoinRequest{Name: "a", Mode: "push"}},
		{"group all", api.JoinRequest{Name: "a", Mode: "pull", Groups: []string{"all"}}},
		{"bad group", api.JoinRequest{Name: "a", Mode: "pull", Groups: []string{"no spaces"}}},
	} {
		_, err := g.call("", &c.req)
		if codeOf(err) != fault.Usage {
			t.Errorf("%s: %v, want exit 64", c.name, err)
		}
	}
	if r := g.must("", &api.RosterRequest{}); len(r.Entities) != 0 {
		t.Fatalf("refused joins left %+v", r.Entities)
	}
}
