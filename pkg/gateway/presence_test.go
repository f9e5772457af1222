package gateway_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// rowOf returns g's roster row for name@host, or nil.
func (g *testGW) rowOf(name, host string) *api.EntityRow {
	g.t.Helper()
	resp := g.must("", &api.RosterRequest{})
	for _, r := range resp.Entities {
		if r.Name == name && r.Host == host {
			return &r
		}
	}
	return nil
}

// Presence (U5) across hosts: an entity that joins is in the other host's
// view with its groups and status; a status change follows; one that
// leaves is gone at once (its gone notice) and its name no longer
// resolves; a host that stops cleanly (its leaving notice) leaves the
// view at once, its entities read "gone" and still resolve to their gids.
// A name another host has is refused to a join (64, naming it): a name is
// one entity (names.go; two joins at once: cross_names_test.go).
func TestCrossHostPresence(t *testing.T) {
	h1, h2 := twoHosts(t)
	bob := h2.join("bob", api.JoinRequest{Mode: "pull", Groups: []string{"ops"}})
	h1.resolves("bob@h2")
	if r := h1.rowOf("bob", "h2"); r.Gid != bob.Gid || len(r.Groups) != 1 || r.Groups[0] != "ops" || r.Status != "idle" || r.LastSeen.IsZero() {
		t.Fatalf("bob as h1 sees him: %+v", r)
	}
	h2.must(bob.Token, &api.StatusRequest{Status: "busy"})
	eventually(t, "h1 sees bob busy", func() error {
		if r := h1.rowOf("bob", "h2"); r == nil || r.Status != "busy" {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	// the same name on h1 too: refused, naming where it lives
	_, err := h1.call("", &api.JoinRequest{Name: "bob", Mode: "pull"})
	if fe := faultOf(t, err, fault.Usage); fe.Kind != fault.KindNameTaken || !strings.Contains(fe.Error(), "bob@h2") {
		t.Fatalf("join of bob on h1: %v (%s)", fe, fe.Kind)
	}
	carol := h1.join("carol")
	if s := carol.mustSend("bob", "this one"); s.Gid != bob.Gid {
		t.Fatalf("bob resolved to %s", s.Gid)
	}
	// bob@h2 leaves: gone from h1's view at once
	h2.must("", &api.LeaveRequest{Name: "bob"})
	eventually(t, "h1 drops bob@h2", func() error {
		if r := h1.rowOf("bob", "h2"); r != nil {
			return errors.New("still there")
		}
		return nil
	})
	// the name is free again
	h1.join("bob")
	if s := carol.mustSend("bob", "now on h1"); s.Recipient != "bob@h1" {
		t.Errorf("bob resolved to %s", s.Recipient)
	}
	// h2 stops cleanly: h1 drops the host from its view at once, not after
	// the TTL; dave@h2 reads gone, and his name still resolves to his gid:
	// his inbox is durable, and the broker decides (issue: no false 67)
	dave := h2.join("dave")
	h1.resolves("dave@h2")
	h2.stop()
	h1.waitLog(`"msg":"host left the view: it stopped","host":"h1","peer":"h2"`)
	if r := h1.rowOf("dave", "h2"); r == nil || r.Status != "gone" || r.Gid != dave.Gid || r.LastSeen.IsZero() {
		t.Errorf("dave@h2 after h2 left: %+v", r)
	}
	if s := carol.mustSend("dave", "while h2 is away"); s.Gid != dave.Gid {
		t.Fatalf("dave resolved to %s", s.Gid)
	}
	h2.start()
	dave.collect("while h2 is away")
}

// rosterTap is a raw consumer of bridge.roster bound with key, beside the
// gateways' own roster queues: what a host publishes, counted on the
// broker's side.
func rosterTap(t *testing.T, key string) <-chan amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, key, broker.ExRoster, false, nil); err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// wirePresence is what a presence message says, read from the wire as
// another host would (the shape presence.go publishes).
type wirePresence struct {
	Host     string `json:"host"`
	Seq      int64  `json:"seq"`
	Prev     int64  `json:"prev"`
	Snapshot *struct {
		ID    int64             `json:"id"`
		Page  int               `json:"page"`
		Pages int               `json:"pages"`
		Rows  []json.RawMessage `json:"rows"`
	} `json:"snapshot"`
	Change *struct {
		Row  *api.EntityRow `json:"row"`
		Gone string         `json:"gone"`
	} `json:"change"`
	Leaving bool `json:"leaving"`
}

func readPresence(t *testing.T, d amqp.Delivery) wirePresence {
	t.Helper()
	env, err := envelope.Decode(d.Body, 1<<20)
	if err != nil {
		t.Fatalf("a presence message on %s: %v", d.RoutingKey, err)
	}
	var p wirePresence
	if err := json.Unmarshal([]byte(env.Body), &p); err != nil {
		t.Fatalf("a presence body on %s: %v", d.RoutingKey, err)
	}
	return p
}

// A host with 500 entities costs the broker one message per interval, not
// one per entity: while nothing changes, everything it publishes is its
// snapshot, one page of all 500 rows each interval; the other host's
// roster shows every one of them.
func TestCrossPresenceManyEntitiesOneMessage(t *testing.T) {
	brokerAlone(t, 15*time.Second)
	h1, h2 := twoHosts(t)
	const n = 500
	c := h2.dial("")
	for i := range n {
		// a join fails whole while the gateway has lost the broker (a
		// starved node misses heartbeats under a loaded suite); the
		// joiner tries again, as fleet-roster's user would
		eventuallyWithin(t, time.Minute, fmt.Sprintf("join %d", i), func() error {
			_, err := c.Call(&api.JoinRequest{Name: fmt.Sprintf("e%d", i), Mode: "pull", Groups: []string{"ops"}})
			if err != nil && fault.CodeOf(err) != fault.Unavailable {
				t.Fatalf("join %d: %v", i, err)
			}
			return err
		})
	}
	eventually(t, "h1 sees all of h2's entities", func() error {
		got := 0
		for _, r := range h1.must("", &api.RosterRequest{}).Entities {
			if r.Host == "h2" && r.Status == "idle" && len(r.Groups) == 1 {
				got++
			}
		}
		if got != n {
			return fmt.Errorf("%d of %d", got, n)
		}
		return nil
	})
	d := rosterTap(t, "roster.h2.#")
	msgs, snapshots := 0, map[int64]int{} // snapshot id -> rows seen
	for len(snapshots) < 5 {
		select {
		case m := <-d:
			msgs++
			p := readPresence(t, m)
			if m.RoutingKey != "roster.h2.snapshot" || p.Snapshot == nil {
				t.Fatalf("while nothing changed, h2 published on %s: %+v", m.RoutingKey, p)
			}
			if p.Snapshot.Pages != 1 {
				t.Fatalf("a snapshot of %d rows in %d pages, want 1", n, p.Snapshot.Pages)
			}
			snapshots[p.Snapshot.ID] += len(p.Snapshot.Rows)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d snapshots heard within 10s", len(snapshots))
		}
	}
	if msgs != len(snapshots) {
		t.Errorf("%d messages for %d snapshots", msgs, len(snapshots))
	}
	for id, rows := range snapshots {
		if rows != n {
			t.Errorf("snapshot %d carried %d rows, want %d", id, rows, n)
		}
	}
}

// A change reaches the other host at once, as a change notice, without
// waiting for a snapshot: h2 announces only every hour (after the one
// snapshot it makes when it connects), and still h1 sees a join, a status
// change and a leave; on the wire there is nothing but those notices,
// each following on the one before.
func TestCrossPresenceChangesWithoutSnapshot(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := newConfigOnly(t, dir, "h1", url)
	h2 := &testGW{t: t, Host: "h2", Cfg: newConfig(t, dir, "h2", settings{"broker": url, "presence-interval": "1h"}), logs: &syncBuffer{}}
	enrol(t, h1, h2)
	d := rosterTap(t, "roster.h2.#")
	h1.start() // its roster queue is there before h2's first snapshot
	t.Cleanup(h1.stop)
	h2.start()
	t.Cleanup(h2.stop)
	var last int64
	next := func(what string) wirePresence {
		t.Helper()
		select {
		case m := <-d:
			p := readPresence(t, m)
			if last != 0 && p.Prev != last {
				t.Fatalf("%s: prev %d, want the seq of the message before, %d", what, p.Prev, last)
			}
			last = p.Seq
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: nothing from h2 within 10s", what)
		}
		return wirePresence{}
	}
	if p := next("h2 connects"); p.Snapshot == nil || len(p.Snapshot.Rows) != 0 {
		t.Fatalf("h2's first message: %+v, want its empty snapshot", p)
	}
	bob := h2.join("bob", api.JoinRequest{Mode: "pull", Groups: []string{"ops"}})
	if p := next("bob joins"); p.Change == nil || p.Change.Row == nil || p.Change.Row.Gid != bob.Gid {
		t.Fatalf("after bob joined: %+v", p)
	}
	h1.resolves("bob@h2")
	h2.must(bob.Token, &api.StatusRequest{Status: "busy"})
	if p := next("bob is busy"); p.Change == nil || p.Change.Row == nil || p.Change.Row.Status != "busy" {
		t.Fatalf("after bob's status: %+v", p)
	}
	eventually(t, "h1 sees bob busy", func() error {
		if r := h1.rowOf("bob", "h2"); r == nil || r.Status != "busy" {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	h2.must("", &api.LeaveRequest{Name: "bob"})
	if p := next("bob leaves"); p.Change == nil || p.Change.Gone != bob.Gid {
		t.Fatalf("after bob left: %+v", p)
	}
	eventually(t, "h1 drops bob", func() error {
		if r := h1.rowOf("bob", "h2"); r != nil {
			return fmt.Errorf("still there: %+v", r)
		}
		return nil
	})
	select {
	case m := <-d:
		t.Errorf("h2 published more: %s %+v", m.RoutingKey, readPresence(t, m))
	default:
	}
}
