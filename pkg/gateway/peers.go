package gateway

import (
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/ident"
)

// peerView owns what this gateway heard of the other hosts: the remote
// half of the union roster (presence.go feeds it; resolve and the roster
// read it). A host speaks only for itself and only forward: see Fold.
type peerView struct {
	mu       sync.Mutex
	peers    map[string]*peer     // host -> what we last heard of it
	left     map[string]int64     // host -> the sequence of its last leaving notice
	tombs    map[string]tombstone // gid -> its gone notice: older heartbeats do not bring it back
	interval time.Duration        // this gateway's presence interval: a host's until it says its own
	log      *slog.Logger
}

// tombstone is a gone notice, kept for the presence TTL.
type tombstone struct {
	seq   int64
	heard time.Time
}

func newPeerView(interval time.Duration, log *slog.Logger) *peerView {
	return &peerView{peers: map[string]*peer{}, left: map[string]int64{}, tombs: map[string]tombstone{}, interval: interval, log: log}
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

// Fold applies one authentic presence message of host b.Host (sequence
// seq, heard now) to the view, or refuses it: a leaving or gone notice
// older than what was heard since is a replay; a heartbeat for a gid the
// view places on another host, or that lives here (local), is a lie; an
// older heartbeat that arrived late is superseded and ignored.
func (v *peerView) Fold(b presenceBody, seq int64, now time.Time, interval time.Duration, local func(gid string) *mailbox) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	p := v.peers[b.Host]
	switch {
	case b.Leaving:
		if seq <= v.left[b.Host] {
			return broker.Refuse(broker.ReasonReplay, "leaving notice of %s heard before: a replay", b.Host)
		}
		if p != nil && seq <= p.maxSeq {
			// a host's own presence can overtake its leaving notice in
			// flight (they are published concurrently): within one
			// interval that is a race, and the newer word stands; older,
			// it is a replay
			if p.maxSeq-seq <= int64(p.interval) {
				return nil
			}
			return broker.Refuse(broker.ReasonReplay, "leaving notice of %s older than its latest presence: a replay", b.Host)
		}
		if seq > v.left[b.Host] {
			v.left[b.Host] = seq
		}
		if p != nil {
			delete(v.peers, b.Host)
			v.log.Info("host left the view: it stopped", "peer", b.Host)
		}
	case b.Gone != "":
		if !ident.IsGid(b.Gone) {
			return broker.Refuse(broker.ReasonMalformed, "gone %q is not a gid", b.Gone)
		}
		if made := ident.GidHost(b.Gone); made != b.Host {
			return broker.Refuse(broker.ReasonWrongHost, "host %s says entity %s is gone, which was made on %s", b.Host, b.Gone, made)
		}
		if t, ok := v.tombs[b.Gone]; ok && seq <= t.seq {
			return broker.Refuse(broker.ReasonReplay, "gone notice of %s heard before: a replay", b.Gone)
		}
		v.tombs[b.Gone] = tombstone{seq: seq, heard: now}
		if p == nil || p.entities[b.Gone] == nil {
			return nil // nothing to forget
		}
		if h := p.entities[b.Gone]; seq <= h.seq {
			if h.seq-seq <= int64(p.interval) { // a heartbeat that overtook it in flight
				return nil
			}
			return broker.Refuse(broker.ReasonReplay, "gone notice of %s older than its latest heartbeat: a replay", b.Gone)
		}
		p.maxSeq = max(p.maxSeq, seq)
		delete(p.entities, b.Gone)
		if len(p.entities) == 0 {
			delete(v.peers, b.Host)
		}
	case b.Entity != nil:
		r := *b.Entity
		if err := checkRow(&r); err != nil {
			return err
		}
		if made := ident.GidHost(r.Gid); made != b.Host {
			// a gid names the host it was made on: a host announces only
			// its own entities, whoever heard of them first
			return broker.Refuse(broker.ReasonWrongHost, "host %s claims entity %s, which was made on %s", b.Host, r.Gid, made)
		}
		if seq <= v.left[b.Host] || seq <= v.tombs[r.Gid].seq {
			return nil // announced before its host's leaving or its own gone notice: superseded
		}
		if p != nil {
			if h := p.entities[r.Gid]; h != nil && seq <= h.seq {
				return nil // an older heartbeat that arrived late: superseded
			}
		}
		r.Host, r.Target = b.Host, ""
		p = v.peerLocked(b.Host)
		p.interval = interval
		p.maxSeq = max(p.maxSeq, seq)
		p.entities[r.Gid] = &heardRow{row: r, heard: now, seq: seq}
	}
	return nil
}

// peerLocked returns host's peer, adding it; v.mu is held.
func (v *peerView) peerLocked(host string) *peer {
	p := v.peers[host]
	if p == nil {
		p = &peer{entities: map[string]*heardRow{}, interval: v.interval}
		v.peers[host] = p
		v.log.Info("host joined the view", "peer", host)
	}
	return p
}

// Upsert records what this gateway learned of one remote entity
// otherwise than by its presence (a control answer): the next heartbeat
// replaces it.
func (v *peerView) Upsert(host string, row api.EntityRow, heard time.Time, interval time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for h, other := range v.peers {
		if h != host && other.entities[row.Gid] != nil {
			v.log.Warn("a control answer names an entity the view places on another host: not learned",
				"peer", host, "gid", row.Gid, "on", h)
			return
		}
	}
	p := v.peerLocked(host)
	if interval > 0 {
		p.interval = interval
	}
	seq := int64(0)
	if h := p.entities[row.Gid]; h != nil {
		seq = h.seq
	}
	p.entities[row.Gid] = &heardRow{row: row, heard: heard, seq: seq}
}

// Drop forgets one remote entity.
func (v *peerView) Drop(host, gid string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.peers[host]; p != nil {
		delete(p.entities, gid)
		if len(p.entities) == 0 {
			delete(v.peers, host)
		}
	}
}

// Rows returns the other hosts' entities with their presence status: while
// this gateway is cut off from the broker (connected false) every one reads
// "unknown"; one not heard for two of its host's intervals "stale"; one not
// heard within ttl is dropped.
func (v *peerView) Rows(now time.Time, connected bool, ttl time.Duration) []api.EntityRow {
	v.mu.Lock()
	defer v.mu.Unlock()
	for gid, t := range v.tombs {
		if now.Sub(t.heard) > ttl {
			delete(v.tombs, gid)
		}
	}
	var out []api.EntityRow
	for host, p := range v.peers {
		for gid, h := range p.entities {
			age := now.Sub(h.heard)
			if connected && age > max(ttl, 3*p.interval) {
				delete(p.entities, gid)
				v.log.Info("entity dropped from the view: not heard within the presence TTL", "peer", host, "entity", h.row.Name)
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
			delete(v.peers, host)
		}
	}
	return out
}
