package gateway

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
)

// Presence (U5) is soft state. Every presence-interval, and at once on a
// change, each gateway announces each local entity on bridge.roster with
// key roster.<host>.<gid> (status, pending, groups, mode, last activity);
// an entity that leaves is announced as gone, and a gateway that stops
// cleanly announces roster.<host>.leaving. Every gateway folds what it
// hears into one union view: an entity not heard for two intervals reads
// "stale", for presence-ttl it is dropped; while this gateway is cut off
// from the broker, every remote entity reads "unknown" with the time it
// was last heard. A restarted gateway rebuilds the view within one
// interval, since every gateway announces everything every interval.

// A host speaks only for itself, and only forward: presence is admitted
// only when its body names the host that signed it, an entity's gid is not
// one the view places on another host, and its sequence (the sender's
// clock in nanoseconds, strictly increasing per gateway) is within the
// presence TTL of now. A heartbeat older than what was last heard of its
// entity is superseded and ignored; a gone or leaving notice older than
// anything heard since from that entity or host is a replay and refused
// (bridge.dlq). Hosts' clocks must agree within the presence TTL.

// presenceBody is the body of a PRESENCE message.
type presenceBody struct {
	Host       string         `json:"host"`
	Seq        int64          `json:"seq"` // sender's clock, ns, strictly increasing
	IntervalMS int64          `json:"interval_ms"`
	Entity     *api.EntityRow `json:"entity,omitempty"` // a heartbeat
	Gone       string         `json:"gone,omitempty"`   // a gid that left
	Leaving    bool           `json:"leaving,omitempty"`
}

// peer is what this gateway knows of another host.
type peer struct {
	entities map[string]*heardRow // gid -> last heartbeat
	interval time.Duration
	maxSeq   int64 // the newest presence sequence heard from the host
}

type heardRow struct {
	row   api.EntityRow
	heard time.Time
	seq   int64 // the sequence of the presence message it came from (0: learned otherwise)
}

// announceEntity publishes one entity's heartbeat now (it joined, or its
// status or groups changed), without waiting for the interval.
func (g *Gateway) announceEntity(gid string) {
	if g.br == nil {
		return
	}
	b := g.box(gid)
	if b == nil {
		return
	}
	r := g.row(b.snapshot(), nil)
	r.Target = ""
	go func() {
		if err := g.publishPresence(gid, presenceBody{Entity: &r}); err != nil {
			g.log.Debug("presence not announced", "entity", r.Name, "err", err)
		}
	}()
}

// statusSettle is how long a status change from an ask waits before it is
// announced: an ask answered within it ("waiting", then back) costs the
// fleet no presence traffic at all, where announcing each change would
// put two presence messages, copied to every gateway, beside each ask. A
// longer ask reads "waiting" on the other hosts this much later; the local
// roster shows it at once either way.
const statusSettle = 500 * time.Millisecond

// announceStatusSoon announces gid's row statusSettle from now, unless by
// then its status is back to the one last announced.
func (g *Gateway) announceStatusSoon(gid string) {
	if g.br == nil {
		return
	}
	g.presMu.Lock()
	defer g.presMu.Unlock()
	if g.presDue[gid] {
		return
	}
	g.presDue[gid] = true
	time.AfterFunc(statusSettle, func() {
		g.presMu.Lock()
		delete(g.presDue, gid)
		said := g.presSaid[gid]
		g.presMu.Unlock()
		b := g.box(gid)
		if b == nil || g.row(b.snapshot(), nil).Status == said {
			return // gone, or flapped back: nothing new to say
		}
		g.announceEntity(gid)
	})
}

func (g *Gateway) presenceLoop() {
	defer g.workers.Done()
	t := time.NewTicker(g.cfg.PresenceInterval)
	defer t.Stop()
	up := g.br.Subscribe()
	if g.br.Connected() { // connected before this loop subscribed: say so now
		g.announce()
	}
	for {
		select {
		case <-g.runCtx.Done():
			return
		case <-t.C:
		case ok := <-up:
			if !ok {
				continue
			}
		}
		g.announce()
	}
}

// publishPresence sends one presence message with key roster.<host>.<what>.
func (g *Gateway) publishPresence(what string, b presenceBody) error {
	if b.Entity != nil {
		g.presMu.Lock()
		g.presSaid[b.Entity.Gid] = b.Entity.Status
		g.presMu.Unlock()
	}
	b.Host, b.IntervalMS = g.cfg.Host, g.cfg.PresenceInterval.Milliseconds()
	g.peersMu.Lock()
	b.Seq = max(time.Now().UnixNano(), g.presSeq+1)
	g.presSeq = b.Seq
	g.peersMu.Unlock()
	body, _ := json.Marshal(b)
	env := envelope.New(envelope.Presence, envelope.Party{Host: g.cfg.Host}, envelope.Party{Group: "roster"}, string(body))
	return g.br.PublishPresence(env, what, 2*g.cfg.PresenceTTL)
}

// announce publishes a heartbeat for every local entity. The publishes are
// pipelined (a few in flight) so a thousand entities take a moment, not a
// thousand round trips.
func (g *Gateway) announce() {
	rows, err := g.localRows()
	if err != nil {
		return
	}
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range rows {
		r := rows[i]
		r.Target = "" // a pane or command is this host's business
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := g.publishPresence(r.Gid, presenceBody{Entity: &r}); err != nil {
				g.log.Debug("presence not announced", "entity", r.Name, "err", err)
			}
		}()
	}
	wg.Wait()
}

// announceGone tells the other hosts at once that an entity left.
func (g *Gateway) announceGone(gid string) {
	if g.br == nil {
		return
	}
	g.presMu.Lock()
	delete(g.presSaid, gid)
	g.presMu.Unlock()
	if err := g.publishPresence(gid, presenceBody{Gone: gid}); err != nil {
		g.log.Debug("departure not announced", "gid", gid, "err", err)
	}
}

// announceLeaving tells the other hosts this gateway stops: they drop it
// now, not after the TTL.
func (g *Gateway) announceLeaving() {
	_ = g.publishPresence("leaving", presenceBody{Leaving: true})
}

// onPresence folds a presence message heard from another host into the
// view, after checking that its host speaks for itself and moves forward.
func (g *Gateway) onPresence(env *envelope.Envelope) error {
	var b presenceBody
	if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "presence body: %v", err)
	}
	if b.Host != env.Sender.Host { // the sender host is the signer's (admit.go)
		what := "a leaving notice"
		switch {
		case b.Gone != "":
			what = "a gone notice for " + b.Gone
		case b.Entity != nil:
			what = "entity " + b.Entity.Gid
		}
		return broker.Refuse(broker.ReasonWrongHost, "presence (%s) about host %q signed by %q", what, b.Host, env.Sender.Host)
	}
	if b.Host == g.cfg.Host {
		return nil // the local view is exact
	}
	now := time.Now()
	seq := b.Seq
	if seq == 0 {
		seq = env.Created.UnixNano()
	}
	if age := now.Sub(time.Unix(0, seq)); age > g.cfg.PresenceTTL || -age > g.cfg.PresenceTTL {
		return broker.Refuse(broker.ReasonReplay, "presence sequence %s is not within the presence TTL (%v) of now",
			time.Unix(0, seq).UTC().Format(time.RFC3339Nano), g.cfg.PresenceTTL)
	}
	interval := time.Duration(b.IntervalMS) * time.Millisecond
	if interval <= 0 {
		interval = g.cfg.PresenceInterval
	}
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	p := g.peers[b.Host]
	switch {
	case b.Leaving:
		if p != nil && seq <= p.maxSeq {
			return broker.Refuse(broker.ReasonReplay, "leaving notice of %s older than its latest presence: a replay", b.Host)
		}
		if seq > g.left[b.Host] {
			g.left[b.Host] = seq
		}
		if p != nil {
			delete(g.peers, b.Host)
			g.log.Info("host left the view: it stopped", "peer", b.Host)
		}
	case b.Gone != "":
		if !isGid(b.Gone) {
			return broker.Refuse(broker.ReasonMalformed, "gone %q is not a gid", b.Gone)
		}
		if p == nil || p.entities[b.Gone] == nil {
			return nil // nothing to forget
		}
		if seq <= p.entities[b.Gone].seq {
			return broker.Refuse(broker.ReasonReplay, "gone notice of %s older than its latest heartbeat: a replay", b.Gone)
		}
		p.maxSeq = max(p.maxSeq, seq)
		delete(p.entities, b.Gone)
		if len(p.entities) == 0 {
			delete(g.peers, b.Host)
		}
	case b.Entity != nil:
		r := *b.Entity
		if err := checkRow(&r); err != nil {
			return err
		}
		for host, other := range g.peers {
			if host != b.Host && other.entities[r.Gid] != nil {
				return broker.Refuse(broker.ReasonWrongHost, "host %s claims entity %s, which lives on %s", b.Host, r.Gid, host)
			}
		}
		if g.box(r.Gid) != nil {
			return broker.Refuse(broker.ReasonWrongHost, "host %s claims entity %s, which lives on this host", b.Host, r.Gid)
		}
		if seq <= g.left[b.Host] {
			return nil // announced before its host's leaving notice: superseded
		}
		if p != nil {
			if h := p.entities[r.Gid]; h != nil && seq <= h.seq {
				return nil // an older heartbeat that arrived late: superseded
			}
		}
		r.Host, r.Target = b.Host, ""
		p = g.peerLocked(b.Host)
		p.interval = interval
		p.maxSeq = max(p.maxSeq, seq)
		p.entities[r.Gid] = &heardRow{row: r, heard: now, seq: seq}
	}
	return nil
}

// checkRow holds a heard entity row to the grammar of local ones.
func checkRow(r *api.EntityRow) error {
	bad := func(format string, args ...any) error {
		return broker.Refuse(broker.ReasonMalformed, "presence: "+format, args...)
	}
	switch {
	case !isGid(r.Gid):
		return bad("gid %q is not a gid", r.Gid)
	case !nameRE.MatchString(r.Name):
		return bad("name %q is not an entity name", r.Name)
	case r.Mode != "inject" && r.Mode != "pull":
		return bad("mode %q is not inject or pull", r.Mode)
	case r.Status != "idle" && r.Status != "busy" && r.Status != "waiting":
		return bad("status %q is not idle, busy or waiting", r.Status)
	case len(r.Groups) > 64:
		return bad("%d groups", len(r.Groups))
	}
	for _, gr := range r.Groups {
		if !nameRE.MatchString(gr) {
			return bad("group %q is not a group name", gr)
		}
	}
	if r.Groups == nil {
		r.Groups = []string{}
	}
	return nil
}

// peerLocked returns host's peer, adding it; peersMu is held.
func (g *Gateway) peerLocked(host string) *peer {
	p := g.peers[host]
	if p == nil {
		p = &peer{entities: map[string]*heardRow{}, interval: g.cfg.PresenceInterval}
		g.peers[host] = p
		g.log.Info("host joined the view", "peer", host)
	}
	return p
}

// peerUpsert records what this gateway learned of one remote entity
// otherwise than by its presence (a control answer): the next heartbeat
// replaces it.
func (g *Gateway) peerUpsert(host string, row api.EntityRow, heard time.Time, interval time.Duration) {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	p := g.peerLocked(host)
	if interval > 0 {
		p.interval = interval
	}
	seq := int64(0)
	if h := p.entities[row.Gid]; h != nil {
		seq = h.seq
	}
	p.entities[row.Gid] = &heardRow{row: row, heard: heard, seq: seq}
}

// peerDrop forgets one remote entity.
func (g *Gateway) peerDrop(host, gid string) {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if p := g.peers[host]; p != nil {
		delete(p.entities, gid)
		if len(p.entities) == 0 {
			delete(g.peers, host)
		}
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
		for gid, h := range p.entities {
			age := now.Sub(h.heard)
			if connected && age > g.cfg.PresenceTTL {
				delete(p.entities, gid)
				g.log.Info("entity dropped from the view: not heard within the presence TTL", "peer", host, "entity", h.row.Name)
				continue
			}
			r := h.row
			r.LastSeen = h.heard.UTC()
			switch {
			case !connected:
				r.Status = "unknown"
			case age > 2*p.interval:
				r.Status = "stale"
			}
			out = append(out, r)
		}
		if len(p.entities) == 0 {
			delete(g.peers, host)
		}
	}
	out = append(out, g.admit.untrustedRows()...)
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
		if r.Name == name && r.Status != "untrusted" && (host == "" || r.Host == host) {
			out = append(out, r)
		}
	}
	return out
}

// remoteHostOf returns the host the view places a remote gid on ("" if
// unknown): one map lookup per host, for the check on every inbound message.
func (g *Gateway) remoteHostOf(gid string) string {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	for host, p := range g.peers {
		if _, ok := p.entities[gid]; ok {
			return host
		}
	}
	return ""
}
