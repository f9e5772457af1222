package gateway

// metrics.go — the gateway's side of its Prometheus endpoint
// (--metrics-listen; the metrics themselves are defined in pkg/metrics).
// Events are counted where they happen, by one call each (accept, settled,
// kill's callers through settled, liveAdd, the asks' deliveries); the
// broker and the store report through their observers, attached here; the
// states are read here at scrape time.

import (
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/version"
)

// listenMetrics binds the metrics address, first thing at start: an
// address that cannot be had stops the gateway before it takes anything
// (exit 64, one line), rather than leaving it running unobserved.
func (g *Gateway) listenMetrics() error {
	addr := g.cfg.MetricsListen
	if addr == "" {
		return nil
	}
	ep, err := metrics.Listen(addr)
	if err != nil {
		return fault.Wrap(fault.Usage, fault.KindBadConfig, err, "cannot serve metrics on %s", addr).
			WithHint("choose another metrics-listen address (such as 127.0.0.1:9464), or stop what holds it")
	}
	g.endpoint = ep
	g.metrics = metrics.New(g.cfg.Host, version.Version, g.metricsSnapshot)
	return nil
}

// brokerObserver is what the broker reports to the metrics (nothing when
// they are off: no publish is timed for nobody).
func (g *Gateway) brokerObserver() broker.Observer {
	if g.metrics == nil {
		return broker.Observer{}
	}
	return broker.Observer{
		Confirmed: g.metrics.Confirmed, InboxFull: g.metrics.InboxFull,
		Refused: g.metrics.Refused, Reconnected: g.metrics.Reconnected,
	}
}

// serveMetrics starts serving, once every part a scrape reads is set up,
// and from then on times the store's flushes.
func (g *Gateway) serveMetrics() {
	if g.endpoint == nil {
		return
	}
	g.st.OnFlush(g.metrics.Flushed)
	g.endpoint.Serve(g.metrics)
	attrs := []any{"addr", g.endpoint.Addr(), "path", "/metrics"}
	if g.endpoint.Exposed() {
		g.log.Warn("metrics served beyond this machine, without authentication: anyone who can reach the port reads entity names and traffic counts", append(attrs,
			"fix", "listen on 127.0.0.1 and let the scraper reach it through a tunnel or a proxy that authenticates")...)
	} else {
		g.log.Info("metrics served", attrs...)
	}
}

// stopMetrics closes the endpoint (or releases its address, if it never
// served).
func (g *Gateway) stopMetrics() {
	g.endpoint.Close()
	g.endpoint = nil
}

// MetricsAddr is the address the metrics endpoint listens on ("" when
// off): with port 0 in metrics-listen, the one picked.
func (g *Gateway) MetricsAddr() string {
	if g.endpoint == nil {
		return ""
	}
	return g.endpoint.Addr()
}

// metricsSnapshot is what one scrape reads: inbox depths from the store,
// the broker link's state, and the roster view by state. It may run
// concurrently with anything; every part it reads has its own lock.
func (g *Gateway) metricsSnapshot() (metrics.Snapshot, error) {
	snap := metrics.Snapshot{Broker: "none", Hosts: map[string]int{}, Entities: map[metrics.Where]int{}}
	if g.br != nil {
		snap.Broker, _, _, _ = g.br.State()
	}
	stats, err := g.st.Inboxes()
	if err != nil {
		return snap, err
	}
	for _, s := range stats {
		b := g.box(s.Gid)
		if b == nil {
			continue // left meanwhile
		}
		snap.Inboxes = append(snap.Inboxes, metrics.Inbox{Entity: b.snapshot().Name, Depth: s.Depth, Oldest: s.Oldest})
	}
	for _, b := range g.reg.Members("all") {
		e := b.snapshot()
		status := e.Status
		if status == "idle" && g.asks.Asking(e.Gid) {
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
	for _, r := range g.remoteRows() {
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
