package gateway_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A message that expires in a broker inbox (its recipient's gateway away
// past inbox-ttl) is a death at its sender: the record on the sender's
// host reads dead with the broker's reason, that host lists the dead
// letter, the sender gets a BOUNCE, and bridge.dlq keeps the operators'
// copy. A dead letter in the deaths queue that the sender's gateway did not
// sign is not believed.
func TestCrossDeathInBrokerInbox(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"inbox-ttl": "2s"})
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	h2.stop()
	s := alice.mustSend(bob.Gid, "never taken")
	rec, err := alice.waitFor(s.MsgID, "dead", 30_000)
	if err != nil || rec.State != "dead" {
		t.Fatalf("record on h1: %+v %v", rec, err)
	}
	if rec.Reason != gateway.ReasonBrokerExpired {
		t.Fatalf("reason %q", rec.Reason)
	}
	var got []api.Delivery // the bounce is made just after the record reads dead
	eventually(t, "alice has her bounce", func() error {
		if got = append(got, alice.take(0)...); len(got) == 0 {
			return errors.New("nothing yet")
		}
		return nil
	})
	if len(got) != 1 || got[0].Envelope.Kind != envelope.Bounce || got[0].Envelope.InReplyTo != s.MsgID ||
		!strings.Contains(got[0].Envelope.Body, gateway.ReasonBrokerExpired) {
		t.Fatalf("alice got %+v", got)
	}
	dead := h1.must("", &api.DeadRequest{}).Dead
	// kept with its text opened (sealing.go, Plain): sealed on the wire
	if len(dead) != 1 || dead[0].Record.MsgID != s.MsgID || dead[0].Envelope == nil || dead[0].Envelope.Body != "never taken" {
		t.Fatalf("h1's dead letters: %+v", dead)
	}

	// the operators' copy, with the broker's death history
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// bridge.dlq may also hold what a loaded run refused (a presence
	// message late past its TTL): look through it for ours, unacked,
	// then give every one back
	var d amqp.Delivery
	for seen := 0; d.MessageId != s.MsgID; seen++ {
		var ok bool
		if d, ok, err = ch.Get(broker.QDLQ, false); err != nil || !ok || seen > 1000 {
			t.Fatalf("bridge.dlq has no copy of %s: %v %v (%d others)", s.MsgID, ok, err, seen)
		}
	}
	if xs, _ := d.Headers["x-death"].([]any); len(xs) == 0 || xs[0].(amqp.Table)["reason"] != "expired" {
		t.Fatalf("x-death %v", d.Headers["x-death"])
	}
	if _, leaked := d.Headers["BCC"]; leaked {
		t.Fatalf("the BCC header reached a queue: %v", d.Headers)
	}
	_ = d.Nack(true, true)

	// h2 back: bob never got it (it expired). Replayed twice — from
	// bridge.dlq on h2 (bob's host: h1's signature proves it) and from
	// h1's own dead letter — it reaches bob once: his store takes one
	// replay per original message
	h2.start()
	sig, _ := base64.StdEncoding.DecodeString(d.Headers["fleet-sig"].(string))
	r2, err := h2.call("", &api.ReplayRequest{Raw: d.Body, Sig: sig, SignedBy: "h1"})
	if err != nil || r2.Sent.ReplayOf != s.MsgID {
		t.Fatalf("replay on h2: %+v %v", r2, err)
	}
	r1, err := h1.call("", &api.ReplayRequest{MsgID: s.MsgID})
	if err != nil || r1.Sent.ReplayOf != s.MsgID || r1.Sent.MsgID == r2.Sent.MsgID {
		t.Fatalf("replay on h1: %+v %v", r1, err)
	}
	h2.waitLog("duplicate msg id: not stored again")
	bob.collect("never taken")
	bob.empty(alice)

	// a message taken there but not yet read stays accepted on h1
	// whatever a forged death says
	s2 := alice.mustSend(bob.Gid, "taken on h2")
	fake := envelope.New(envelope.Send, envelope.Party{Gid: alice.Gid, Name: "alice", Host: "h1"},
		envelope.Party{Gid: bob.Gid, Name: "bob", Host: "h2"}, "taken on h2")
	fake.MsgID, fake.TraceID = s2.MsgID, s2.TraceID
	raw, err := envelope.Encode(fake)
	if err != nil {
		t.Fatal(err)
	}
	err = ch.PublishWithContext(context.Background(), "", broker.DeathsQueue("h1"), false, false, amqp.Publishing{
		Body: raw,
		Headers: amqp.Table{"fleet-host": "h1", "fleet-sig": "AAAA",
			"x-death": []any{amqp.Table{"queue": broker.InboxQueue(bob.Gid), "reason": "expired", "count": int64(1)}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h1.waitLog("a dead letter in this host's deaths queue that this host did not sign: ignored")
	if r := alice.record(s2.MsgID); r.State != "accepted" {
		t.Fatalf("a forged death moved the record: %+v", r)
	}
	bob.collect("taken on h2")
	alice.waitState(s2.MsgID, "delivered")
}

// A message refused by a full broker inbox (reject-publish) is dead at its
// sender too: the call fails with 75, and the record, the dead letter and
// a BOUNCE say so.
func TestCrossOverflowDeadAtSender(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"inbox-max-length": "1"})
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	h2.stop()
	alice.mustSend(bob.Gid, "fills it")
	_, err := alice.send(bob.Gid, "one too many")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull {
		t.Fatalf("second send: %v (%s)", fe, fe.Kind)
	}
	var got []api.Delivery // the bounce is made just after the record reads dead
	eventually(t, "alice has her bounce", func() error {
		if got = append(got, alice.take(0)...); len(got) == 0 {
			return errors.New("nothing yet")
		}
		return nil
	})
	if len(got) != 1 || got[0].Envelope.Kind != envelope.Bounce || !strings.Contains(got[0].Envelope.Body, "inbox full") {
		t.Fatalf("alice got %+v", got)
	}
	rec := alice.record(got[0].Envelope.InReplyTo)
	if rec.State != "dead" || !strings.Contains(rec.Reason, "inbox full") {
		t.Fatalf("record %+v", rec)
	}
	dead := h1.must("", &api.DeadRequest{}).Dead
	if len(dead) != 1 || dead[0].Envelope == nil || dead[0].Envelope.Body != "one too many" {
		t.Fatalf("h1's dead letters: %+v", dead)
	}

	// fleet-dlq replay while the inbox is still full: refused (75), and
	// nothing new — no second dead letter, no second bounce; the dead
	// letter stays to be replayed later
	id := dead[0].Record.MsgID
	_, err = h1.call("", &api.ReplayRequest{MsgID: id})
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull {
		t.Fatalf("replay into a full inbox: %v (%s)", fe, fe.Kind)
	}
	if d := h1.must("", &api.DeadRequest{}).Dead; len(d) != 1 || d[0].Record.MsgID != id {
		t.Fatalf("after a refused replay, h1's dead letters: %+v", d)
	}
	// room again (h2 takes its inbox in): the replay is delivered, once
	h2.start()
	bob.collect("fills it")
	r, err := h1.call("", &api.ReplayRequest{MsgID: id})
	if err != nil || r.Sent.ReplayOf != id || r.Sent.Again {
		t.Fatalf("replay: %+v %v", r, err)
	}
	// asked again: the same envelope once more, which bob's gateway drops
	again, err := h1.call("", &api.ReplayRequest{MsgID: id})
	if err != nil || !again.Sent.Again || again.Sent.MsgID != r.Sent.MsgID {
		t.Fatalf("a second replay: %+v %v", again, err)
	}
	got = bob.collect("one too many")
	if got[0].Envelope.ReplayOf != id || got[0].Envelope.MsgID != r.Sent.MsgID {
		t.Fatalf("bob got %+v", got[0].Envelope)
	}
	alice.empty(bob) // no second bounce, nothing else
	bob.empty(alice) // and bob got the replay once
}

// A local inbox is capped with a broker configured too (inboxcap.go). A
// same-host send over the cap is refused at once (75), never published.
// Mail from another host that finds the local inbox full is not taken
// (back-pressure): the broker holds it, in the recipient's broker inbox,
// and once that is full too the broker refuses the next publish, so its
// sender hears 75 at once. When the local inbox drains, the held mail is
// taken in and delivered: nothing the broker confirmed died.
func TestCrossHeldPastLocalCap(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"inbox-max-length": "1"})
	alice, bob, dave := h1.join("alice"), h2.join("bob"), h2.join("dave")
	h1.resolves("bob@h2")
	const reason = "inbox full: the recipient's inbox holds inbox-max-length (1) messages"

	// same host, with a broker: the local cap
	dave.mustSend("bob", "from dave")
	_, err := dave.send("bob", "dave again")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull || !strings.Contains(fe.Msg, "the inbox of bob@h2 is full") {
		t.Fatalf("same-host send over the cap: %v (%s)", fe, fe.Kind)
	}
	eventually(t, "dave has his bounce", func() error {
		for _, d := range dave.take(0) {
			if d.Envelope.Kind == envelope.Bounce && strings.HasSuffix(d.Envelope.Body, reason) {
				return nil
			}
		}
		return errors.New("no bounce yet")
	})

	// from another host: confirmed by the broker, held there
	held := alice.mustSend("bob@h2", "held by the broker")
	eventually(t, "h2 holds bob's broker inbox", func() error {
		if h2.logCount("local inbox full: not taking from its broker inbox") == 0 {
			return errors.New("not said yet")
		}
		return nil
	})
	// h2 gave the delivery back (a nack, which the broker takes in its own
	// time): the broker inbox holds it once its depth says so
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "bob's broker inbox holds the message", func() error {
		q, err := ch.QueueDeclarePassive(broker.InboxQueue(bob.Gid), true, false, false, false, nil)
		if err != nil {
			return err
		}
		if q.Messages != 1 {
			return fmt.Errorf("%d ready in bob's broker inbox", q.Messages)
		}
		return nil
	})
	// the broker inbox (cap 1) holds it: the next send is refused at once
	_, err = alice.send("bob@h2", "one too many")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull || !strings.Contains(fe.Msg, "the broker refused the message") {
		t.Fatalf("a send to a full broker inbox: %v (%s)", fe, fe.Kind)
	}
	if rec := alice.record(held.MsgID); rec.State != "accepted" {
		t.Fatalf("alice's held message: %+v", rec)
	}
	// bob reads: the held message comes in, and is delivered once
	bob.collect("from dave")
	bob.collect("held by the broker")
	alice.waitState(held.MsgID, "delivered")
	bob.empty(alice)
	if n := h2.logCount("local inbox full: not taking from its broker inbox"); n != 1 { // once while it stays full
		t.Fatalf("h2 said %d times that bob's inbox is full", n)
	}
	if n := h2.logCount("taking from its broker inbox again"); n != 1 {
		t.Fatalf("h2 said %d times that it takes from bob's broker inbox again", n)
	}
}
