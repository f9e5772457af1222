package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/store"
)

// The receiving half of presence on its own: a gateway h1 (no broker)
// fed the messages another host h2 publishes, encoded as presence.go
// encodes them.

const testInterval = 200 * time.Millisecond

type presenceRig struct {
	t   *testing.T
	g   *Gateway
	log *bytes.Buffer
	seq int64 // h2's chain: the last seq it published
}

func newPresenceRig(t *testing.T) *presenceRig {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	g := &Gateway{
		cfg:   &config.Config{Host: "h1", PresenceInterval: testInterval, PresenceTTL: 3 * testInterval},
		peers: newPeerView(testInterval, log),
		log:   log,
		st:    st,
	}
	return &presenceRig{t: t, g: g, log: &buf, seq: time.Now().UnixNano()}
}

// next is h2's next message: its seq and the prev that chains it.
func (r *presenceRig) next() (seq, prev int64) {
	prev = r.seq
	r.seq = max(time.Now().UnixNano(), r.seq+1) // as announcer.Next
	return r.seq, prev
}

// deliver hands body, as signed by host, to h1's presence handler.
func (r *presenceRig) deliver(host string, b presenceBody) error {
	if b.Host == "" {
		b.Host = host
	}
	if b.IntervalMS == 0 {
		b.IntervalMS = testInterval.Milliseconds()
	}
	body, err := json.Marshal(b)
	if err != nil {
		r.t.Fatal(err)
	}
	env := envelope.New(envelope.Presence, envelope.Party{Host: host}, envelope.Party{Group: "roster"}, string(body))
	return r.g.onPresence(env)
}

// mustDeliver delivers b from h2 and fails the test on a refusal.
func (r *presenceRig) mustDeliver(b presenceBody) {
	r.t.Helper()
	if err := r.deliver("h2", b); err != nil {
		r.t.Fatalf("refused: %v", err)
	}
}

// snapshot returns h2's snapshot of rows as pages of at most pageBytes,
// each the next link of h2's chain.
func (r *presenceRig) snapshot(rows []api.EntityRow, pageBytes int) []presenceBody {
	var raw []json.RawMessage
	for _, row := range rows {
		j, err := json.Marshal(row)
		if err != nil {
			r.t.Fatal(err)
		}
		raw = append(raw, j)
	}
	pages := snapshotPages(raw, pageBytes)
	out := make([]presenceBody, len(pages))
	for i := range pages {
		seq, prev := r.next()
		if i == 0 {
			for j := range pages {
				pages[j].ID = seq
			}
		}
		out[i] = presenceBody{Seq: seq, Prev: prev, Snapshot: &pages[i]}
	}
	return out
}

// change returns h2's next change notice.
func (r *presenceRig) change(c presenceChange) presenceBody {
	seq, prev := r.next()
	return presenceBody{Seq: seq, Prev: prev, Change: &c}
}

// view is h1's remote rows, by name.
func (r *presenceRig) view(now time.Time) map[string]api.EntityRow {
	out := map[string]api.EntityRow{}
	for _, row := range r.g.peers.Rows(now, true, r.g.cfg.PresenceTTL, allTrusted) {
		out[row.Name] = row
	}
	return out
}

func rowsOf(host string, n int) []api.EntityRow {
	out := make([]api.EntityRow, n)
	for i := range out {
		out[i] = api.EntityRow{Name: fmt.Sprintf("e%d", i), Gid: fmt.Sprintf("%s.01a22a93-8b62-7719-997e-dae6eae1%04d", host, i),
			Mode: "pull", Groups: []string{"ops"}, Status: "idle", Pending: i}
	}
	return out
}

// A snapshot in pages is applied whole when its last page arrives; change
// notices in sequence apply at once; after a gap nothing is applied until
// the next snapshot, which brings the view back exactly; a snapshot with
// a page missing is not applied; a leaving notice drops the host.
func TestPresenceSnapshotsAndNotices(t *testing.T) {
	r := newPresenceRig(t)
	rows := rowsOf("h2", 10)
	pages := r.snapshot(rows, 400)
	if len(pages) < 3 {
		t.Fatalf("%d pages of 10 rows at 400 bytes, want several", len(pages))
	}
	for i, p := range pages {
		if n := len(r.view(time.Now())); n != 0 {
			t.Fatalf("before page %d of %d: %d rows in the view, want none until the snapshot is whole", i, len(pages), n)
		}
		r.mustDeliver(p)
	}
	v := r.view(time.Now())
	if len(v) != 10 || v["e3"].Host != "h2" || v["e3"].Status != "idle" || v["e3"].Pending != 3 || v["e3"].LastSeen.IsZero() {
		t.Fatalf("after the snapshot: %d rows, e3 %+v", len(v), v["e3"])
	}
	if !strings.Contains(r.log.String(), `"msg":"host joined the view","peer":"h2"`) {
		t.Errorf("no joined line:\n%s", r.log)
	}

	// in sequence: applied
	busy := rows[3]
	busy.Status = "busy"
	r.mustDeliver(r.change(presenceChange{Row: &busy}))
	r.mustDeliver(r.change(presenceChange{Gone: rows[4].Gid}))
	joined := rowsOf("h2", 11)[10]
	r.mustDeliver(r.change(presenceChange{Row: &joined}))
	v = r.view(time.Now())
	if v["e3"].Status != "busy" || len(v) != 10 || v["e4"].Gid != "" || v["e10"].Gid != joined.Gid {
		t.Fatalf("after notices in sequence: %d rows, e3 %q, e4 %q, e10 %q", len(v), v["e3"].Status, v["e4"].Gid, v["e10"].Gid)
	}

	// a notice lost: what it said is missing until the next snapshot;
	// the later ones, each the newest word on its own entity, apply
	r.change(presenceChange{Gone: rows[5].Gid}) // never delivered
	r.mustDeliver(r.change(presenceChange{Gone: rows[6].Gid}))
	r.mustDeliver(r.change(presenceChange{Gone: rows[7].Gid}))
	v = r.view(time.Now())
	if v["e5"].Gid == "" || v["e6"].Gid != "" || v["e7"].Gid != "" {
		t.Fatalf("after a gap: e5 %q (the lost notice's: kept until the snapshot), e6 %q e7 %q (gone)", v["e5"].Gid, v["e6"].Gid, v["e7"].Gid)
	}
	// the next snapshot brings the view back exactly
	now := append([]api.EntityRow{}, rows[:4]...)
	now[3] = busy
	now = append(now, rows[8], rows[9], joined)
	for _, p := range r.snapshot(now, 1<<20) {
		r.mustDeliver(p)
	}
	v = r.view(time.Now())
	if len(v) != 7 || v["e5"].Gid != "" || v["e3"].Status != "busy" {
		t.Fatalf("after the next snapshot: %d rows %v", len(v), v)
	}
	// and notices apply again
	r.mustDeliver(r.change(presenceChange{Gone: rows[0].Gid}))
	if v = r.view(time.Now()); v["e0"].Gid != "" {
		t.Fatal("a notice after the snapshot was not applied")
	}

	// a snapshot with a page missing is not applied, nor are notices after it
	pages = r.snapshot(rowsOf("h2", 3), 100)
	if len(pages) != 3 {
		t.Fatalf("%d pages", len(pages))
	}
	r.mustDeliver(pages[0])
	r.mustDeliver(pages[2])
	if v = r.view(time.Now()); len(v) != 6 {
		t.Fatalf("a snapshot with a page missing changed the view: %d rows", len(v))
	}
	// an old page again, or anything older than what was heard: ignored
	r.mustDeliver(pages[1])
	if v = r.view(time.Now()); len(v) != 6 {
		t.Fatalf("a page that arrived late changed the view: %d rows", len(v))
	}

	// a clean stop drops the host from the view at once; its entities
	// stay known, as gone, and are kept in the store
	seq, _ := r.next()
	r.mustDeliver(presenceBody{Seq: seq, Leaving: true})
	if v = r.view(time.Now()); len(v) != 6 {
		t.Fatalf("after the leaving notice: %d rows", len(v))
	}
	for _, row := range v {
		if row.Status != "gone" || row.LastSeen.IsZero() {
			t.Errorf("after the leaving notice: %+v", row)
		}
	}
	if kept, err := r.g.st.Heard(); err != nil || len(kept) != 6 {
		t.Errorf("kept %v %v", kept, err)
	}
	if !strings.Contains(r.log.String(), `"msg":"host left the view: it stopped","peer":"h2"`) {
		t.Errorf("no left line:\n%s", r.log)
	}
	// the same leaving notice again is a replay
	err := r.deliver("h2", presenceBody{Seq: seq, Leaving: true})
	if reasonOf(err) != broker.ReasonReplay {
		t.Errorf("the leaving notice again: %v", err)
	}
}

// A host's rows read stale after two of its intervals without a snapshot
// or notice in sequence, and the host is dropped after the TTL; a
// snapshot keeps it live, and so does an empty one.
func TestPresenceStaleThenGone(t *testing.T) {
	r := newPresenceRig(t)
	for _, p := range r.snapshot(rowsOf("h2", 2), 1<<20) {
		r.mustDeliver(p)
	}
	t0 := time.Now()
	for _, c := range []struct {
		after time.Duration
		want  string // status of e0
	}{{0, "idle"}, {2*testInterval + 50*time.Millisecond, "stale"}, {3*testInterval + 50*time.Millisecond, "gone"}} {
		if got := r.view(t0.Add(c.after))["e0"].Status; got != c.want {
			t.Fatalf("%v after the snapshot: e0 %q, want %q", c.after, got, c.want)
		}
	}
	if !strings.Contains(r.log.String(), `"msg":"host dropped from the view: not heard within the presence TTL","peer":"h2","entities":2`) {
		t.Errorf("no dropped line:\n%s", r.log)
	}
	// heard again: back
	for _, p := range r.snapshot(rowsOf("h2", 2), 1<<20) {
		r.mustDeliver(p)
	}
	if v := r.view(time.Now()); v["e1"].Status != "idle" {
		t.Fatalf("after a new snapshot: %v", v)
	}
	// cut off from the broker: every remote row reads unknown
	for _, row := range r.g.peers.Rows(time.Now(), false, r.g.cfg.PresenceTTL, allTrusted) {
		if row.Status != "unknown" {
			t.Errorf("cut off: %s reads %q", row.Name, row.Status)
		}
	}
}

func reasonOf(err error) string {
	var ref *broker.Refusal
	if errors.As(err, &ref) {
		return ref.Reason
	}
	return fmt.Sprint("not a refusal: ", err)
}

// Every field from the broker is checked: what does not fit is refused
// with its reason, and nothing of it reaches the view.
func TestPresenceRefusesWhatDoesNotFit(t *testing.T) {
	r := newPresenceRig(t)
	good := rowsOf("h2", 2)
	page := func(mod func(b *presenceBody)) func() presenceBody {
		return func() presenceBody {
			b := r.snapshot(good, 1<<20)[0]
			mod(&b)
			return b
		}
	}
	rowJSON := func(row api.EntityRow) json.RawMessage { j, _ := json.Marshal(row); return j }
	stranger := rowsOf("h3", 1)[0]
	negative := good[0]
	negative.Pending = -1
	badStatus := good[0]
	badStatus.Status = "asleep"
	for _, c := range []struct {
		name, host, reason string
		body               func() presenceBody
	}{
		{"a body about another host", "h2", broker.ReasonWrongHost, page(func(b *presenceBody) { b.Host = "h3" })},
		{"a row made on another host", "h2", broker.ReasonWrongHost, page(func(b *presenceBody) { b.Snapshot.Rows[1] = rowJSON(stranger) })},
		{"a gone notice for another host's gid", "h2", broker.ReasonWrongHost, func() presenceBody { return r.change(presenceChange{Gone: stranger.Gid}) }},
		{"a changed row of another host", "h2", broker.ReasonWrongHost, func() presenceBody { return r.change(presenceChange{Row: &stranger}) }},
		{"the same gid twice", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Rows[1] = b.Snapshot.Rows[0] })},
		{"a negative pending count", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Rows[0] = rowJSON(negative) })},
		{"an unknown status", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Rows[0] = rowJSON(badStatus) })},
		{"a row that is not a row", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Rows[0] = json.RawMessage(`[1]`) })},
		{"too many pages", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Pages = maxSnapshotPages + 1 })},
		{"page past the last", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.Page = 1 })},
		{"page 0 of another snapshot", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Snapshot.ID-- })},
		{"prev not before seq", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Prev = b.Seq })},
		{"no interval", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.IntervalMS = -1 })},
		{"an interval of a year", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.IntervalMS = (365 * 24 * time.Hour).Milliseconds() })},
		{"a snapshot and a notice at once", "h2", broker.ReasonMalformed, page(func(b *presenceBody) { b.Change = &presenceChange{Gone: good[0].Gid} })},
		{"nothing at all", "h2", broker.ReasonMalformed, func() presenceBody { seq, prev := r.next(); return presenceBody{Seq: seq, Prev: prev} }},
		{"a notice with a row and a gone gid", "h2", broker.ReasonMalformed, func() presenceBody { return r.change(presenceChange{Row: &good[0], Gone: good[1].Gid}) }},
		{"a gone gid that is no gid", "h2", broker.ReasonMalformed, func() presenceBody { return r.change(presenceChange{Gone: "../../etc"}) }},
		{"a sequence from long ago", "h2", broker.ReasonReplay, page(func(b *presenceBody) {
			b.Seq = time.Now().Add(-time.Hour).UnixNano()
			b.Prev, b.Snapshot.ID = b.Seq-1, b.Seq
		})},
	} {
		if err := r.deliver(c.host, c.body()); reasonOf(err) != c.reason {
			t.Errorf("%s: %v, want %s", c.name, err, c.reason)
		}
		if v := r.view(time.Now()); len(v) != 0 {
			t.Fatalf("%s: reached the view: %v", c.name, v)
		}
	}
	// a snapshot over the row bound, in pages each within it (checking
	// 65,537 rows takes longer than the rig's TTL of 600 ms)
	r.g.cfg.PresenceTTL = time.Minute
	many := rowsOf("h2", 1)
	big := make([]api.EntityRow, 0, maxSnapshotRows+1)
	for i := range maxSnapshotRows + 1 {
		row := many[0]
		row.Name, row.Gid = fmt.Sprintf("n%d", i), fmt.Sprintf("h2.01a22a93-8b62-7719-997e-%012d", i)
		big = append(big, row)
	}
	var err error
	for _, p := range r.snapshot(big, presencePageBytes) {
		if err = r.deliver("h2", p); err != nil {
			break
		}
	}
	if reasonOf(err) != broker.ReasonMalformed || len(r.view(time.Now())) != 0 {
		t.Errorf("a snapshot of %d rows: %v", len(big), err)
	}
	// and the view still takes a good one
	for _, p := range r.snapshot(good, 1<<20) {
		r.mustDeliver(p)
	}
	if v := r.view(time.Now()); len(v) != 2 {
		t.Fatalf("after the refusals, a good snapshot: %v", v)
	}
}

// A page of the size the sender makes, of the biggest rows the grammar
// allows, fits what a roster delivery may hold.
func TestPresencePageFitsADelivery(t *testing.T) {
	row := rowsOf("h2", 1)[0]
	row.Name = strings.Repeat("n", 64)
	row.Groups = nil
	for i := range 64 {
		row.Groups = append(row.Groups, fmt.Sprintf("%s%02d", strings.Repeat("g", 62), i))
	}
	row.LastDelivery = time.Now()
	j, _ := json.Marshal(row)
	var raw []json.RawMessage
	for range 2 * presencePageBytes / len(j) {
		raw = append(raw, j)
	}
	pages := snapshotPages(raw, presencePageBytes)
	if len(pages) < 2 {
		t.Fatalf("%d pages", len(pages))
	}
	for _, p := range pages {
		p.ID = time.Now().UnixNano()
		body, _ := json.Marshal(presenceBody{Host: "h2", Seq: p.ID, IntervalMS: 5000, Snapshot: &p})
		env := envelope.New(envelope.Presence, envelope.Party{Host: "h2"}, envelope.Party{Group: "roster"}, string(body))
		wire, err := envelope.Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := envelope.Decode(wire, 1<<20); err != nil || len(body) > presencePageBytes+4096 {
			t.Fatalf("a page of %d rows, body %d bytes, on the wire %d: %v", len(p.Rows), len(body), len(wire), err)
		}
	}
}

// A per-entity heartbeat from a gateway before snapshots is ignored, said
// once per host; its leaving notice, which kept its shape, still drops
// the host.
func TestPresenceOlderGateways(t *testing.T) {
	r := newPresenceRig(t)
	for _, p := range r.snapshot(rowsOf("h2", 1), 1<<20) {
		r.mustDeliver(p)
	}
	old := rowsOf("h3", 1)[0]
	j, _ := json.Marshal(old)
	for range 3 {
		if err := r.deliver("h3", presenceBody{Seq: time.Now().UnixNano(), Entity: j}); err != nil {
			t.Fatalf("an old heartbeat: %v", err)
		}
	}
	if err := r.deliver("h3", presenceBody{Seq: time.Now().UnixNano(), Gone: old.Gid}); err != nil {
		t.Fatalf("an old gone notice: %v", err)
	}
	if v := r.view(time.Now()); len(v) != 1 || v["e0"].Host != "h2" {
		t.Fatalf("view: %v", v)
	}
	if n := strings.Count(r.log.String(), `announces presence per entity`); n != 1 {
		t.Errorf("%d lines about the older host, want 1:\n%s", n, r.log)
	}
	if err := r.deliver("h2", presenceBody{Seq: time.Now().UnixNano(), Leaving: true}); err != nil || r.view(time.Now())["e0"].Status != "gone" {
		t.Fatalf("an old-shaped leaving notice: %v, view %v", err, r.view(time.Now()))
	}
}

// What was heard of a remote entity is its last word, kept in the store:
// a snapshot that no longer names an entity, or a notice that it is gone,
// forgets it; a host that stops leaves its entities gone, not absent; a
// gateway that starts again knows them before hearing their host
// ("unknown"), and drops what the broker has no inbox for (Forget).
func TestPresenceKnownAcrossRestart(t *testing.T) {
	r := newPresenceRig(t)
	rows := rowsOf("h2", 4)
	for _, p := range r.snapshot(rows, 1<<20) {
		r.mustDeliver(p)
	}
	for _, p := range r.snapshot(rows[:3], 1<<20) { // e3 left between snapshots
		r.mustDeliver(p)
	}
	r.mustDeliver(r.change(presenceChange{Gone: rows[2].Gid})) // and e2 now
	moved := rows[1]
	moved.Groups = []string{"ops", "night"}
	r.mustDeliver(r.change(presenceChange{Row: &moved}))
	kept := func() map[string]store.Heard {
		t.Helper()
		hs, err := r.g.st.Heard()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]store.Heard{}
		for _, h := range hs {
			out[h.Name] = h
		}
		return out
	}
	k := kept()
	if len(k) != 2 || k["e0"].Gid != rows[0].Gid || !slices.Equal(k["e1"].Groups, moved.Groups) {
		t.Fatalf("kept %+v", k)
	}
	seq, _ := r.next()
	r.mustDeliver(presenceBody{Seq: seq, Leaving: true})
	if v := r.view(time.Now()); len(v) != 2 || v["e0"].Status != "gone" || v["e1"].Status != "gone" {
		t.Fatalf("after h2 left: %v", v)
	}

	// h1 again, on the same store: e0 and e1 before h2 is heard
	r.g.peers = newPeerView(testInterval, r.g.log)
	hs, err := r.g.st.Heard()
	if err != nil {
		t.Fatal(err)
	}
	r.g.peers.Remember(hs)
	v := r.view(time.Now())
	if len(v) != 2 || v["e0"].Status != "unknown" || v["e0"].Gid != rows[0].Gid || v["e0"].LastSeen.IsZero() {
		t.Fatalf("after a restart: %v", v)
	}
	// the broker had no inbox for e0: forgotten, here and in the store
	r.g.peers.Forget(rows[0].Gid)
	r.g.saveHeard()
	if v := r.view(time.Now()); len(v) != 1 {
		t.Fatalf("after forgetting e0: %v", v)
	}
	if k := kept(); len(k) != 1 || k["e1"].Gid != rows[1].Gid {
		t.Fatalf("kept after forgetting e0: %+v", k)
	}
	// a host no longer trusted: its kept rows are not listed
	if n := len(r.g.peers.Rows(time.Now(), true, r.g.cfg.PresenceTTL, func(h string) bool { return h != "h2" })); n != 0 {
		t.Fatalf("%d rows of an untrusted host", n)
	}
}

func allTrusted(string) bool { return true }
