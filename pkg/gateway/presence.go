package gateway

import (
	"cmp"
	"encoding/json"
	"slices"
	"strings"
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
	// SealKey is the host's current public sealing key (age1...,
	// pkg/seal), on every presence message: what the other hosts seal
	// its messages to, before the key its certificate or trust line
	// names (sealkeys.go). Older gateways send none and ignore it.
	SealKey string `json:"seal_key,omitempty"`
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
	if b.SealKey != "" { // the key of a message admitted whole; peers.go checks it
		g.peers.HearSealKey(b.Host, b.Seq, b.SealKey)
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
	slices.SortFunc(out, func(a, b api.EntityRow) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Host, b.Host))
	})
	return out
}
