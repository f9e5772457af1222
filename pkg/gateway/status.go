package gateway

import (
	"os"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/version"
)

// gatewayStatus serves fleet-gw status: what a service manager or an
// operator needs to know about this gateway, from one request. Healthy
// means serving with every configured part up: with a broker configured,
// connected to it (blocked, connecting or down is degraded).
func (g *Gateway) gatewayStatus() (*api.Response, error) {
	st := &api.GatewayStatus{
		Version: version.Version, Host: g.cfg.Host, Pid: os.Getpid(),
		Started: g.started.UTC(), Uptime: time.Since(g.started).Round(time.Second).String(),
	}
	st.Broker.State = "none"
	if g.br != nil {
		st.Broker.State, st.Broker.Detail, st.Broker.Node, st.Broker.Since = g.br.State()
		st.Broker.Since = st.Broker.Since.UTC()
	}
	st.Healthy = st.Broker.State == "none" || st.Broker.State == "connected"
	st.Peers = []api.PeerStatus{}
	if g.admit != nil {
		keys, _ := g.admit.file.Keys()
		hosts := g.admit.trustedHosts() // lines and certificates
		st.Trusted = len(hosts)
		if _, self := keys[g.cfg.Host]; self {
			st.Trusted++ // a line for this host itself counts, as it always did
		}
		if g.br != nil {
			st.Peers = g.peers.Peers(time.Now(), g.br.Connected(), g.cfg.PresenceTTL, hosts, g.admit.untrustedRows())
			cert, _ := g.admit.certified().Present()
			for i := range st.Peers {
				if ok, known := g.admits.admits(st.Peers[i].Host, cert != "", time.Now()); known {
					st.Peers[i].Admits = &ok
				}
			}
		}
	}
	rows, err := g.localRows()
	if err != nil {
		return nil, err
	}
	st.Entities = len(rows)
	for _, r := range rows {
		switch r.Status {
		case stStarting, stStuck, stUnhooked, stDetached:
			if st.Held == nil {
				st.Held = map[string]int{}
			}
			st.Held[r.Status]++
		}
		st.Pending += r.Pending
		st.Dead += r.Dead
	}
	if inboxes, err := g.st.Inboxes(); err == nil { // every inbox's head in one store operation
		for _, ib := range inboxes {
			if c := ib.Oldest; ib.Depth > 0 && !c.IsZero() && (st.OldestPending.IsZero() || c.Before(st.OldestPending)) {
				st.OldestPending = c.UTC()
			}
		}
	}
	return &api.Response{GatewayStatus: st}, nil
}
