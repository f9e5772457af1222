package gateway

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// The deadLetters part alone (dlq.go), on the intake rig's store, with a
// real audit log: no broker and no admission (single-host mode).

func newDeadLettersRig(t *testing.T) (*intakeRig, *deadLetters, *audit.Log) {
	r := newIntakeRig(t)
	a, err := audit.Open(filepath.Join(t.TempDir(), "audit.log"), "h1", audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d := &deadLetters{host: "h1", stateDir: t.TempDir(), maxBody: 1 << 20,
		st: r.st, log: r.in.log, audit: a, reg: r.in.reg, caps: r.in.caps, in: r.in,
		br:    func() *broker.Broker { return nil },
		admit: func() *admission { return nil },
		ctx:   context.Background,
	}
	return r, d, a
}

// dies puts a message from → to into its inbox here and dead-letters it.
func (r *intakeRig) dies(from, to envelope.Party, body string) *envelope.Envelope {
	env := envelope.New(envelope.Send, from, to, body)
	if _, err := r.in.Accept(env); err != nil {
		r.t.Fatal(err)
	}
	if err := r.st.Kill(store.Key(env), "delivery failed", 1); err != nil {
		r.t.Fatal(err)
	}
	return env
}

func faultKind(t *testing.T, err error, kind fault.Kind) {
	t.Helper()
	if err == nil || fault.KindOf(err) != kind {
		t.Fatalf("got %v (%s), want %s", err, fault.KindOf(err), kind)
	}
}

// A local dead letter is delivered again once, under a new msg id that
// names it; the dead letter goes, a second replay sends that same
// replay (dropped by its msg id) and Known says what it was replayed as.
func TestDeadLettersReplayLocalOnce(t *testing.T) {
	r, d, _ := newDeadLettersRig(t)
	alice, carol := r.entity("alice"), r.entity("carol")
	orig := r.dies(alice, carol, "dies")
	if got := r.inbox(carol); len(got) != 0 {
		t.Fatalf("carol's inbox after the death: %q", got)
	}
	_, err := d.Replay(&api.ReplayRequest{MsgID: orig.MsgID, Known: true})
	faultKind(t, err, fault.KindUnknownMessage) // not replayed yet

	res, err := d.Replay(&api.ReplayRequest{MsgID: orig.MsgID})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Sent
	if s.ReplayOf != orig.MsgID || s.MsgID == orig.MsgID || s.Again || s.Gid != carol.Gid || s.State != store.Accepted {
		t.Fatalf("replay: %+v", s)
	}
	if got := r.inbox(carol); !slices.Equal(got, []string{"dies"}) {
		t.Fatalf("carol's inbox after the replay: %q", got)
	}
	if _, err := r.st.DeadLetter(orig.MsgID); err == nil {
		t.Fatal("the replayed dead letter is still there")
	}

	again, err := d.Replay(&api.ReplayRequest{MsgID: orig.MsgID})
	if err != nil {
		t.Fatal(err)
	}
	if again.Sent.MsgID != s.MsgID || !again.Sent.Again {
		t.Fatalf("a second replay: %+v, want %s again", again.Sent, s.MsgID)
	}
	if got := r.inbox(carol); len(got) != 1 {
		t.Fatalf("carol's inbox after a second replay: %q, want one copy", got)
	}
	known, err := d.Replay(&api.ReplayRequest{MsgID: orig.MsgID, Known: true})
	if err != nil {
		t.Fatal(err)
	}
	if k := known.Sent; k.MsgID != s.MsgID || k.ReplayOf != orig.MsgID || !k.Again || k.SenderGid != alice.Gid || k.State != store.Accepted {
		t.Fatalf("known: %+v", k)
	}
}

// What cannot be replayed from here is refused, and the dead letter
// stays: an unknown msg id, a recipient that left, a copy from bridge.dlq
// without a broker, a remote recipient without a broker.
func TestDeadLettersReplayRefused(t *testing.T) {
	r, d, _ := newDeadLettersRig(t)
	alice, carol := r.entity("alice"), r.entity("carol")
	_, err := d.Replay(&api.ReplayRequest{MsgID: envelope.NewID()})
	faultKind(t, err, fault.KindUnknownMessage)

	gone := r.dies(alice, carol, "to one who leaves")
	r.in.reg.Remove(carol.Gid)
	_, err = d.Replay(&api.ReplayRequest{MsgID: gone.MsgID})
	faultKind(t, err, fault.KindUnknownRecipient)
	if _, err := r.st.DeadLetter(gone.MsgID); err != nil {
		t.Fatalf("the dead letter went with a refused replay: %v", err)
	}
	if r.st.Replay(gone.MsgID, "h1") != nil {
		t.Fatal("a refused replay stays recorded")
	}

	raw, err := envelope.Encode(envelope.New(envelope.Send, alice, ibob, "from bridge.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Replay(&api.ReplayRequest{Raw: raw, SignedBy: "h1"})
	faultKind(t, err, fault.KindBrokerDown)

	// a remote recipient: only this host's own message, only with a broker
	toBob := envelope.New(envelope.Send, alice, ibob, "to h2")
	toBob.ReplayOf = envelope.NewID()
	faultKind(t, d.replayable(toBob), fault.KindBrokerDown)
	fromBob := envelope.New(envelope.Send, ibob, envelope.Party{Gid: gidH2, Host: "h2"}, "h2 to h2")
	fromBob.ReplayOf = envelope.NewID()
	faultKind(t, d.replayable(fromBob), fault.KindNotReplayable)
}

// Purge removes the dead letters named and counts them.
func TestDeadLettersPurge(t *testing.T) {
	r, d, _ := newDeadLettersRig(t)
	alice, carol := r.entity("alice"), r.entity("carol")
	_, err := d.Purge(&api.PurgeDeadRequest{})
	faultKind(t, err, fault.KindUsage)
	one, two := r.dies(alice, carol, "one"), r.dies(alice, carol, "two")
	res, err := d.Purge(&api.PurgeDeadRequest{MsgIDs: []string{one.MsgID, envelope.NewID()}})
	if err != nil || res.Count != 1 {
		t.Fatalf("purge: %+v %v, want 1", res, err)
	}
	if _, err := r.st.DeadLetter(one.MsgID); err == nil {
		t.Fatal("a purged dead letter is still there")
	}
	if _, err := r.st.DeadLetter(two.MsgID); err != nil {
		t.Fatalf("a dead letter not named went: %v", err)
	}
	_, err = d.Replay(&api.ReplayRequest{MsgID: one.MsgID})
	faultKind(t, err, fault.KindUnknownMessage)
}
