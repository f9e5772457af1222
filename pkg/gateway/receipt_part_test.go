package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/store"
)

// The receipts part alone (receipt.go), on the intake rig's store: no
// broker (what it would publish is another host's business), so what is
// tested is what this host does with a settled message and a receipt.

func newReceiptsRig(t *testing.T) (*intakeRig, *receipts) {
	r := newIntakeRig(t)
	rc := &receipts{host: "h1", st: r.st, log: r.in.log, reg: r.in.reg, in: r.in, side: &tasks{},
		ctx:      context.Background,
		answered: func(string, string) error { return nil },
		named:    func(rec *store.Record) string { return rec.Recipient },
	}
	return r, rc
}

// A local message that died bounces to its sender's inbox, and the record
// change is signalled.
func TestReceiptsBounceHere(t *testing.T) {
	r, rc := newReceiptsRig(t)
	alice, carol := r.entity("alice"), r.entity("carol")
	env := envelope.New(envelope.Send, alice, carol, "hi")
	changed := rc.Changed()
	rc.Settled(env, store.Dead, "delivery failed", 3)
	select {
	case <-changed:
	default:
		t.Fatal("a settled message did not signal a record change")
	}
	got := r.inbox(alice)
	if len(got) != 1 || got[0] != "your message "+env.MsgID+" to carol@h1 was dead-lettered: delivery failed" {
		t.Fatalf("alice's inbox %q, want the bounce", got)
	}
	rc.Settled(envelope.New(envelope.Send, alice, carol, "ok"), store.Delivered, "", 1)
	if got := r.inbox(alice); len(got) != 1 {
		t.Fatalf("a delivered message bounced: %q", got)
	}
}

// A receipt settles an outbound record only from the message's recipient;
// a dead one bounces to the sender.
func TestReceiptsTake(t *testing.T) {
	r, rc := newReceiptsRig(t)
	alice := r.entity("alice")
	sent := envelope.New(envelope.Send, alice, ibob, "to bob")
	if err := r.st.RecordOutboundStart(sent, time.Now().UTC())(); err != nil {
		t.Fatal(err)
	}
	receipt := func(from envelope.Party, state string) *envelope.Envelope {
		body, _ := json.Marshal(receiptBody{MsgID: sent.MsgID, State: state, Reason: "why", Attempts: 1, At: time.Now().UTC()})
		env := envelope.New(envelope.Receipt, from, alice, string(body))
		env.InReplyTo = sent.MsgID
		return env
	}
	var refusal *broker.Refusal
	mallory := ibob
	mallory.Gid = "h3.0190aaaa-0000-7000-8000-000000000009"
	if err := rc.Take(receipt(mallory, store.Delivered)); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonWrongHost {
		t.Fatalf("a receipt from another entity: %v, want a wrong-host refusal", err)
	}
	if err := rc.Take(receipt(ibob, "lost")); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonMalformed {
		t.Fatalf("a receipt with an unknown state: %v, want malformed", err)
	}
	if rec, _ := r.st.Record(sent.MsgID); rec.State != store.Accepted {
		t.Fatalf("after refused receipts: %s, want accepted", rec.State)
	}
	if err := rc.Take(receipt(ibob, store.Dead)); err != nil {
		t.Fatal(err)
	}
	if rec, _ := r.st.Record(sent.MsgID); rec.State != store.Dead {
		t.Fatalf("after bob's receipt: %s, want dead", rec.State)
	}
	if got := r.inbox(alice); len(got) != 1 {
		t.Fatalf("alice's inbox %q, want the bounce of her dead message", got)
	}
}
