package gateway

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
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

// announcer owns what this gateway has said of its own entities: the
// sequence of its presence messages, the status last announced per entity,
// and the settled announcements scheduled.
type announcer struct {
	mu   sync.Mutex
	seq  int64             // the last presence sequence published
	said map[string]string // gid -> the status last announced
	due  map[string]bool   // gid -> a settled status announcement is scheduled
}

func newAnnouncer() *announcer {
	return &announcer{said: map[string]string{}, due: map[string]bool{}}
}

// Next is the sequence of the next presence message: the clock in ns,
// strictly increasing.
func (a *announcer) Next() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq = max(time.Now().UnixNano(), a.seq+1)
	return a.seq
}

// Said records the status announced for gid ("" forgets it).
func (a *announcer) Said(gid, status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if status == "" {
		delete(a.said, gid)
		return
	}
	a.said[gid] = status
}

// Schedule marks a settled announcement of gid as due; false if one is
// already.
func (a *announcer) Schedule(gid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.due[gid] {
		return false
	}
	a.due[gid] = true
	return true
}

// Due ends gid's scheduled announcement and returns the status last said.
func (a *announcer) Due(gid string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.due, gid)
	return a.said[gid]
}

// announceStatusSoon announces gid's row statusSettle from now, unless by
// then its status is back to the one last announced.
func (g *Gateway) announceStatusSoon(gid string) {
	if g.br == nil {
		return
	}
	if !g.said.Schedule(gid) {
		return
	}
	time.AfterFunc(statusSettle, func() {
		said := g.said.Due(gid)
		b := g.box(gid)
		if b == nil || g.row(b.snapshot(), nil).Status == said {
			return // gone, or flapped back: nothing new to say
		}
		g.announceEntity(gid)
	})
}

func (g *Gateway) presenceLoop() {
	defer g.workers.Done()
	defer close(g.presenceDone)
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
		case <-g.presenceQuit: // shutdown: the leaving notice is the last word
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
		g.said.Said(b.Entity.Gid, b.Entity.Status)
	}
	b.Host, b.IntervalMS, b.Seq = g.cfg.Host, g.cfg.PresenceInterval.Milliseconds(), g.said.Next()
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
	g.said.Said(gid, "")
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
	return g.peers.Fold(b, seq, now, interval, g.box)
}

// checkRow holds a heard entity row to the grammar of local ones.
func checkRow(r *api.EntityRow) error {
	bad := func(format string, args ...any) error {
		return broker.Refuse(broker.ReasonMalformed, "presence: "+format, args...)
	}
	switch {
	case !ident.IsGid(r.Gid):
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

// remoteRows returns the other hosts' entities with their presence status,
// and the hosts heard but not trusted.
func (g *Gateway) remoteRows() []api.EntityRow {
	out := g.peers.Rows(time.Now(), g.br != nil && g.br.Connected(), g.cfg.PresenceTTL)
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
