package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Each gateway runs with its own broker login (harness: newConfig), and
// the broker itself refuses what one host's login has no business doing
// to another host's traffic (pkg/broker/provision.go). Here h1's login is
// the attacker's: with h2 down and a message for bob confirmed into bob's
// broker inbox, nothing h1's login tries reads, takes, copies or forges it;
// bob gets it exactly once when h2 is back.
func TestCrossLeastPrivilege(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, bob := h1.join("alice"), h2.join("bob")
	h2.stop()
	alice.mustSend(bob.Gid, "for bob only")
	bobQ, aliceQ := broker.InboxQueue(bob.Gid), broker.InboxQueue(alice.Gid)

	conn, err := amqp.Dial(h1.Cfg.Broker)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	refused := func(what string, f func(ch *amqp.Channel) error) {
		t.Helper()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		err = f(ch)
		if err == nil { // a refused publish closes the channel after the fact
			_, err = ch.QueueDeclarePassive(broker.QDLQ, true, false, false, false, nil)
		}
		if errors.Is(err, amqp.ErrClosed) { // closed first: by what
			select {
			case ce := <-closed:
				if ce != nil {
					err = ce
				}
			case <-time.After(5 * time.Second):
			}
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			t.Errorf("%s with h1's login: %v, want ACCESS_REFUSED", what, err)
		}
		if !ch.IsClosed() {
			ch.Close()
		}
	}
	refused("consume bob's inbox", func(ch *amqp.Channel) error {
		_, err := ch.Consume(bobQ, "", false, false, false, false, nil)
		return err
	})
	refused("get from bob's inbox", func(ch *amqp.Channel) error { _, _, err := ch.Get(bobQ, false); return err })
	refused("purge bob's inbox", func(ch *amqp.Channel) error { _, err := ch.QueuePurge(bobQ, false); return err })
	refused("delete bob's inbox", func(ch *amqp.Channel) error { _, err := ch.QueueDelete(bobQ, false, false, false); return err })
	refused("bind bob's inbox", func(ch *amqp.Channel) error { return ch.QueueBind(bobQ, alice.Gid, broker.ExMsg, false, nil) })
	for _, key := range []string{"#", "*.*", bob.Gid, "h2.*", "broadcast.*", "broadcast.#"} {
		refused("bind h1's own inbox to bridge.msg with "+key, func(ch *amqp.Channel) error {
			return ch.QueueBind(aliceQ, key, broker.ExMsg, false, nil)
		})
	}
	refused("bind control.h1 to h2's control key", func(ch *amqp.Channel) error {
		return ch.QueueBind(broker.ControlQueue("h1"), "h2", broker.ExControl, false, nil)
	})
	refused("read bridge.dlq", func(ch *amqp.Channel) error { _, _, err := ch.Get(broker.QDLQ, false); return err })
	refused("publish a dead letter as h2", func(ch *amqp.Channel) error {
		return ch.Publish(broker.ExMsg, broker.DeadKey("h2"), false, false, amqp.Publishing{Body: []byte("{}")})
	})
	refused("publish presence as h2", func(ch *amqp.Channel) error {
		return ch.Publish(broker.ExRoster, "roster.h2.presence", false, false, amqp.Publishing{Body: []byte("{}")})
	})
	refused("publish straight into bob's inbox", func(ch *amqp.Channel) error {
		return ch.Publish("", bobQ, false, false, amqp.Publishing{Body: []byte("{}")})
	})
	for _, q := range []string{"sniffer", "agent.h2.0c0ffee0-0000-4000-8000-000000000000.inbox", "control.h2", "roster.h2", "deaths.h2"} {
		refused("declare queue "+q, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, false, true, false, false, nil)
			return err
		})
	}
	for _, key := range []string{broker.SenderKey("h2"), broker.SenderKey("h1"), bob.Gid, ""} {
		refused("publish to bridge.dead with "+key, func(ch *amqp.Channel) error {
			return ch.Publish(broker.ExDead, key, false, false, amqp.Publishing{Body: []byte("{}")})
		})
	}
	for _, key := range []string{broker.SenderKey("h2"), "#", "fleet.sender.*", bob.Gid} {
		refused("bind deaths.h1 to bridge.dead with "+key, func(ch *amqp.Channel) error {
			return ch.QueueBind(broker.DeathsQueue("h1"), key, broker.ExDead, false, nil)
		})
	}
	refused("consume deaths.h2", func(ch *amqp.Channel) error {
		_, err := ch.Consume(broker.DeathsQueue("h2"), "", false, false, false, false, nil)
		return err
	})
	refused("copy all of bridge.msg into bridge.dead", func(ch *amqp.Channel) error {
		return ch.ExchangeBind(broker.ExDead, "#", broker.ExMsg, false, nil)
	})
	refused("declare bridge.msg", func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(broker.ExMsg, "topic", true, false, false, false, nil)
	})
	refused("delete bridge.msg", func(ch *amqp.Channel) error { return ch.ExchangeDelete(broker.ExMsg, false, false) })

	// What exchange-to-exchange bindings it may still make lead nowhere: a
	// heartbeat copied into bridge.msg keeps its roster.* key, which no
	// inbox and not bridge.dlq (fleet.dead.*) is bound to.
	ch0, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch0.ExchangeBind(broker.ExMsg, "roster.#", broker.ExRoster, false, nil); err != nil {
		t.Fatalf("bridge.msg bound to bridge.roster: %v (fleet-broker(7) says a login may)", err)
	}
	// and into bridge.dead, bound to bridge.dlq only by two-word keys
	if err := ch0.ExchangeBind(broker.ExDead, "roster.#", broker.ExRoster, false, nil); err != nil {
		t.Fatalf("bridge.dead bound to bridge.roster: %v (fleet-broker(7) says a login may)", err)
	}
	ch0.Close()

	// What the login still sees (fleet-broker(7): BROKER LOGINS): a passive declare
	// needs no permission in RabbitMQ, so it tells a queue's existence and
	// depth — not its content.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if q, err := ch.QueueDeclarePassive(bobQ, true, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Errorf("passive declare of bob's inbox: %+v %v (fleet-broker(7) says it shows the depth)", q, err)
	}
	conn.Close()

	h2.start()
	eventually(t, "bob's message", func() error {
		if got := bodies(bob.recv()); len(got) != 1 || got[0] != "for bob only" {
			return errors.New("not yet")
		}
		return nil
	})
	// nothing more: once h2 has heard h1's presence (the heartbeats the
	// bindings above would copy), a sentinel from alice is the next and
	// only thing bob gets
	eventually(t, "h1's presence on h2", func() error {
		for _, r := range h2.must("", &api.RosterRequest{}).Entities {
			if r.Name == "alice" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	alice.mustSend(bob.Gid, "sentinel")
	var more []string
	eventually(t, "the sentinel", func() error {
		more = append(more, bodies(bob.recv())...)
		if len(more) == 0 || more[len(more)-1] != "sentinel" {
			return errors.New("not yet")
		}
		return nil
	})
	if len(more) != 1 {
		t.Fatalf("bob got more: %v", more)
	}
	// h2's announcements crossed bridge.roster, bound into bridge.dead
	// above: none reached the operators' queue
	admin, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ach, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if q, err := ach.QueueDeclarePassive(broker.QDLQ, true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Errorf("bridge.dlq after heartbeats through bridge.dead: %+v %v", q, err)
	}
}

// An operator's login reads the dead letters in bridge.dlq and nothing
// of any inbox.
func TestCrossOperatorLogin(t *testing.T) {
	_, h2 := twoHosts(t)
	bob := h2.join("bob")
	op, err := testnode.Provision(brokerURL(t), func(vhost string) broker.Grant { return broker.OperatorGrant(vhost, "ops") })
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(op)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ch.Get(broker.QDLQ, false); err != nil {
		t.Fatalf("operator get from bridge.dlq: %v", err)
	}
	// replay (a publish to a recipient's gid) and purge are its to do
	if err := ch.Publish(broker.ExMsg, bob.Gid, true, false, amqp.Publishing{Body: []byte("{}")}); err != nil {
		t.Fatalf("operator publish to bob's gid: %v", err)
	}
	if _, err := ch.QueuePurge(broker.QDLQ, false); err != nil {
		t.Fatalf("operator purge of bridge.dlq: %v", err)
	}
	_, _, err = ch.Get(broker.InboxQueue(bob.Gid), false)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		t.Errorf("operator get from bob's inbox: %v, want ACCESS_REFUSED", err)
	}
	// (bob's gateway refuses that unsigned "replay", as it must)
}

// Rotation (fleet-gw broker-setup again): the running gateway keeps its
// connection, and restarted with the new URI it works; the old password no
// longer logs in.
func TestCrossLoginRotated(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, bob := h1.join("alice"), h2.join("bob")
	old := h1.Cfg.Broker
	rotated, err := testnode.Provision(brokerURL(t), func(vhost string) broker.Grant { return broker.HostGrant(vhost, "h1") })
	if err != nil {
		t.Fatal(err)
	}
	if rotated == old {
		t.Fatal("provisioning again kept the password")
	}
	alice.mustSend(bob.Gid, "before the restart")
	if _, err := amqp.Dial(old); !errors.Is(err, amqp.ErrCredentials) {
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			t.Errorf("the old password still logs in: %v", err)
		}
	}
	h1.stop()
	h1.Cfg.Broker = rotated
	connected := h1.logCount(`"msg":"broker connected"`)
	h1.start()
	// ready means the first connection was tried: under load that try can
	// fail and a later one connect (a send meanwhile is 69, as it should be)
	eventually(t, "h1 connected with the rotated login", func() error {
		if h1.logCount(`"msg":"broker connected"`) == connected {
			return errors.New("not yet")
		}
		return nil
	})
	alice.mustSend(bob.Gid, "after the restart")
	// both: the one from before the restart alone was enough here once,
	// and the one the rotated login sent went unchecked
	var got []string
	eventually(t, "both messages", func() error {
		got = append(got, bodies(bob.recv())...)
		if !slices.Contains(got, "before the restart") || !slices.Contains(got, "after the restart") {
			return fmt.Errorf("got %q so far", got)
		}
		return nil
	})
	if len(got) != 2 {
		t.Fatalf("bob got %q, want each message once", got)
	}
}

// Revocation (fleet-gw broker-setup --remove): a gateway that loses its
// login while running says so once, does not flood the log, and refuses
// remote sends with 69; one started with a removed login stops at once
// with 77 and one clear error.
func TestCrossLoginRevoked(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, bob := h1.join("alice"), h2.join("bob")
	h2.resolves("alice@h1")
	h1.resolves("bob@h2")
	h1.refusalsExpected = true
	vhost := h1.Cfg.Broker[strings.LastIndex(h1.Cfg.Broker, "/")+1:]
	steps := broker.RemoveSteps(broker.HostUser(vhost, "h1"))
	for _, st := range steps {
		if out, err := testnode.Ctl(st.Args...); err != nil {
			t.Fatalf("%v: %v\n%s", st.Args, err, out)
		}
	}
	h1.waitLog(`"msg":"the broker refuses this gateway's login`)
	// sends while cut off each fail fast (69), and the refusal is still
	// said once: the sends are the sentinel that time went by with work
	for i := range 3 {
		_, err := alice.send(bob.Gid, fmt.Sprintf("after revocation %d", i))
		faultOf(t, err, fault.Unavailable)
	}
	if n := strings.Count(h1.logs.String(), "refuses this gateway's login"); n != 1 {
		t.Errorf("the refusal logged %d times over three refused sends, want once", n)
	}
	resp := h1.must("", &api.RosterRequest{})
	for _, r := range resp.Entities {
		if r.Name == "bob" && r.Status != "unknown" {
			t.Errorf("h1, cut off, shows bob as %q, want unknown", r.Status)
		}
	}

	h1.stop()
	logs := &syncBuffer{}
	gw := gateway.New(h1.Cfg, slog.New(slog.NewJSONHandler(logs, nil)))
	done := make(chan error, 1)
	go func() { done <- gw.Run(context.Background()) }()
	var err error
	select {
	case <-gw.Ready():
		t.Fatal("a gateway with a removed login served")
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a gateway with a removed login neither served nor stopped")
	}
	if fe := faultOf(t, err, fault.Refused); fe.Kind != fault.KindBrokerLogin || !strings.Contains(fe.Hint, "fleet-gw broker-setup --host h1") {
		t.Errorf("start with a removed login: %v (kind %s, hint %q)", fe, fe.Kind, fe.Hint)
	}
	if n := strings.Count(logs.String(), `"level":"ERROR"`); n != 1 {
		t.Errorf("%d ERROR lines at a refused start, want 1:\n%s", n, logs)
	}
}

// An entity from before gids named their host (a plain UUID) is said
// once at start; its gateway's login never tries its inbox, and it can
// leave and join again, then with a gid of this host.
func TestCrossLegacyEntity(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := startGW(t, dir, "h1", settings{"broker": url})
	h1.join("bob")
	h1.stop()
	st, err := store.Open(filepath.Join(h1.Cfg.StateDir, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, hash := ident.Issue("h1.01a22a93-8b62-7719-997e-dae6eae12382")
	now := time.Now().UTC()
	if err := st.CreateEntity(&store.Entity{Gid: "01a22a93-8b62-7719-997e-dae6eae12382", Name: "old", Host: "h1", Mode: "pull",
		Status: "idle", TokenHash: hash, StatusAt: now, Created: now, Groups: []string{}}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	h1.start()
	h1.waitLog(`entities whose gid does not name this host`)
	if !strings.Contains(h1.logs.String(), `"entities":"old"`) {
		t.Errorf("old not named in the error:\n%s", h1.logs)
	}
	h1.must("", &api.LeaveRequest{Name: "old"})
	again := h1.join("old")
	if ident.GidHost(again.Gid) != "h1" {
		t.Errorf("old joined again as %s", again.Gid)
	}
	// (the cleanup checks that h1's login met no permission error)
}

// U1 + U2 across hosts: a main waiting on its worker's reply sees the
// worker's ask about the task instead of both timing out; it answers,
// waits again for the same reply without sending again, and gets it.
// Nothing expires, nothing is shown twice.
func TestCrossWaitSurfacesAsk(t *testing.T) {
	h1, h2 := twoHosts(t)
	main, worker := h1.join("main"), h2.join("worker")
	h1.resolves("worker@h2")
	h2.resolves("main@h1")
	c1, sent, err := h1.open(main.Token, &api.SendRequest{To: "worker@h2", Body: "fix the build", Wait: true, TimeoutMS: 30_000})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	var task []string
	eventually(t, "the worker has the task", func() error {
		task = append(task, bodies(worker.recv())...)
		if len(task) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	c2, ask := worker.ask("main@h1", "which branch?", "turn-w1", 30_000)
	defer c2.Close()
	resp, err := c1.Read()
	if err != nil {
		t.Fatal(err)
	}
	if resp.WaitingFor != sent.MsgID || len(resp.Batch) != 1 || resp.Batch[0].Envelope.MsgID != ask.MsgID || resp.Batch[0].Envelope.Body != "which branch?" {
		t.Fatalf("the wait ended with %+v, want the ask %s waiting for %s", resp, ask.MsgID, sent.MsgID)
	}
	if _, err := main.answer(ask.MsgID, "main"); err != nil {
		t.Fatalf("answer: %v", err)
	}
	if ans, err := second(t, c2); err != nil || ans.Body != "main" {
		t.Fatalf("the worker's ask got %+v, %v", ans, err)
	}
	// the reply comes while nobody waits: it is kept for the resumed wait
	if _, err := h2.call(worker.Token, &api.SendRequest{ReplyTo: sent.MsgID, Body: "done on main"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reply reached h1", func() error {
		r := h1.must(main.Token, &api.RosterRequest{})
		for _, e := range r.Entities {
			if e.Name == "main" && e.Pending == 1 {
				return nil
			}
		}
		return errors.New("not yet")
	})
	c3 := h1.dial(main.Token)
	defer c3.Close()
	if err := c3.Send(&api.WaitReplyRequest{MsgID: sent.MsgID, TimeoutMS: 10_000}); err != nil {
		t.Fatal(err)
	}
	if rep, err := second(t, c3); err != nil || rep.Body != "done on main" || rep.InReplyTo != sent.MsgID {
		t.Fatalf("wait-reply got %+v, %v", rep, err)
	}
	if got := main.recv(); len(got) != 0 {
		t.Errorf("main's inbox still shows %v: shown twice", bodies(got))
	}
	if got := worker.recv(); len(got) != 0 {
		t.Errorf("the worker got more: %v", bodies(got))
	}
	// a wait-reply for a message not the caller's
	c4 := h2.dial(worker.Token)
	defer c4.Close()
	if err := c4.Send(&api.WaitReplyRequest{MsgID: sent.MsgID, TimeoutMS: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := second(t, c4); fault.CodeOf(err) != fault.NoRecipient {
		t.Errorf("wait-reply on another's message: %v, want 67", err)
	}
}
