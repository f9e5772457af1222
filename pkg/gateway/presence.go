package gateway

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
)

// Presence (U5) is soft state. Every presence-interval, and at once on any
// change, each gateway announces a snapshot of its local entities on
// bridge.roster (key roster.<host>.snapshot); every gateway folds the
// snapshots it hears into one union view. A host not heard for two
// intervals reads "stale"; one not heard for presence-ttl is dropped; while
// this gateway is cut off from the broker, every remote host reads
// "unknown" with the time it was last heard. One message per host per
// interval, not one per entity: the traffic grows with hosts, not agents.

// snapshotBody is the body of a PRESENCE message.
type snapshotBody struct {
	Host       string          `json:"host"`
	IntervalMS int64           `json:"interval_ms"`
	Leaving    bool            `json:"leaving,omitempty"`
	Entities   []api.EntityRow `json:"entities"`
}

// peer is what this gateway knows of another host.
type peer struct {
	rows     []api.EntityRow
	heard    time.Time
	interval time.Duration
}

func (g *Gateway) kickPresence() {
	if g.br == nil {
		return
	}
	select {
	case g.presenceKick <- struct{}{}:
	default:
	}
}

func (g *Gateway) presenceLoop() {
	defer g.workers.Done()
	t := time.NewTicker(g.cfg.PresenceInterval)
	defer t.Stop()
	up := g.br.Subscribe()
	for {
		select {
		case <-g.runCtx.Done():
			return
		case <-t.C:
		case <-g.presenceKick:
		case ok := <-up:
			if !ok {
				continue
			}
		}
		g.announce(false)
	}
}

// announce publishes this host's snapshot.
func (g *Gateway) announce(leaving bool) {
	rows, err := g.localRows()
	if err != nil {
		return
	}
	if leaving {
		rows = nil
	}
	for i := range rows {
		rows[i].Target = "" // a pane or command is this host's business
	}
	body, _ := json.Marshal(snapshotBody{
		Host: g.cfg.Host, IntervalMS: g.cfg.PresenceInterval.Milliseconds(), Leaving: leaving, Entities: rows,
	})
	env := envelope.New(envelope.Presence, envelope.Party{Host: g.cfg.Host}, envelope.Party{Group: "roster"}, string(body))
	if err := g.br.PublishPresence(env, "snapshot", 2*g.cfg.PresenceTTL); err != nil {
		g.log.Debug("presence not announced", "err", err)
	}
}

// onPresence folds a snapshot heard from another host into the view.
func (g *Gateway) onPresence(env *envelope.Envelope) {
	var s snapshotBody
	if err := json.Unmarshal([]byte(env.Body), &s); err != nil || s.Host == "" {
		g.log.Warn("ignoring a malformed presence snapshot", "trace_id", env.TraceID, "err", err)
		return
	}
	if s.Host == g.cfg.Host {
		return // the local view is exact
	}
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if s.Leaving {
		delete(g.peers, s.Host)
		return
	}
	p := g.peers[s.Host]
	if p == nil {
		p = &peer{}
		g.peers[s.Host] = p
		g.log.Info("host joined the view", "peer", s.Host, "entities", len(s.Entities))
	}
	p.rows, p.heard, p.interval = s.Entities, time.Now(), time.Duration(s.IntervalMS)*time.Millisecond
	if p.interval <= 0 {
		p.interval = g.cfg.PresenceInterval
	}
}

// remoteRows returns the other hosts' entities with their presence status.
func (g *Gateway) remoteRows() []api.EntityRow {
	now := time.Now()
	connected := g.br != nil && g.br.Connected()
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	var out []api.EntityRow
	for host, p := range g.peers {
		age := now.Sub(p.heard)
		if connected && age > g.cfg.PresenceTTL {
			delete(g.peers, host)
			g.log.Info("host dropped from the view: not heard within the presence TTL", "peer", host)
			continue
		}
		for _, r := range p.rows {
			r.LastSeen = p.heard.UTC()
			switch {
			case !connected:
				r.Status = "unknown"
			case age > 2*p.interval:
				r.Status = "stale"
			}
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Host < out[j].Host
	})
	return out
}

// remoteByName returns the remote entities called name (on host, if given).
func (g *Gateway) remoteByName(name, host string) []api.EntityRow {
	var out []api.EntityRow
	for _, r := range g.remoteRows() {
		if r.Name == name && (host == "" || r.Host == host) {
			out = append(out, r)
		}
	}
	return out
}
