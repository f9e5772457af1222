package gateway_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A name never gives a false "no such recipient" (67): h1 keeps the last
// gid it heard for every remote name, across its own restart and while the
// name's host is away, and lets the broker's mandatory routing decide. 67
// comes only when the broker has no inbox for that gid (then the name is
// forgotten) or the name was never known.
func TestCrossNamesKeptWhileHostAway(t *testing.T) {
	h1, h2 := twoHosts(t)
	carol := h1.join("carol")
	bob := h2.join("bob")
	ann := h2.join("ann")
	h1.resolves("bob@h2")
	h1.resolves("ann@h2")
	h2.stop()

	// h1 restarts while h2 is away: bob and ann are known before h2 is
	// heard again, as "unknown"
	h1.restart()
	if r := h1.rowOf("bob", "h2"); r == nil || r.Gid != bob.Gid || r.Status != "unknown" {
		t.Fatalf("bob@h2 on h1 after its restart: %+v", r)
	}
	s1 := carol.mustSend("bob", "one")
	s2 := carol.mustSend("bob@h2", "two")
	if s1.Gid != bob.Gid || s2.Gid != bob.Gid {
		t.Fatalf("bob resolved to %s, %s", s1.Gid, s2.Gid)
	}

	// ann's inbox is deleted while h2 is away (an operator, or h2's state
	// lost): the broker returns the message unroutable, that is 67, and
	// h1 forgets the name
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(broker.InboxQueue(ann.Gid), false, false, false); err != nil {
		t.Fatal(err)
	}
	_, err = carol.send("ann", "anyone?")
	if fe := faultOf(t, err, fault.NoRecipient); fe.Kind != fault.KindUnknownRecipient {
		t.Fatalf("send to ann with her inbox gone: %v (%s)", fe, fe.Kind)
	}
	if r := h1.rowOf("ann", "h2"); r != nil {
		t.Fatalf("ann@h2 still listed after the broker had no inbox for her: %+v", r)
	}
	// not known now: 67 once h1's roster settled (75 until then)
	eventuallyWithin(t, 10*time.Second, "ann is unknown", func() error {
		_, err := carol.send("ann", "again")
		if fault.KindOf(err) == fault.KindRosterSettling {
			return err
		}
		faultOf(t, err, fault.NoRecipient)
		return nil
	})

	// h2 comes back: bob has both, once each, in order
	h2.start()
	bob.collect("one", "two")
	carol.waitState(s2.MsgID, "delivered")
}

// Right after connecting, a gateway has not heard every host yet: a name
// it knows nothing of is 75 "roster not settled" (try again), not 67,
// while a trusted host it could be on was not heard since (h2 here never
// runs) and one and a half presence intervals have not passed; then 67. A
// name on this host, or on a host not trusted, is 67 at once. (With the
// broker down it is 69: TestLocalBrokerDownRemoteRefused.)
func TestCrossUnknownNameWhileRosterFills(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := &testGW{t: t, Host: "h1", logs: &syncBuffer{},
		Cfg: newConfig(t, dir, "h1", settings{"broker": url, "presence-interval": "10s"})}
	h2 := newConfigOnly(t, dir, "h2", url)
	enrol(t, h1, h2)
	h1.start()
	t.Cleanup(h1.stop)
	carol := h1.join("carol")
	_, err := carol.send("nobody", "hello?")
	fe := faultOf(t, err, fault.TempFail)
	if fe.Kind != fault.KindRosterSettling || fe.Hint == "" {
		t.Fatalf("unknown name right after connecting: %v (%s)", fe, fe.Kind)
	}
	_, err = carol.send("nobody@h2", "hello?")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindRosterSettling {
		t.Fatalf("unknown name on a trusted host not heard yet: %v (%s)", fe, fe.Kind)
	}
	// a name of this host is exact, and one on a host not trusted can
	// never be heard: 67 at once, settling or not
	_, err = carol.send("nobody@h1", "hello?")
	faultOf(t, err, fault.NoRecipient)
	_, err = carol.send("nobody@h9", "hello?")
	faultOf(t, err, fault.NoRecipient)
	eventuallyWithin(t, 30*time.Second, "an unknown name is 67 once the roster settled", func() error {
		_, err := carol.send("nobody", "hello?")
		if fault.CodeOf(err) == fault.NoRecipient {
			return nil
		}
		if fault.KindOf(err) != fault.KindRosterSettling {
			t.Fatalf("unknown name: %v", err)
		}
		return errors.New("still settling")
	})
}
