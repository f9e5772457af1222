package gateway_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// twoHostsWith starts h1 and h2 on the private broker, enrolled with each
// other, each with set (plus the broker).
func twoHostsWith(t *testing.T, set settings) (*testGW, *testGW) {
	t.Helper()
	url := brokerURL(t)
	dir := t.TempDir()
	var gws []*testGW
	for _, h := range []string{"h1", "h2"} {
		s := settings{"broker": url}
		for k, v := range set {
			s[k] = v
		}
		gws = append(gws, &testGW{t: t, Host: h, Cfg: newConfig(t, dir, h, s), logs: &syncBuffer{}})
	}
	enrol(t, gws...)
	for _, g := range gws {
		g.start()
		t.Cleanup(g.stop)
	}
	return gws[0], gws[1]
}

// An ask across hosts: shown on the askee's host, answered to the asking
// turn; a second answer hears too late from the asker's gateway.
func TestCrossHostAsk(t *testing.T) {
	h1, h2 := twoHostsWith(t, nil)
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	c, sent := alice.ask("bob", "across?", "turn-x", 15_000)
	if sent.Recipient != "bob@h2" || sent.Gid != bob.Gid {
		t.Fatalf("asked %+v", sent)
	}
	q := bob.collect("across?")[0].Envelope
	if q.Kind != envelope.Ask || q.TurnID != "turn-x" || q.Sender.String() != "alice@h1" {
		t.Fatalf("bob was shown %+v", q)
	}
	a, err := bob.answer(sent.MsgID, "yes, across")
	if err != nil || a.State != "answered" {
		t.Fatalf("answer: %+v %v", a, err)
	}
	if got, err := second(t, c); err != nil || got.Body != "yes, across" || got.TurnID != "turn-x" {
		t.Fatalf("alice got %+v %v", got, err)
	}
	_, err = bob.answer(sent.MsgID, "again")
	if fe := faultOf(t, err, fault.TooLate); fe.Kind != "too_late" {
		t.Fatalf("second answer: %v (%s)", fe, fe.Kind)
	}
}

// fleet-send --wait across hosts: the reply from h2 is handed to the open
// send on h1.
func TestCrossHostRendezvous(t *testing.T) {
	h1, h2 := twoHostsWith(t, nil)
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	c, sent := alice.sendWait("bob", "reply to my open send", 15_000)
	bob.collect("reply to my open send")
	r := bob.reply(sent.MsgID, "here it is")
	got, err := second(t, c)
	if err != nil || got.Body != "here it is" || got.MsgID != r.MsgID || got.TraceID != sent.TraceID {
		t.Fatalf("the open send got %+v %v", got, err)
	}
	alice.empty(h1.join("carol"))
}

// A message that dies on h2 tells its sender on h1: the record reads dead
// with the reason (a receipt), and a BOUNCE lands in the sender's inbox.
func TestCrossHostBounce(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"delivery-attempts": "2"})
	alice := h1.join("alice")
	h2.join("hook", api.JoinRequest{Mode: "inject", Exec: "echo nope >&2; exit 2"})
	h1.resolves("hook@h2")
	s := alice.mustSend("hook", "will die over there")
	rec, err := alice.waitFor(s.MsgID, "dead", 15_000)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != "dead" || rec.Attempts != 2 || !strings.Contains(rec.Reason, "delivery failed 2 times") {
		t.Fatalf("record on h1: %+v", rec)
	}
	// a bounce told by a receipt names the recipient as its host signed
	// it, hook@h2 — never its gid (issue 25.7)
	b := alice.collect(alice.bounceBody(s.MsgID, "hook@h2", rec.Reason))[0].Envelope
	if b.Kind != envelope.Bounce || b.InReplyTo != s.MsgID {
		t.Fatalf("bounce %+v", b)
	}
}

// A broadcast across hosts: one copy per member on every host, none for
// the sender.
func TestCrossHostBroadcast(t *testing.T) {
	h1, h2 := twoHostsWith(t, nil)
	main := h1.join("main", api.JoinRequest{Mode: "pull", Groups: []string{"crew"}})
	a := h1.join("a", api.JoinRequest{Mode: "pull", Groups: []string{"crew"}})
	b := h2.join("b", api.JoinRequest{Mode: "pull", Groups: []string{"crew"}})
	c := h2.join("c")
	h1.resolves("b@h2")
	h1.resolves("c@h2")
	resp, err := main.bcast("crew", "crew only")
	if err != nil || resp.Count != 1 {
		t.Fatalf("bcast: %+v %v", resp, err)
	}
	a.collect("crew only")
	b.collect("crew only")
	c.empty(b)
	main.empty(a)
}

// fleet-spawn and fleet-stop from h1 on h2, through the control plane:
// the request id is carried out once; the stopped entity is gone from
// h1's view at once.
func TestCrossHostSpawnStop(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"file": "profile.w.launcher = exec\nprofile.w.command = sleep 60\nprofile.w.grace = 0s\n"})
	main := h1.join("main")
	h2.join("other")
	h1.resolves("other@h2")
	sp, err := main.spawn(api.SpawnRequest{Name: "w9", Profile: "w", Host: "h2", RequestID: "cross-1", TimeoutMS: 15_000})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Host != "h2" || sp.Name != "w9" || sp.Mode != "pull" {
		t.Fatalf("spawned %+v", sp)
	}
	again, err := main.spawn(api.SpawnRequest{Name: "w9", Profile: "w", Host: "h2", RequestID: "cross-1", TimeoutMS: 15_000})
	if err != nil || again.Gid != sp.Gid {
		t.Fatalf("the same request again: %+v %v", again, err)
	}
	if r, ok := h2.rosterRow("w9"); !ok || r.Gid != sp.Gid {
		t.Fatalf("w9 on h2: %+v %v", r, ok)
	}
	s := main.mustSend("w9", "for w9 on h2") // resolves at once: learned from the answer
	st, err := main.stopEntity("w9@h2")
	if err != nil {
		t.Fatal(err)
	}
	if st.Host != "h2" || st.Gid != sp.Gid || !strings.HasPrefix(st.Process, "process group ") {
		t.Fatalf("stopped %+v", st)
	}
	_, err = main.send("w9@h2", "after the stop")
	faultOf(t, err, fault.NoRecipient)
	rec, err := main.waitFor(s.MsgID, "dead", 15_000)
	if err != nil {
		// delivered only if w9 read it, which it never does
		t.Fatal(err)
	}
	if rec.Reason != "recipient left the fleet" {
		t.Fatalf("record %+v", rec)
	}
	_, err = main.spawn(api.SpawnRequest{Name: "x", Profile: "w", Host: "h9", TimeoutMS: 5000})
	if fe := faultOf(t, err, fault.NoRecipient); fe.Kind != "unknown_host" {
		t.Fatalf("spawn on an unknown host: %v (%s)", fe, fe.Kind)
	}
}

// bounceBody is the text of the BOUNCE for msgID to "to".
func (e entity) bounceBody(msgID, to, reason string) string {
	return "your message " + msgID + " to " + to + " was dead-lettered: " + reason
}
