package gateway

// metrics.go — the gateway's side of its Prometheus endpoint
// (--metrics-listen; the metrics themselves are defined in pkg/metrics).
// Events are counted where they happen, by one call each (accept, settled,
// kill's callers through settled, liveAdd, the asks' deliveries); the
// broker and the store report through their observers, attached here; the
// states are read here at scrape time.

import (
	"log/slog"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
	"github.com/fleetd/fleet/pkg/version"
)

// scrapes owns the metrics endpoint: the address bound first thing
// (Listen), served once every part a scrape reads is set up (Serve),
// closed with the store (Close). A scrape reads the parts it was given,
// each behind its own lock.
type scrapes struct {
	log *slog.Logger
	m   *metrics.Metrics  // nil: metrics-listen is off
	ep  *metrics.Endpoint // its /metrics, while serving

	// what a scrape reads, set by Serve
	st     *store.Store
	reg    *registry
	asks   *asks
	broker func() string          // the broker link's state ("none": single-host mode)
	remote func() []api.EntityRow // the roster view of the other hosts
}

// Listen binds addr ("" : off), first thing at start: an address that
// cannot be had stops the gateway before it takes anything (exit 64, one
// line), rather than leaving it running unobserved. It returns the
// metrics every part counts its events in (nil when off).
func (s *scrapes) Listen(addr, host string) (*metrics.Metrics, error) {
	if addr == "" {
		return nil, nil
	}
	ep, err := metrics.Listen(addr)
	if err != nil {
		return nil, fault.Wrap(fault.Usage, fault.KindBadConfig, err, "cannot serve metrics on %s", addr).
			WithHint("choose another metrics-listen address (such as 127.0.0.1:9464), or stop what holds it")
	}
	s.ep = ep
	s.m = metrics.New(host, version.Version, s.snapshot)
	return s.m, nil
}

// Observer is what the broker reports to the metrics (nothing when they
// are off: no publish is timed for nobody).
func (s *scrapes) Observer() broker.Observer {
	if s.m == nil {
		return broker.Observer{}
	}
	return broker.Observer{
		Confirmed: s.m.Confirmed, InboxFull: s.m.InboxFull,
		Refused: s.m.Refused, Reconnected: s.m.Reconnected,
	}
}

// Serve starts serving, once every part a scrape reads is set up, and
// from then on times the store's flushes.
func (s *scrapes) Serve(st *store.Store, reg *registry, asks *asks, brokerState func() string, remote func() []api.EntityRow) {
	if s.ep == nil {
		return
	}
	s.st, s.reg, s.asks, s.broker, s.remote = st, reg, asks, brokerState, remote
	st.OnFlush(s.m.Flushed)
	s.ep.Serve(s.m)
	attrs := []any{"addr", s.ep.Addr(), "path", "/metrics"}
	if s.ep.Exposed() {
		s.log.Warn("metrics served beyond this machine, without authentication: anyone who can reach the port reads entity names and traffic counts", append(attrs,
			"fix", "listen on 127.0.0.1 and let the scraper reach it through a tunnel or a proxy that authenticates")...)
	} else {
		s.log.Info("metrics served", attrs...)
	}
}

// Close closes the endpoint (or releases its address, if it never
// served).
func (s *scrapes) Close() {
	s.ep.Close()
	s.ep = nil
}

// Addr is the address the endpoint listens on ("" when off).
func (s *scrapes) Addr() string {
	if s.ep == nil {
		return ""
	}
	return s.ep.Addr()
}

// MetricsAddr is the address the metrics endpoint listens on ("" when
// off): with port 0 in metrics-listen, the one picked.
func (g *Gateway) MetricsAddr() string { return g.scrape.Addr() }

// snapshot is what one scrape reads: inbox depths from the store,
// the broker link's state, and the roster view by state. It may run
// concurrently with anything; every part it reads has its own lock.
func (s *scrapes) snapshot() (metrics.Snapshot, error) {
	snap := metrics.Snapshot{Broker: "none", Hosts: map[string]int{}, Entities: map[metrics.Where]int{}}
	snap.Broker = s.broker()
	stats, err := s.st.Inboxes()
	if err != nil {
		return snap, err
	}
	for _, in := range stats {
		b := s.reg.Get(in.Gid)
		if b == nil {
			continue // left meanwhile
		}
		snap.Inboxes = append(snap.Inboxes, metrics.Inbox{Entity: b.snapshot().Name, Depth: in.Depth, Oldest: in.Oldest})
	}
	for _, b := range s.reg.Members("all") {
		e := b.snapshot()
		status := e.Status
		if status == "idle" && s.asks.Asking(e.Gid) {
			status = "waiting" // as the roster says it (row)
		}
		snap.Entities[metrics.Where{Where: "local", State: status}]++
	}
	// a host reads live while any of its entities is heard within two
	// intervals; stale once all are older; unknown while cut off (or not
	// heard since this gateway started); gone once it stopped or was
	// dropped from the view (its entities are still known)
	rank := map[string]int{"gone": 1, "unknown": 2, "stale": 3, "live": 4}
	hosts := map[string]string{}
	for _, r := range s.remote() {
		if r.Status == "untrusted" {
			hosts[r.Host] = "untrusted"
			continue
		}
		snap.Entities[metrics.Where{Where: "remote", State: r.Status}]++
		st := r.Status
		if rank[st] == 0 {
			st = "live" // idle, busy, waiting
		}
		if rank[st] > rank[hosts[r.Host]] {
			hosts[r.Host] = st
		}
	}
	for _, st := range hosts {
		snap.Hosts[st]++
	}
	return snap, nil
}
