package gateway

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
)

// Presence (U5) is soft state, and its traffic grows with hosts, not with
// entities. Every presence-interval each gateway publishes one snapshot of
// all its entities (status, pending, groups, mode, last activity) with key
// roster.<host>.snapshot — split into pages when big — and at once, when
// an entity joins, leaves or changes status or groups, a small change
// notice with key roster.<host>.change; a gateway that stops cleanly
// publishes roster.<host>.leaving. So a host costs the broker one message
// per interval (copied to every gateway's roster queue) whatever its
// entities, plus one per change: 100 hosts of 100 entities publish 20
// messages/s at the default 5s, not 2,000 (scripts/bench-presence.sh).
//
// A host's messages form a chain: each carries its sequence (seq, the
// sender's clock in ns, strictly increasing) and the sequence of the
// message the host published before it (prev). The announcer hands them
// to the broker one at a time in sequence order, and one channel and one
// queue keep that order to every receiver. A receiver replaces its view
// of a host with each complete snapshot, and applies a change notice only
// if it follows on the last message it applied (prev == head): a notice
// after a gap (a message lost while this gateway or the broker was away)
// or out of order says only "something changed" that this view cannot
// place, so it waits for the next snapshot, at most an interval away —
// never a wrong row. A snapshot's pages are themselves links of the chain,
// so a page lost or out of order leaves that snapshot unapplied.
//
// Every gateway folds what it hears into one union view (peers.go): a
// host's rows are as fresh as the last snapshot or in-sequence notice of
// it; not heard for two of its intervals they read "stale", for
// presence-ttl the host is dropped; while this gateway is cut off from the
// broker, every remote entity reads "unknown" with the time it was last
// heard. A restarted gateway rebuilds the view within one interval, since
// every gateway sends a whole snapshot every interval.

// A host speaks only for itself, and only forward: presence is admitted
// only when its body names the host that signed it, every row's gid was
// made on that host, and its sequence is within the presence TTL of now;
// a message no newer than the newest heard from its host is superseded
// and ignored; a leaving notice older than what was heard since from that
// host is a replay and refused (bridge.dlq). Hosts' clocks must agree
// within the presence TTL.

// Mixed versions: gateways before snapshots announced each entity in its
// own message (a body with "entity" or "gone"). This one does not fold
// those: it logs once per host that the host runs an older fleet and
// ignores its entities until it is upgraded. An older gateway ignores
// snapshots and change notices (bodies it has no case for) the same way.
// The leaving notice kept its shape, so both still drop a host that stops.

// presenceBody is the body of a PRESENCE message: exactly one of
// Snapshot, Change and Leaving.
type presenceBody struct {
	Host       string          `json:"host"`
	Seq        int64           `json:"seq"`  // sender's clock, ns, strictly increasing
	Prev       int64           `json:"prev"` // the seq of the host's previous presence message (0: none)
	IntervalMS int64           `json:"interval_ms"`
	Snapshot   *snapshotPage   `json:"snapshot,omitempty"`
	Change     *presenceChange `json:"change,omitempty"`
	Leaving    bool            `json:"leaving,omitempty"`
	// Cert is the host's operator certificate, on every presence message
	// of a certified host; Revoked the operators' revocation lists the
	// host holds, on the first page of each snapshot (certs.go). Older
	// gateways ignore both.
	Cert    string   `json:"cert,omitempty"`
	Revoked []string `json:"revoked,omitempty"`
	// Admits: the other hosts this host admits now, on the first page of
	// each snapshot; AdmitsCertified: it also admits hosts its operators
	// certify (admits.go). Older gateways send neither (unknown).
	Admits          *[]string `json:"admits,omitempty"`
	AdmitsCertified bool      `json:"admits_certified,omitempty"`
	// what gateways before snapshots sent, one message per entity:
	// recognised only to be ignored (see Mixed versions above)
	Entity json.RawMessage `json:"entity,omitempty"`
	Gone   string          `json:"gone,omitempty"`
}

// snapshotPage is one page of a host's snapshot: all of its entities are
// the rows of pages 0 .. Pages-1, published one after another.
type snapshotPage struct {
	ID    int64             `json:"id"`   // the seq of page 0: which snapshot this page is of
	Page  int               `json:"page"` // 0 .. Pages-1
	Pages int               `json:"pages"`
	Rows  []json.RawMessage `json:"rows"` // api.EntityRow each, without host or target
}

// presenceChange is a change notice: exactly one of Row and Gone.
type presenceChange struct {
	Row  *api.EntityRow `json:"row,omitempty"`  // joined, or its status or groups changed: the row as it is now
	Gone string         `json:"gone,omitempty"` // the gid of an entity that left
}

// Bounds of a snapshot. A page carries at most presencePageBytes of rows
// (a row is a few hundred bytes; 64 groups of long names make one a few
// KiB), well within the 1 MiB a roster delivery may hold
// (broker.takePresence) and the broker's message size. A receiver holds
// one partial snapshot per host and refuses one of more than
// maxSnapshotPages pages or maxSnapshotRows rows: what a host can make
// another hold is bounded.
const (
	presencePageBytes = 256 << 10
	maxSnapshotPages  = 256
	maxSnapshotRows   = 65536
	// maxPresenceInterval bounds the interval a host claims: its rows
	// stay in the view for three of them after it was last heard.
	maxPresenceInterval = 24 * time.Hour
)

// snapshotPages splits rows (each already JSON) into pages of at most
// pageBytes of rows; a row bigger than that has a page of its own. No
// rows make one empty page: a host with no entities still says it lives.
func snapshotPages(rows []json.RawMessage, pageBytes int) []snapshotPage {
	pages := []snapshotPage{{Rows: []json.RawMessage{}}}
	size := 0
	for _, r := range rows {
		cur := &pages[len(pages)-1]
		if len(cur.Rows) > 0 && size+len(r)+1 > pageBytes {
			pages = append(pages, snapshotPage{})
			cur, size = &pages[len(pages)-1], 0
		}
		cur.Rows = append(cur.Rows, r)
		size += len(r) + 1
	}
	for i := range pages {
		pages[i].Page, pages[i].Pages = i, len(pages)
	}
	return pages
}

// announceEntity tells the other hosts at once that an entity joined or
// changed status or groups, without waiting for the interval.
func (g *Gateway) announceEntity(gid string) {
	if g.br == nil {
		return
	}
	g.side.Go(func() { g.notice(gid) })
}

// announceGone tells the other hosts at once that an entity left.
func (g *Gateway) announceGone(gid string) {
	if g.br == nil {
		return
	}
	g.notice(gid)
}

// notice publishes a change notice for gid: its row as it is when the
// notice is published, or gone if it is no longer here. Reading the row
// in the chain's turn, not when the change happened, means two quick
// changes can never reach the other hosts in the wrong order: whichever
// notice goes last carries the latest state.
func (g *Gateway) notice(gid string) {
	a := g.said
	a.out.Lock()
	var c presenceChange
	if b := g.box(gid); b != nil {
		r := g.row(b.snapshot(), nil, nil)
		r.Host, r.Target = "", "" // the host is the message's; a pane or command is this host's business
		onWire(&r)
		c.Row = &r
		a.Said(gid, r.Status)
	} else {
		c.Gone = gid
		a.Said(gid, "")
	}
	confirmed, err := g.sendPresence("change", presenceBody{Seq: a.Next(), Change: &c})
	a.out.Unlock()
	if err == nil {
		err = confirmed()
	}
	if err != nil {
		g.log.Debug("presence change not announced", "gid", gid, "err", err)
	}
}

// statusSettle is how long a status change from an ask waits before it is
// announced: an ask answered within it ("waiting", then back) costs the
// fleet no presence traffic at all, where announcing each change would
// put two presence messages, copied to every gateway, beside each ask. A
// longer ask reads "waiting" on the other hosts this much later; the local
// roster shows it at once either way.
const statusSettle = 500 * time.Millisecond

// announcer owns what this gateway has said of its own entities: the
// chain of its presence messages, the status last announced per entity,
// and the settled announcements scheduled.
type announcer struct {
	// out is held from taking a message's place in the chain until the
	// broker has it on its channel, so the chain reaches every receiver
	// in order (a snapshot's pages one after another, no notice between)
	out  sync.Mutex
	prev int64 // under out: the seq of the last message handed to the broker

	mu   sync.Mutex
	seq  int64             // the last presence sequence taken
	said map[string]string // gid -> the status last announced
	due  map[string]bool   // gid -> a settled status announcement is scheduled
	big  int               // the entities last found too many for a snapshot (logged once per count)
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
		if b == nil || wireStatus(g.row(b.snapshot(), nil, nil).Status) == said {
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
		// a name more than one trusted host has, told once (names.go)
		g.names.TellAll(g.cfg.Host, append(g.reg.Rows(), g.remoteRows()...))
	}
}

// sendPresence hands one presence message (b.Seq taken, g.said.out held)
// to the broker as the next link of this host's chain. A message the
// broker did not take leaves the chain where it was; one taken but not
// confirmed may or may not reach the others, and the chain moves on: a
// receiver that missed it waits for the next snapshot.
func (g *Gateway) sendPresence(what string, b presenceBody) (confirmed func() error, err error) {
	b.Host, b.IntervalMS, b.Prev = g.cfg.Host, g.cfg.PresenceInterval.Milliseconds(), g.said.prev
	b.Cert, _ = g.admit.certified().Present()
	body, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	env := envelope.New(envelope.Presence, envelope.Party{Host: g.cfg.Host}, envelope.Party{Group: "roster"}, string(body))
	confirmed, err = g.br.PublishPresence(env, what, 2*g.cfg.PresenceTTL)
	if err != nil {
		return nil, err
	}
	g.said.prev = b.Seq
	return confirmed, nil
}

// announce publishes a snapshot of every local entity, in as few pages as
// fit; the pages are written one after another and their confirms awaited
// together, so a big snapshot takes a moment, not a round trip a page.
func (g *Gateway) announce() {
	g.admit.certified().Refresh() // a certificate installed, a revocation list imported
	_, lists := g.admit.certified().Present()
	a := g.said
	a.out.Lock()
	rows, err := g.localRows()
	if err != nil {
		a.out.Unlock()
		return
	}
	if len(rows) > maxSnapshotRows {
		g.tooMany(len(rows))
		rows = rows[:maxSnapshotRows]
	}
	raw := make([]json.RawMessage, 0, len(rows))
	for i := range rows {
		r := &rows[i]
		onWire(r)
		a.Said(r.Gid, r.Status)
		r.Host, r.Target = "", "" // the host is the message's; a pane or command is this host's business
		j, err := json.Marshal(r)
		if err != nil {
			continue
		}
		raw = append(raw, j)
	}
	pages := snapshotPages(raw, presencePageBytes)
	if len(pages) > maxSnapshotPages {
		g.tooMany(len(rows))
		pages = pages[:maxSnapshotPages]
		for i := range pages {
			pages[i].Pages = maxSnapshotPages
		}
	}
	var waits []func() error
	for i := range pages {
		seq := a.Next()
		if i == 0 {
			for j := range pages {
				pages[j].ID = seq
			}
		}
		b := presenceBody{Seq: seq, Snapshot: &pages[i]}
		if i == 0 {
			b.Revoked = lists
			admits := admitsList(g.admit.trustedHosts())
			b.Admits, b.AdmitsCertified = &admits, g.admit.admitsCertified()
		}
		confirmed, err := g.sendPresence("snapshot", b)
		if err != nil {
			g.log.Debug("presence snapshot not announced", "page", i, "pages", len(pages), "err", err)
			break // the rest could not complete it
		}
		waits = append(waits, confirmed)
	}
	a.out.Unlock()
	for _, w := range waits {
		if err := w(); err != nil {
			g.log.Debug("presence snapshot not confirmed", "err", err)
			return
		}
	}
}

// tooMany says, once per count, that this host has more entities than a
// snapshot carries: the others see only the first ones.
func (g *Gateway) tooMany(n int) {
	a := g.said
	a.mu.Lock()
	say := a.big != n
	a.big = n
	a.mu.Unlock()
	if say {
		g.log.Error("too many entities for a presence snapshot: the other hosts see only the first ones",
			"entities", n, "max_rows", maxSnapshotRows, "max_pages", maxSnapshotPages)
	}
}

// announceLeaving tells the other hosts this gateway stops: they drop it
// now, not after the TTL. It is the chain's last link.
func (g *Gateway) announceLeaving() {
	a := g.said
	a.out.Lock()
	confirmed, err := g.sendPresence("leaving", presenceBody{Seq: a.Next(), Leaving: true})
	a.out.Unlock()
	if err == nil {
		_ = confirmed()
	}
}

// onPresence folds a presence message heard from another host into the
// view, after checking that its host speaks for itself and moves forward,
// and that every field fits: what comes from the broker is hostile until
// it is checked.
func (g *Gateway) onPresence(env *envelope.Envelope) error {
	err := g.foldPresence(env)
	g.saveHeard()
	return err
}

// saveHeard stores what changed in the last word on remote entities
// (peers.go); one caller at a time, so an older save never lands last.
func (g *Gateway) saveHeard() {
	g.heardMu.Lock()
	defer g.heardMu.Unlock()
	put, drop := g.peers.Unsaved()
	if err := g.st.SaveHeard(put, drop); err != nil {
		gids := drop
		for _, h := range put {
			gids = append(gids, h.Gid)
		}
		g.peers.Unsave(gids)
		g.log.Warn("could not keep the remote entities heard: kept in memory, saved at the next change", "err", err)
	}
}

func (g *Gateway) foldPresence(env *envelope.Envelope) error {
	var b presenceBody
	if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "presence body: %v", err)
	}
	if b.Host != env.Sender.Host { // the sender host is the signer's (admit.go)
		what := "a leaving notice"
		switch {
		case b.Snapshot != nil:
			what = "a snapshot"
		case b.Change != nil:
			what = "a change notice"
		case b.Entity != nil || b.Gone != "":
			what = "an entity"
		}
		return broker.Refuse(broker.ReasonWrongHost, "presence (%s) about host %q signed by %q", what, b.Host, env.Sender.Host)
	}
	if b.Host == g.cfg.Host {
		return nil // the local view is exact
	}
	if len(b.Revoked) > 0 { // revocations spread with any admitted host's snapshots
		g.admit.certified().Hear(b.Revoked, b.Host)
	}
	now := time.Now()
	if b.Snapshot != nil && b.Snapshot.Page == 0 && b.Admits != nil {
		g.admits.heard(b.Host, *b.Admits, b.AdmitsCertified, now)
	}
	seq := b.Seq
	if seq == 0 {
		seq = env.Created.UnixNano()
	}
	if age := now.Sub(time.Unix(0, seq)); age > g.cfg.PresenceTTL || -age > g.cfg.PresenceTTL {
		return broker.Refuse(broker.ReasonReplay, "presence sequence %s is not within the presence TTL (%v) of now",
			time.Unix(0, seq).UTC().Format(time.RFC3339Nano), g.cfg.PresenceTTL)
	}
	kinds := 0
	for _, set := range []bool{b.Snapshot != nil, b.Change != nil, b.Leaving} {
		if set {
			kinds++
		}
	}
	if kinds == 0 && (b.Entity != nil || b.Gone != "") {
		g.peers.Legacy(b.Host)
		return nil
	}
	if kinds != 1 {
		return broker.Refuse(broker.ReasonMalformed, "presence is not exactly one of a snapshot, a change notice and a leaving notice")
	}
	if b.Leaving {
		return g.peers.Leave(b.Host, seq)
	}
	// what it says first (whose entities: a host speaks only for itself),
	// then where it stands in the host's chain
	var rows []api.EntityRow
	if c := b.Change; c != nil {
		switch {
		case (c.Row == nil) == (c.Gone == ""):
			return broker.Refuse(broker.ReasonMalformed, "a change notice is exactly one of a row and a gone gid")
		case c.Row != nil:
			if err := checkHeard(c.Row, b.Host); err != nil {
				return err
			}
		default:
			if !ident.IsGid(c.Gone) {
				return broker.Refuse(broker.ReasonMalformed, "gone %q is not a gid", c.Gone)
			}
			if made := ident.GidHost(c.Gone); made != b.Host {
				return broker.Refuse(broker.ReasonWrongHost, "host %s says entity %s is gone, which was made on %s", b.Host, c.Gone, made)
			}
		}
	} else {
		p := b.Snapshot
		switch {
		case p.Pages < 1 || p.Pages > maxSnapshotPages:
			return broker.Refuse(broker.ReasonMalformed, "a snapshot of %d pages (at most %d)", p.Pages, maxSnapshotPages)
		case p.Page < 0 || p.Page >= p.Pages:
			return broker.Refuse(broker.ReasonMalformed, "snapshot page %d of %d", p.Page, p.Pages)
		case len(p.Rows) > maxSnapshotRows:
			return broker.Refuse(broker.ReasonMalformed, "a snapshot page of %d rows (at most %d)", len(p.Rows), maxSnapshotRows)
		}
		rows = make([]api.EntityRow, len(p.Rows))
		for i, raw := range p.Rows {
			if err := json.Unmarshal(raw, &rows[i]); err != nil {
				return broker.Refuse(broker.ReasonMalformed, "snapshot row %d: %v", i, err)
			}
			if err := checkHeard(&rows[i], b.Host); err != nil {
				return err
			}
		}
	}
	interval := time.Duration(b.IntervalMS) * time.Millisecond
	switch {
	case b.Seq <= 0:
		return broker.Refuse(broker.ReasonMalformed, "presence has no sequence")
	case b.Prev < 0 || b.Prev >= b.Seq:
		return broker.Refuse(broker.ReasonMalformed, "presence prev %d is not before its seq %d", b.Prev, b.Seq)
	case interval <= 0 || interval > maxPresenceInterval:
		return broker.Refuse(broker.ReasonMalformed, "presence interval_ms %d is not within (0, %v]", b.IntervalMS, maxPresenceInterval)
	}
	if b.Change != nil {
		return g.peers.Change(b.Host, b.Seq, b.Prev, interval, *b.Change, now)
	}
	p := b.Snapshot
	if p.Page == 0 && p.ID != b.Seq || p.Page > 0 && (p.ID <= 0 || p.ID >= b.Seq) {
		return broker.Refuse(broker.ReasonMalformed, "snapshot id %d does not fit page %d of seq %d", p.ID, p.Page, b.Seq)
	}
	return g.peers.Page(b.Host, b.Seq, b.Prev, interval, p.ID, p.Page, p.Pages, rows, now)
}

// checkHeard holds a row host announced to the grammar of local ones, and
// to its host: a gid names the host it was made on, and a host announces
// only its own entities, whoever heard of them first.
func checkHeard(r *api.EntityRow, host string) error {
	if err := checkRow(r); err != nil {
		return err
	}
	if made := ident.GidHost(r.Gid); made != host {
		return broker.Refuse(broker.ReasonWrongHost, "host %s claims entity %s, which was made on %s", host, r.Gid, made)
	}
	// what a host says of its entity beyond its state is not shown here
	r.Host, r.Target, r.LastSeen, r.StatusReason, r.Program, r.NameHolder = host, "", time.Time{}, "", "", ""
	return nil
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
	case r.Mode != "inject" && r.Mode != "pull" && r.Mode != "hook":
		return bad("mode %q is not inject, pull or hook", r.Mode)
	case !knownStatus(r.Status):
		return bad("status %q is not one of %s", r.Status, strings.Join(statuses, ", "))
	case len(r.Groups) > 64:
		return bad("%d groups", len(r.Groups))
	case r.Pending < 0 || r.Dead < 0:
		return bad("pending %d, dead %d", r.Pending, r.Dead)
	}
	for _, gr := range r.Groups {
		if !ident.ValidGroup(gr) {
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
	trusted := g.admit.trustedNow()
	out := g.peers.Rows(time.Now(), g.br != nil && g.br.Connected(), g.cfg.PresenceTTL, trusted)
	// a host no longer trusted (its line removed, its certificate revoked
	// or expired) is gone from the roster at once, not when its rows age out
	out = slices.DeleteFunc(out, func(r api.EntityRow) bool { return !trusted(r.Host) })
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
