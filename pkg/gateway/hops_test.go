package gateway

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// A cause is believed only from this host's record of it, and only when
// that names the caller as its recipient (a broadcast copy: the member's
// record).
func TestDeliveredToNamesTheCaller(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, e := range []*store.Entity{{Gid: "h1.a", Name: "a", Host: "h1"}, {Gid: "h1.b", Name: "b", Host: "h1"}} {
		if err := st.CreateEntity(e); err != nil {
			t.Fatal(err)
		}
	}
	env := envelope.New(envelope.Send, envelope.Party{Gid: "h1.a", Name: "a", Host: "h1"}, envelope.Party{Gid: "h1.b", Name: "b", Host: "h1"}, "hi")
	env.Hops = 4
	if _, _, err := st.Accept(env, time.Now()); err != nil {
		t.Fatal(err)
	}
	bc := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.a", Name: "a", Host: "h1"}, envelope.Party{Gid: "h1.b", Group: "all"}, "all")
	bc.Hops = 2
	if _, _, err := st.Accept(bc, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := deliveredTo(st, env.MsgID, "h1.b"); r == nil || r.Hops != 4 || r.TraceID != env.TraceID {
		t.Errorf("the recipient's cause: %+v; want hops 4 in its trace", r)
	}
	if r := deliveredTo(st, bc.MsgID, "h1.b"); r == nil || r.Hops != 2 {
		t.Errorf("a member's broadcast copy: %+v; want hops 2", r)
	}
	for _, c := range []struct{ id, gid string }{
		{env.MsgID, "h1.a"}, // its sender: not given it
		{env.MsgID, "h1.c"},
		{envelope.NewID(), "h1.b"}, // no record here
		{"", "h1.b"},
		{"not an id/../x", "h1.b"},
	} {
		if r := deliveredTo(st, c.id, c.gid); r != nil {
			t.Errorf("deliveredTo(%q, %q) = %+v; want nil", c.id, c.gid, r)
		}
	}
}

// Past max-hops, and only past it: a local send is 77 loop, one from
// another host a refusal with reason loop; other kinds pass on arrival.
func TestLoopGuardCuts(t *testing.T) {
	l := &loopGuard{max: 3, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	env := envelope.New(envelope.Reply, envelope.Party{Gid: "h2.a", Name: "a", Host: "h2"}, envelope.Party{Gid: "h1.b", Name: "b", Host: "h1"}, "x")
	env.Hops = 3
	if err := l.Send(env, nil); err != nil {
		t.Fatalf("hop 3 of max 3 refused: %v", err)
	}
	if err := l.Arrival(env); err != nil {
		t.Fatalf("hop 3 of max 3 refused on arrival: %v", err)
	}
	env.Hops = 4
	err := l.Send(env, nil)
	if fault.CodeOf(err) != fault.Refused || fault.KindOf(err) != fault.KindLoop {
		t.Fatalf("hop 4 of max 3: %v; want 77 loop", err)
	}
	var r *broker.Refusal
	if err := l.Arrival(env); !errors.As(err, &r) || r.Reason != broker.ReasonLoop {
		t.Fatalf("hop 4 of max 3 on arrival: %v; want a refusal, reason loop", err)
	}
	env.Kind = envelope.Receipt // the gateways' own notices are never cut
	if err := l.Arrival(env); err != nil {
		t.Errorf("a receipt cut: %v", err)
	}
	var none *loopGuard
	env.Kind = envelope.Send
	if none.Send(env, nil) != nil || none.Arrival(env) != nil {
		t.Error("no guard cut a message")
	}
}

// told records the NOTICEs a loop guard gives.
type told struct{ to []string }

func (t *told) LoopNotice(gid string, cut *envelope.Envelope, text string) bool {
	t.to = append(t.to, gid+": "+text)
	return gid != "h9.gone" // not an entity of this host
}

// A cut tells the other party: at a send the parent's sender, on arrival
// the sender of the message it replies to by this host's record, else
// its recipient; never the cut message's own sender, and a notice only
// once per cut.
func TestLoopCutTellsTheOtherParty(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tell := &told{}
	l := &loopGuard{max: 3, log: slog.New(slog.NewTextHandler(io.Discard, nil)), st: st, tell: tell}
	a := envelope.Party{Gid: "h1.a", Name: "a", Host: "h1"}
	b := envelope.Party{Gid: "h1.b", Name: "b", Host: "h1"}
	c := envelope.Party{Gid: "h2.c", Name: "c", Host: "h2"}
	env := envelope.New(envelope.Send, a, b, "x")
	env.Hops = 4
	// at a send: the parent's sender
	if err := l.Send(env, &store.Record{Sender: "h1.d"}); fault.KindOf(err) != fault.KindLoop {
		t.Fatalf("cut: %v", err)
	}
	if len(tell.to) != 1 || tell.to[0][:6] != "h1.d: " {
		t.Fatalf("told %q; want h1.d once", tell.to)
	}
	want := "loop cut: send " + env.MsgID + " from a@h1 to b@h1, hop 4 of trace " + env.TraceID + ", is past max-hops 3 and was not delivered"
	if got := tell.to[0][6:]; len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("notice %q; want it to start %q", got, want)
	}
	// the parent's sender is the cut message's sender, or none: nobody
	tell.to = nil
	_ = l.Send(env, &store.Record{Sender: "h1.a"})
	_ = l.Send(env, nil)
	_ = l.Send(env, &store.Record{})
	if len(tell.to) != 0 {
		t.Errorf("told %q; want nobody", tell.to)
	}
	// on arrival: the sender of what it replies to, by this host's record
	orig := envelope.New(envelope.Send, b, c, "orig")
	if err := st.RecordOutbound(orig, time.Now()); err != nil {
		t.Fatal(err)
	}
	rep := envelope.New(envelope.Reply, c, envelope.Party{Gid: "h1.e", Name: "e", Host: "h1"}, "re")
	rep.InReplyTo, rep.Hops = orig.MsgID, 4
	if err := l.Arrival(rep); err == nil {
		t.Fatal("hop 4 came in")
	}
	// else its recipient here (an answer's asker; a loop of two)
	ans := envelope.New(envelope.Answer, c, a, "42")
	ans.InReplyTo, ans.Hops = envelope.NewID(), 4
	if err := l.Arrival(ans); err == nil {
		t.Fatal("an answer at hop 4 came in")
	}
	bc := envelope.New(envelope.Broadcast, c, envelope.Party{Gid: "h1.f", Group: "ops"}, "all")
	bc.Hops = 4
	if err := l.Arrival(bc); err == nil {
		t.Fatal("a broadcast copy at hop 4 came in")
	}
	var to []string
	for _, s := range tell.to {
		to = append(to, s[:4])
	}
	if len(to) != 3 || to[0] != "h1.b" || to[1] != "h1.a" || to[2] != "h1.f" {
		t.Errorf("told %q; want h1.b (the replied-to's sender), h1.a (the asker), h1.f (the member)", tell.to)
	}
}
