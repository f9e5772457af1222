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
	if err := l.Send(env); err != nil {
		t.Fatalf("hop 3 of max 3 refused: %v", err)
	}
	if err := l.Arrival(env); err != nil {
		t.Fatalf("hop 3 of max 3 refused on arrival: %v", err)
	}
	env.Hops = 4
	err := l.Send(env)
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
	if none.Send(env) != nil || none.Arrival(env) != nil {
		t.Error("no guard cut a message")
	}
}
