package gateway_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/trust"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A fleet-recv batch from several senders of one host is settled by one
// RECEIPT to that host: each sender's record reads delivered. Its first
// sender left meanwhile, so the receipt addressed to her is unroutable:
// the others are told again without her, in one more receipt.
func TestCrossReceiptsCoalesced(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, carol, dave := h1.join("alice"), h1.join("carol"), h1.join("dave")
	bob := h2.join("bob")
	h1.resolves("bob@h2")
	var sent []*api.Sent
	for _, e := range []entity{alice, carol, dave} {
		for i := range 2 {
			sent = append(sent, e.mustSend("bob@h2", fmt.Sprintf("from %s %d", e.Name, i)))
		}
	}
	eventually(t, "bob's inbox has all six", func() error {
		if r, _ := h2.rosterRow("bob"); r.Pending != len(sent) {
			return fmt.Errorf("%d pending", r.Pending)
		}
		return nil
	})
	h1.must("", &api.LeaveRequest{Name: "alice"})
	got := bob.recv()
	if len(got) != len(sent) {
		t.Fatalf("one batch of %d, got %d: %v", len(sent), len(got), bodies(got))
	}
	for i, s := range sent[2:] {
		from := carol
		if i >= 2 {
			from = dave
		}
		from.waitState(s.MsgID, "delivered")
	}
	eventually(t, "h2 says why alice's receipt did not go", func() error {
		if h2.logCount("receipt not sent") != 1 || h2.logCount(`"messages":2`) != 1 {
			return errors.New(h2.logs.String())
		}
		return nil
	})
}

// Each message a receipt settles must have gone from here to the
// receipt's sender: a receipt h2 signs from bob that also settles alice's
// message to bert is refused whole, and one for bob's message alone is
// believed.
func TestCrossReceiptItemsChecked(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice := h1.join("alice")
	bob := h2.join("bob")
	h2.join("bert")
	h1.resolves("bob@h2")
	h1.resolves("bert@h2")
	toBob := alice.mustSend("bob@h2", "one")
	toBert := alice.mustSend("bert@h2", "two")

	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	key, err := trust.HostKey(h2.Cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	receipt := func(more string) { // as h2's gateway makes and signs one
		t.Helper()
		at := time.Now().UTC().Format(time.RFC3339Nano)
		body := fmt.Sprintf(`{"msg_id":%q,"state":"delivered","attempts":1,"at":%q%s}`, toBob.MsgID, at, more)
		r := envelope.New(envelope.Receipt, envelope.Party{Gid: bob.Gid, Name: "bob", Host: "h2"},
			envelope.Party{Gid: alice.Gid, Name: "alice", Host: "h1"}, body)
		r.InReplyTo = toBob.MsgID
		wire, err := envelope.Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		sig := base64.StdEncoding.EncodeToString(ed25519.Sign(key, wire))
		if err := ch.Publish(broker.ExMsg, alice.Gid, false, false, amqp.Publishing{Body: wire,
			Headers: amqp.Table{"fleet-host": "h2", "fleet-sig": sig}}); err != nil {
			t.Fatal(err)
		}
	}
	receipt(fmt.Sprintf(`,"more":[{"msg_id":%q,"sender":%q,"state":"delivered","attempts":1,"at":%q}]`,
		toBert.MsgID, alice.Gid, time.Now().UTC().Format(time.RFC3339Nano)))
	eventually(t, "h1 refuses the receipt", func() error {
		if h1.logCount("which is not its recipient") != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	for _, s := range []*api.Sent{toBob, toBert} {
		if st := alice.record(s.MsgID).State; st == "delivered" {
			t.Fatalf("%s settled by a refused receipt", s.MsgID)
		}
	}
	receipt("")
	alice.waitState(toBob.MsgID, "delivered")
	if st := alice.record(toBert.MsgID).State; st == "delivered" {
		t.Fatalf("bert's message settled by bob's receipt")
	}
}
