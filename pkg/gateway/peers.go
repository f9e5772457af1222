package gateway

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/store"
)

// peerView owns what this gateway heard of the other hosts: the remote
// half of the union roster (presence.go feeds it; resolve and the roster
// read it). Each host's rows are replaced by its snapshots and changed by
// its change notices in sequence; a host speaks only for itself and only
// forward (presence.go checks the fields, this the order).
type peerView struct {
	mu       sync.Mutex
	peers    map[string]*peer   // host -> what we last heard of it
	streams  map[string]*stream // host -> where its chain of presence messages stands
	left     map[string]int64   // host -> the sequence of its last leaving notice
	legacy   map[string]bool    // hosts heard announcing per entity (an older fleet), logged once each
	interval time.Duration      // this gateway's presence interval: a host's until it says its own
	log      *slog.Logger

	// The last word on every remote entity, kept in the store across
	// restarts (store.Heard): a name resolves to the gid it last had even
	// when its host is not in the view — stopped, silent past the TTL, or
	// not heard since this gateway started — and the broker's mandatory
	// routing decides whether its inbox still exists. A row goes when its
	// host says so (a snapshot without it, a change notice, a stop
	// answer) or the broker has no inbox for it (Forget).
	known  map[string]*knownRow           // gid -> its last word
	onHost map[string]map[string]struct{} // host -> the gids known on it (at most maxSnapshotRows)
	byName map[string]map[string]struct{} // name -> the gids known by it (ByName)
	dirty  map[string]bool                // gids whose known row changed since the last save
	gone   map[string]time.Time           // hosts that left or were dropped since this gateway started -> when last heard

	// The sealing key each host announced last (its presence, authentic:
	// SealKey), kept in memory only: after a restart the key of a host's
	// certificate or trust line serves until its next presence, and a
	// key it rotated from still opens there within its grace.
	sealKeys map[string]sealKeyHeard // host -> its newest announced key
	badSeal  map[string]string       // host -> the last bad key it announced (said once)
}

// sealKeyHeard is the sealing key a host announced, in which message.
type sealKeyHeard struct {
	key string // age1...
	id  string // its key id (pkg/seal)
	seq int64  // the presence message's sequence
}

// knownRow is what is remembered of a remote entity: who and where, not
// how it is doing.
type knownRow struct {
	row  api.EntityRow // Name, Host, Gid, Mode, Groups
	seen time.Time     // when its host last spoke of it, as saved
}

func newPeerView(interval time.Duration, log *slog.Logger) *peerView {
	return &peerView{peers: map[string]*peer{}, streams: map[string]*stream{}, left: map[string]int64{},
		legacy: map[string]bool{}, interval: interval, log: log,
		known: map[string]*knownRow{}, onHost: map[string]map[string]struct{}{}, byName: map[string]map[string]struct{}{}, dirty: map[string]bool{}, gone: map[string]time.Time{},
		sealKeys: map[string]sealKeyHeard{}, badSeal: map[string]string{}}
}

// HearSealKey takes the sealing key host announced in its presence
// message seq (authentic: admission checked the message's signature and
// that host signed it): the newest message's key replaces the one held,
// whatever order messages arrive in. A key that is not one (not an age
// X25519 recipient) is never taken: the one held before stands, and it
// is said once per host and key.
func (v *peerView) HearSealKey(host string, seq int64, key string) {
	v.mu.Lock()
	if old := v.sealKeys[host]; old.key == key { // the common case: the key held, again
		if seq > old.seq {
			old.seq = seq
			v.sealKeys[host] = old
		}
		v.mu.Unlock()
		return
	}
	v.mu.Unlock()
	r, err := seal.ParseRecipient(key)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		if v.badSeal[host] != key && len(v.badSeal) < 1024 {
			v.badSeal[host] = key
			v.log.Warn("host "+host+" announced a sealing key that is not one: ignored", "peer", host, "err", err)
		}
		return
	}
	old := v.sealKeys[host]
	if seq <= old.seq {
		return // an older message than the one the held key came with
	}
	id := r.ID().String()
	v.sealKeys[host] = sealKeyHeard{key: r.String(), id: id, seq: seq}
	switch {
	case old.key == r.String():
	case old.key == "":
		v.log.Info("host "+host+" announced its sealing key "+id, "peer", host, "seal_key_id", id)
	default:
		v.log.Info("host "+host+" announced a new sealing key "+id, "peer", host, "seal_key_id", id, "was", old.id)
	}
}

// SealKey is the sealing key (age1...) host announced last in its
// presence, "" if none was heard since this gateway started: the key its
// messages are sealed to first (gateway sealing), before its
// certificate's and its trust line's.
func (v *peerView) SealKey(host string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.sealKeys[host].key
}

// SealKeyHost is the host that announced the sealing key with id ("" if
// none did): a dead letter says whose keys it is sealed to.
func (v *peerView) SealKeyHost(id string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	for host, k := range v.sealKeys {
		if k.id == id {
			return host
		}
	}
	return ""
}

// Remember loads the rows saved before this gateway started.
func (v *peerView) Remember(rows []store.Heard) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, h := range rows {
		groups := h.Groups
		if groups == nil {
			groups = []string{}
		}
		v.putLocked(&knownRow{row: api.EntityRow{Name: h.Name, Host: h.Host, Gid: h.Gid, Mode: h.Mode, Groups: groups}, seen: h.Seen})
	}
}

// knowLocked records the last word on one remote entity: dirty when who
// or where changed (its status and counts are not kept). v.mu is held.
func (v *peerView) knowLocked(r api.EntityRow, seen time.Time) {
	k := v.known[r.Gid]
	if k != nil && k.row.Name == r.Name && k.row.Host == r.Host && k.row.Mode == r.Mode && slices.Equal(k.row.Groups, r.Groups) {
		return
	}
	if k == nil && len(v.onHost[r.Host]) >= maxSnapshotRows {
		return // a host has no more entities than a snapshot carries
	}
	v.putLocked(&knownRow{row: api.EntityRow{Name: r.Name, Host: r.Host, Gid: r.Gid, Mode: r.Mode, Groups: slices.Clone(r.Groups)}, seen: seen})
	v.dirty[r.Gid] = true
}

// putLocked sets one known row, indexed by host. v.mu is held.
func (v *peerView) putLocked(k *knownRow) {
	if old := v.known[k.row.Gid]; old != nil {
		if old.row.Host != k.row.Host {
			unindex(v.onHost, old.row.Host, k.row.Gid) // not by checkHeard: a gid names its host
		}
		if old.row.Name != k.row.Name {
			unindex(v.byName, old.row.Name, k.row.Gid) // its host calls it otherwise now
		}
	}
	v.known[k.row.Gid] = k
	index(v.onHost, k.row.Host, k.row.Gid)
	index(v.byName, k.row.Name, k.row.Gid)
}

// index adds gid to the set of key; unindex takes it out (and the set,
// once empty).
func index(m map[string]map[string]struct{}, key, gid string) {
	gids := m[key]
	if gids == nil {
		gids = map[string]struct{}{}
		m[key] = gids
	}
	gids[gid] = struct{}{}
}

func unindex(m map[string]map[string]struct{}, key, gid string) {
	if gids := m[key]; gids != nil {
		delete(gids, gid)
		if len(gids) == 0 {
			delete(m, key)
		}
	}
}

// forgetLocked drops the last word on one remote entity. v.mu is held.
func (v *peerView) forgetLocked(gid string) {
	if k := v.known[gid]; k != nil {
		delete(v.known, gid)
		unindex(v.onHost, k.row.Host, gid)
		unindex(v.byName, k.row.Name, gid)
		v.dirty[gid] = true
	}
}

// seenLocked saves when host was last heard on its known rows: it left the
// view, and that time is what its rows will show. v.mu is held.
func (v *peerView) seenLocked(host string, at time.Time) {
	v.gone[host] = at
	if at.IsZero() {
		return
	}
	for gid := range v.onHost[host] {
		if k := v.known[gid]; at.After(k.seen) {
			k.seen = at
			v.dirty[gid] = true
		}
	}
}

// HeardAllSince reports whether every one of hosts was heard (a snapshot
// applied, or a notice in sequence) after t.
func (v *peerView) HeardAllSince(hosts []string, t time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, h := range hosts {
		if p := v.peers[h]; p == nil || !p.heard.After(t) {
			return false
		}
	}
	return true
}

// Name is the name of a remote entity as last heard ("" if not known).
func (v *peerView) Name(gid string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if k := v.known[gid]; k != nil {
		return k.row.Name
	}
	for _, p := range v.peers {
		if h := p.entities[gid]; h != nil {
			return h.row.Name
		}
	}
	return ""
}

// Groups are a remote entity's groups as its host last announced them
// (its live row first, else its last word; nil if not known).
func (v *peerView) Groups(gid string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.peers[ident.GidHost(gid)]; p != nil {
		if h := p.entities[gid]; h != nil {
			return slices.Clone(h.row.Groups)
		}
	}
	if k := v.known[gid]; k != nil {
		return slices.Clone(k.row.Groups)
	}
	return nil
}

// ByName is the remote entities known by name (on host, if not ""),
// whose host trusted says is: who and where (name, host, gid, mode,
// groups), not how they are doing. A lookup through the name index: it
// neither sorts nor expires anything (Rows does, for a roster).
func (v *peerView) ByName(name, host string, trusted func(host string) bool) []api.EntityRow {
	v.mu.Lock()
	var out []api.EntityRow
	for gid := range v.byName[name] {
		if k := v.known[gid]; host == "" || k.row.Host == host {
			r := k.row
			r.Groups = slices.Clone(r.Groups)
			out = append(out, r)
		}
	}
	v.mu.Unlock()
	// trust is read outside the lock (it may read the trust file)
	return slices.DeleteFunc(out, func(r api.EntityRow) bool { return !trusted(r.Host) })
}

// Forget drops what is known of gid: the broker has no inbox for it.
func (v *peerView) Forget(gid string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgetLocked(gid)
	for _, p := range v.peers {
		delete(p.entities, gid)
	}
}

// Unsaved returns the known rows changed since the last call (put) and
// the gids no longer known (drop), for the store.
func (v *peerView) Unsaved() (put []store.Heard, drop []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for gid := range v.dirty {
		if k := v.known[gid]; k != nil {
			put = append(put, store.Heard{Gid: gid, Name: k.row.Name, Host: k.row.Host, Mode: k.row.Mode, Groups: k.row.Groups, Seen: k.seen})
		} else {
			drop = append(drop, gid)
		}
	}
	clear(v.dirty)
	return put, drop
}

// Unsave marks gids as changed again: their save failed.
func (v *peerView) Unsave(gids []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, gid := range gids {
		v.dirty[gid] = true
	}
}

// peer is what this gateway knows of another host.
type peer struct {
	entities map[string]*heardRow // gid -> its row
	interval time.Duration
	heard    time.Time // when its view was last confirmed: a snapshot applied, or a notice in sequence
}

// heardRow is one remote entity. A row learned otherwise than by presence
// (a control answer) carries when it was learned, and survives a snapshot
// that does not name it yet for one interval (the snapshot may have left
// before the entity was made).
type heardRow struct {
	row     api.EntityRow
	learned time.Time // zero: from the host's presence
}

// stream is where a host's chain of presence messages stands here.
type stream struct {
	maxSeq int64     // the newest sequence heard from the host: nothing older is taken
	head   int64     // the last message applied in sequence; 0: a gap, waiting for a snapshot
	snap   *building // a snapshot whose pages are arriving
}

// building is a snapshot being received: its pages so far, in sequence.
type building struct {
	id    int64 // the seq of its page 0
	last  int64 // the seq of the last page taken
	next  int   // the page expected next
	pages int
	rows  []api.EntityRow
}

// Page folds one page (seq, following prev) of host's snapshot id: pages
// are taken only in sequence, each following the one before; the last
// one replaces the host's rows with the snapshot's. A page out of order,
// or after one missed, drops the partial snapshot: the next one will do.
func (v *peerView) Page(host string, seq, prev int64, interval time.Duration, id int64, page, pages int, rows []api.EntityRow, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.forward(host, seq)
	if s == nil {
		return nil
	}
	b := s.snap
	if page == 0 {
		b = &building{id: id, pages: pages}
		s.snap = b
	} else if b == nil || b.id != id || b.pages != pages || b.next != page || b.last != prev {
		if b != nil {
			v.log.Debug("a snapshot page missed or out of order: waiting for the next snapshot", "peer", host, "page", page, "pages", pages)
		}
		s.snap = nil
		return nil
	}
	if len(b.rows)+len(rows) > maxSnapshotRows {
		s.snap = nil
		return broker.Refuse(broker.ReasonMalformed, "a snapshot of more than %d rows", maxSnapshotRows)
	}
	b.rows = append(b.rows, rows...)
	b.next, b.last = page+1, seq
	if b.next < b.pages {
		return nil
	}
	s.snap = nil
	fresh := make(map[string]*heardRow, len(b.rows))
	names := make(map[string]bool, len(b.rows))
	for _, r := range b.rows {
		if fresh[r.Gid] != nil || names[r.Name] {
			return broker.Refuse(broker.ReasonMalformed, "snapshot of %s names entity %s (%s) twice", host, r.Name, r.Gid)
		}
		fresh[r.Gid], names[r.Name] = &heardRow{row: r}, true
	}
	p := v.peerLocked(host)
	for gid, h := range p.entities {
		// learned from a control answer within the interval: the entity
		// may be younger than this snapshot, and its join notice follows
		if fresh[gid] == nil && !h.learned.IsZero() && now.Sub(h.learned) < interval {
			fresh[gid] = h
		}
	}
	p.entities, p.interval, p.heard = fresh, interval, now
	// the host's whole word: what it no longer names is gone
	for gid := range v.onHost[host] {
		if fresh[gid] == nil {
			v.forgetLocked(gid) // deleting while ranging is allowed
		}
	}
	for _, h := range fresh {
		v.knowLocked(h.row, now)
	}
	delete(v.gone, host)
	s.head = seq
	return nil
}

// Change applies one change notice (seq, following prev) of host, if it
// follows on the last message applied of host; otherwise this view has
// missed something it cannot place and waits for the next snapshot.
func (v *peerView) Change(host string, seq, prev int64, interval time.Duration, c presenceChange, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.forward(host, seq)
	if s == nil {
		return nil
	}
	p := v.peers[host]
	if p == nil || s.head == 0 || prev != s.head {
		if s.head != 0 {
			v.log.Debug("a presence message missed: waiting for the next snapshot", "peer", host)
		}
		s.head = 0
		// Still the newest word on this one entity (forward: nothing
		// newer was heard from its host), so it is applied: an entity
		// that joins while this view waits for a snapshot (this gateway
		// just started, or trusted its host only now) is reachable by name
		// at once, not an interval later. The row is provisional: the next
		// snapshot replaces the view (it survives one that does not name
		// it yet for an interval, as a row learned otherwise does).
		if p == nil {
			p = &peer{entities: map[string]*heardRow{}, interval: interval, heard: now}
			v.peers[host] = p
		}
		if c.Row != nil {
			p.entities[c.Row.Gid] = &heardRow{row: *c.Row, learned: now}
			v.knowLocked(*c.Row, now)
		} else {
			delete(p.entities, c.Gone)
			v.forgetLocked(c.Gone)
		}
		return nil
	}
	s.head = seq
	p.heard, p.interval = now, interval
	delete(v.gone, host)
	if c.Row != nil {
		p.entities[c.Row.Gid] = &heardRow{row: *c.Row}
		v.knowLocked(*c.Row, now)
	} else {
		delete(p.entities, c.Gone)
		v.forgetLocked(c.Gone)
	}
	return nil
}

// forward returns host's stream if seq is newer than anything heard of
// host (and than its last leaving notice), nil if it is superseded.
func (v *peerView) forward(host string, seq int64) *stream {
	if seq <= v.left[host] {
		return nil // announced before its host's leaving notice
	}
	s := v.streams[host]
	if s == nil {
		s = &stream{}
		v.streams[host] = s
	}
	if seq <= s.maxSeq {
		return nil // older than what was heard since, or heard before
	}
	s.maxSeq = seq
	return s
}

// Leave drops host at once: it stopped cleanly. A leaving notice heard
// before is a replay; one older than the host's latest presence is too,
// unless within an interval of it (then the newer word stands).
func (v *peerView) Leave(host string, seq int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if seq <= v.left[host] {
		return broker.Refuse(broker.ReasonReplay, "leaving notice of %s heard before: a replay", host)
	}
	if s := v.streams[host]; s != nil && seq <= s.maxSeq {
		interval := v.interval
		if p := v.peers[host]; p != nil {
			interval = p.interval
		}
		if s.maxSeq-seq <= int64(interval) {
			return nil
		}
		return broker.Refuse(broker.ReasonReplay, "leaving notice of %s older than its latest presence: a replay", host)
	}
	v.left[host] = seq
	delete(v.streams, host)
	if p := v.peers[host]; p != nil {
		v.seenLocked(host, p.heard)
		delete(v.peers, host)
		v.log.Info("host left the view: it stopped", "peer", host)
	}
	return nil
}

// Legacy notes a per-entity heartbeat of host (a gateway before
// snapshots): not folded, said once per host.
func (v *peerView) Legacy(host string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.legacy[host] || len(v.legacy) >= 1024 {
		return
	}
	v.legacy[host] = true
	v.log.Warn("a host announces presence per entity (an older fleet): its entities are not in this roster until it is upgraded",
		"peer", host)
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
// otherwise than by its presence (a control answer): the host's next
// snapshot or notice of it replaces it.
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
	if interval > 0 && p.heard.IsZero() {
		p.interval = interval
	}
	p.entities[row.Gid] = &heardRow{row: row, learned: heard}
	v.knowLocked(row, heard)
}

// Drop forgets one remote entity: its host said it stopped.
func (v *peerView) Drop(host, gid string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.peers[host]; p != nil {
		delete(p.entities, gid)
	}
	v.forgetLocked(gid)
}

// Rows returns the other hosts' entities with their presence status: while
// this gateway is cut off from the broker (connected false) every one reads
// "unknown"; one not heard for two of its host's intervals "stale"; a host
// not heard within ttl (or three of its intervals, if longer) is dropped
// from the view. An entity known but not in the view (its host stopped or
// was dropped: "gone"; or was not heard since this gateway started:
// "unknown") is still listed, as long as trusted says its host is. A
// row's last_seen is when its host was last heard (or when it was
// learned, if later).
func (v *peerView) Rows(now time.Time, connected bool, ttl time.Duration, trusted func(host string) bool) []api.EntityRow {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []api.EntityRow
	listed := map[string]bool{}
	for host, p := range v.peers {
		limit := max(ttl, 3*p.interval)
		dropped := 0
		for gid, h := range p.entities {
			heard := p.heard
			if h.learned.After(heard) {
				heard = h.learned
			}
			age := now.Sub(heard)
			if connected && age > limit {
				delete(p.entities, gid)
				dropped++
				continue
			}
			r := h.row
			r.LastSeen = heard.UTC()
			switch {
			case !connected:
				r.Status, r.StatusSince = "unknown", time.Time{}
			case age > 2*p.interval:
				r.Status, r.StatusSince = "stale", time.Time{}
			}
			out = append(out, r)
			listed[gid] = true
		}
		if connected && now.Sub(p.heard) > limit && len(p.entities) == 0 {
			delete(v.peers, host)
			delete(v.streams, host)
			if !p.heard.IsZero() { // not one only learned of from a control answer
				v.seenLocked(host, p.heard)
				v.log.Info("host dropped from the view: not heard within the presence TTL", "peer", host, "entities", dropped)
			}
		}
	}
	for gid, k := range v.known {
		if listed[gid] || !trusted(k.row.Host) {
			continue
		}
		r := k.row
		r.Groups = slices.Clone(r.Groups)
		r.Status, r.StatusSince = "unknown", time.Time{}
		if _, gone := v.gone[r.Host]; connected && gone {
			r.Status = "gone"
		}
		if !k.seen.IsZero() {
			r.LastSeen = k.seen.UTC()
		}
		out = append(out, r)
	}
	return out
}

// How a host reads in the peers' view (HostState, fleet-gw status).
const (
	hostLive      = "live"      // heard within two of its intervals
	hostStale     = "stale"     // not heard for two of its intervals
	hostGone      = "gone"      // stopped, or not heard within the presence TTL
	hostUnknown   = "unknown"   // not heard since this gateway started, or the broker is cut off
	hostUntrusted = "untrusted" // heard, but not in this host's trust file
)

// HostState is how host reads at now — live, stale, gone or unknown
// (while cut off from the broker, connected false, every host is) — and
// when it was last heard (zero: not since this gateway started). A host
// not heard within ttl (or three of its intervals, if longer) reads gone
// before Rows drops it from the view.
func (v *peerView) HostState(host string, now time.Time, connected bool, ttl time.Duration) (string, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hostLocked(host, now, connected, ttl)
}

// hostLocked is HostState; v.mu is held.
func (v *peerView) hostLocked(host string, now time.Time, connected bool, ttl time.Duration) (string, time.Time) {
	if p := v.peers[host]; p != nil {
		switch age := now.Sub(p.heard); {
		case p.heard.IsZero() || !connected: // only learned of from a control answer
			return hostUnknown, p.heard
		case age > max(ttl, 3*p.interval):
			return hostGone, p.heard
		case age > 2*p.interval:
			return hostStale, p.heard
		default:
			return hostLive, p.heard
		}
	}
	if at, gone := v.gone[host]; gone && connected {
		return hostGone, at
	}
	return hostUnknown, v.gone[host]
}

// States is how each host in the view, or gone from it, reads at now
// (HostState): what the watch stream's peer events follow.
func (v *peerView) States(now time.Time, connected bool, ttl time.Duration) map[string]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]string, len(v.peers)+len(v.gone))
	for h := range v.peers {
		out[h], _ = v.hostLocked(h, now, connected, ttl)
	}
	for h := range v.gone {
		if _, ok := out[h]; !ok {
			out[h], _ = v.hostLocked(h, now, connected, ttl)
		}
	}
	return out
}

// Peers lists the other hosts, sorted: the trusted ones (from the trust
// file, this host left out) and every host in the view or gone from it,
// each with its state; a host heard but not trusted reads untrusted.
func (v *peerView) Peers(now time.Time, connected bool, ttl time.Duration, trusted []string, untrusted []api.EntityRow) []api.PeerStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	byHost := map[string]*api.PeerStatus{}
	add := func(host string, isTrusted bool) {
		if byHost[host] != nil {
			return
		}
		state, heard := v.hostLocked(host, now, connected, ttl)
		if !isTrusted {
			state = hostUntrusted
		}
		byHost[host] = &api.PeerStatus{Host: host, Trusted: isTrusted, State: state, LastHeard: heard.UTC()}
		if heard.IsZero() {
			byHost[host].LastHeard = time.Time{}
		}
	}
	for _, h := range trusted {
		add(h, true)
	}
	for h := range v.peers {
		add(h, false)
	}
	for h := range v.gone {
		add(h, false)
	}
	for _, r := range untrusted {
		if byHost[r.Host] == nil {
			byHost[r.Host] = &api.PeerStatus{Host: r.Host, State: hostUntrusted, LastHeard: r.LastSeen.UTC()}
		}
	}
	out := make([]api.PeerStatus, 0, len(byHost))
	for _, p := range byHost {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b api.PeerStatus) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// hostAway says that host reads stale or gone, since when (""
// otherwise): what an ask fails with and a send warns of.
func hostAway(host, state string, heard, now time.Time) string {
	if state != hostStale && state != hostGone {
		return ""
	}
	if heard.IsZero() {
		return fmt.Sprintf("host %s is %s: not heard since this gateway started", host, state)
	}
	return fmt.Sprintf("host %s is %s: last heard %s ago (%s)", host, state,
		now.Sub(heard).Round(time.Second), heard.UTC().Format(time.RFC3339))
}
