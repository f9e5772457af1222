package gateway

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkPresenceTraffic measures what presence costs the broker with
// H hosts of 100 entities each (H = 3, 30, 100), for the scheme before
// snapshots (one heartbeat per entity per interval, key
// roster.<host>.<gid>) and for snapshots (one page per host per interval,
// roster.<host>.snapshot), side by side in the same run. Each simulated
// gateway has what a real one has on the broker: a publishing connection
// in confirm mode, and its roster queue (broker.RosterQueue, with the
// real arguments, bound to bridge.roster as roster.#) consumed on a second
// connection. It publishes, every interval from a random start, exactly
// the bodies a gateway of that scheme publishes (presenceBody, signed as
// the broker package signs), and its consumer counts what the broker
// delivers, without decoding, so the figures are the broker's work, not
// the receivers'. After one interval of warm-up, the publishes confirmed
// and the deliveries made in the next two intervals are counted:
// published/s and delivered/s. demanded/s is what the scheme asks of the
// broker (hosts x entities / interval published, that times hosts
// delivered): where delivered/s falls short of it, the node fell behind.
//
// scripts/bench-presence.sh runs it on the private node (3 runs, ranges);
// FLEET_BENCH_PRESENCE_INTERVAL sets the interval (default 5s, the
// deployed default).
func BenchmarkPresenceTraffic(b *testing.B) {
	interval := 5 * time.Second
	if s := os.Getenv("FLEET_BENCH_PRESENCE_INTERVAL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		interval = d
	}
	const entities = 100
	// one vhost for every run (rabbitmqctl takes seconds a call); each
	// run's queues are exclusive and go with its connections
	url, drop, err := testnode.Vhost(fmt.Sprintf("bench-presence-%d", os.Getpid()))
	if err != nil {
		b.Fatal(err)
	}
	defer drop()
	for _, hosts := range []int{3, 30, 100} {
		for _, scheme := range []string{"old", "new"} {
			b.Run(fmt.Sprintf("hosts=%d/%s", hosts, scheme), func(b *testing.B) {
				for range b.N {
					r := runPresenceSim(b, url, scheme, hosts, entities, interval)
					b.ReportMetric(r.published, "published/s")
					b.ReportMetric(r.delivered, "delivered/s")
					b.ReportMetric(r.bytes/1024, "KiB-delivered/s")
					b.ReportMetric(r.demanded, "demanded-deliveries/s")
				}
			})
		}
	}
}

type simResult struct{ published, delivered, bytes, demanded float64 }

// simHost is one simulated gateway.
type simHost struct {
	name     string
	pub, sub *amqp.Connection
	ch       *amqp.Channel
	priv     ed25519.PrivateKey
	rows     []api.EntityRow
	prev     int64
}

func runPresenceSim(b *testing.B, url, scheme string, hosts, entities int, interval time.Duration) simResult {
	b.Helper()
	setup, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	sch, err := setup.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := sch.ExchangeDeclare(broker.ExRoster, "topic", true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	var published, delivered, bytes atomic.Int64
	counting := atomic.Bool{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sims := make([]*simHost, hosts)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range sims {
		h := &simHost{name: fmt.Sprintf("h%d", i+1)}
		_, h.priv, _ = ed25519.GenerateKey(nil)
		for j := range entities {
			h.rows = append(h.rows, api.EntityRow{Name: fmt.Sprintf("worker%d", j), Gid: fmt.Sprintf("%s.01a22a93-8b62-7719-997e-%012d", h.name, j),
				Mode: "inject", Groups: []string{"reviewers"}, Status: "idle", Pending: j % 3, LastDelivery: time.Now().UTC()})
		}
		if h.pub, err = amqp.Dial(url); err != nil {
			b.Fatal(err)
		}
		defer h.pub.Close()
		if h.sub, err = amqp.Dial(url); err != nil {
			b.Fatal(err)
		}
		defer h.sub.Close()
		if h.ch, err = h.pub.Channel(); err != nil {
			b.Fatal(err)
		}
		if err := h.ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		rc, err := h.sub.Channel()
		if err != nil {
			b.Fatal(err)
		}
		q := broker.RosterQueue(h.name)
		if _, err := rc.QueueDeclare(q, false, true, true, false, broker.RosterQueueArgs()); err != nil {
			b.Fatal(err)
		}
		if err := rc.QueueBind(q, "roster.#", broker.ExRoster, false, nil); err != nil {
			b.Fatal(err)
		}
		d, err := rc.Consume(q, "", true, true, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range d {
				if counting.Load() {
					delivered.Add(1)
					bytes.Add(int64(len(m.Body)))
				}
			}
		}()
		sims[i] = h
	}
	for i, h := range sims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// gateways are not in step: each starts somewhere in the interval
			select {
			case <-time.After(interval * time.Duration(i) / time.Duration(hosts)):
			case <-ctx.Done():
				return
			}
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				h.announce(ctx, scheme, interval, func() {
					if counting.Load() {
						published.Add(1)
					}
				})
				select {
				case <-t.C:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	time.Sleep(interval) // warm-up: every host has started
	counting.Store(true)
	start := time.Now()
	time.Sleep(2 * interval)
	counting.Store(false)
	took := time.Since(start).Seconds()
	cancel()
	for _, h := range sims { // the consumers' delivery channels close with their connections
		h.sub.Close()
		h.pub.Close()
	}
	perInterval := float64(hosts * entities)
	if scheme == "new" {
		perInterval = float64(hosts) // one page each: 100 rows are far below a page
	}
	return simResult{
		published: float64(published.Load()) / took,
		delivered: float64(delivered.Load()) / took,
		bytes:     float64(bytes.Load()) / took,
		demanded:  perInterval * float64(hosts) / interval.Seconds(),
	}
}

// announce publishes one interval's presence of h in scheme, encoded as
// a gateway of that scheme encodes it, all in flight at once; confirmed
// is called for each publish the broker confirms, when it does.
func (h *simHost) announce(ctx context.Context, scheme string, interval time.Duration, confirmed func()) {
	var bodies []presenceBody
	var keys []string
	seq := time.Now().UnixNano()
	switch scheme {
	case "old": // presence.go before snapshots: one heartbeat per entity
		for i := range h.rows {
			j, _ := json.Marshal(h.rows[i])
			bodies = append(bodies, presenceBody{Seq: seq + int64(i), Entity: j})
			keys = append(keys, h.rows[i].Gid)
		}
	default: // announce: the snapshot's pages
		raw := make([]json.RawMessage, len(h.rows))
		for i := range h.rows {
			raw[i], _ = json.Marshal(h.rows[i])
		}
		pages := snapshotPages(raw, presencePageBytes)
		for i := range pages {
			pages[i].ID = seq
			bodies = append(bodies, presenceBody{Seq: seq + int64(i), Prev: h.prev, Snapshot: &pages[i]})
			h.prev = seq + int64(i)
			keys = append(keys, "snapshot")
		}
	}
	var confs []*amqp.DeferredConfirmation
	for i, pb := range bodies {
		pb.Host, pb.IntervalMS = h.name, interval.Milliseconds()
		body, _ := json.Marshal(pb)
		env := envelope.New(envelope.Presence, envelope.Party{Host: h.name}, envelope.Party{Group: "roster"}, string(body))
		wire, _ := envelope.Encode(env)
		msg := amqp.Publishing{ // as broker.PublishPresence
			ContentType: "application/json", MessageId: env.MsgID, Type: string(env.Kind), Body: wire,
			Expiration: strconv.FormatInt((6 * interval).Milliseconds(), 10),
			Headers:    amqp.Table{"fleet-host": h.name, "fleet-sig": base64.StdEncoding.EncodeToString(ed25519.Sign(h.priv, wire))},
		}
		c, err := h.ch.PublishWithDeferredConfirmWithContext(ctx, broker.ExRoster, "roster."+h.name+"."+keys[i], false, false, msg)
		if err != nil {
			return
		}
		confs = append(confs, c)
	}
	for _, c := range confs {
		if ok, err := c.WaitContext(ctx); ok && err == nil {
			confirmed()
		}
	}
}
