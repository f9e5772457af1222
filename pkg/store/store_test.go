package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

var trackers sync.Map // *Store -> *bool

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.db")
	return openTracked(t, path), path
}

func openTracked(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	closed := new(bool)
	trackers.Store(s, closed)
	t.Cleanup(func() {
		if !*closed {
			s.Close()
		}
	})
	return s
}

// closeStore closes s and marks it so the cleanup does not close it again.
func closeStore(t *testing.T, s *Store) {
	t.Helper()
	if p, ok := trackers.Load(s); ok {
		*p.(*bool) = true
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// reopen closes s and opens the same file again.
func reopen(t *testing.T, s *Store, path string) *Store {
	t.Helper()
	closeStore(t, s)
	return openTracked(t, path)
}

func mkEntity(t *testing.T, s *Store, name string) *Entity {
	t.Helper()
	e := &Entity{Gid: "gid-" + name, Name: name, Host: "h1", Mode: "pull", Status: "idle", Created: t0}
	if err := s.CreateEntity(e); err != nil {
		t.Fatalf("CreateEntity(%s): %v", name, err)
	}
	return e
}

func msg(from, to, body string) *envelope.Envelope {
	e := envelope.New(envelope.Send, envelope.Party{Gid: from}, envelope.Party{Gid: to}, body)
	e.Created = t0
	return e
}

func accept(t *testing.T, s *Store, e *envelope.Envelope) *Record {
	t.Helper()
	rec, dup, err := s.Accept(e, t0)
	if err != nil {
		t.Fatalf("Accept(%s): %v", e.MsgID, err)
	}
	if dup {
		t.Fatalf("Accept(%s): unexpected dup", e.MsgID)
	}
	return rec
}

func record(t *testing.T, s *Store, id string) *Record {
	t.Helper()
	r, err := s.Record(id)
	if err != nil {
		t.Fatalf("Record(%s): %v", id, err)
	}
	return r
}

// inbox returns the msg ids waiting for gid, oldest first.
func inbox(t *testing.T, s *Store, gid string) []string {
	t.Helper()
	items, err := s.Head(gid, 0, 1<<30)
	if err != nil {
		t.Fatalf("Head(%s): %v", gid, err)
	}
	ids := make([]string, 0, len(items))
	for _, it := range items {
		ids = append(ids, it.Env.MsgID)
	}
	if n := s.Pending(gid); n != len(ids) {
		t.Errorf("Pending(%s) = %d, Head has %d", gid, n, len(ids))
	}
	return ids
}

func inflight(t *testing.T, s *Store) []string {
	t.Helper()
	ids, err := s.Inflight()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ids)
	return ids
}

func TestAcceptHeadFIFOPerRecipient(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")

	var toA, toB []string
	var recs []*Record
	for i := range 5 {
		ea := msg(b.Gid, a.Gid, fmt.Sprintf("to alice %d", i))
		recs = append(recs, accept(t, s, ea))
		toA = append(toA, ea.MsgID)
		if i < 3 {
			eb := msg(a.Gid, b.Gid, fmt.Sprintf("to bob %d", i))
			accept(t, s, eb)
			toB = append(toB, eb.MsgID)
		}
	}
	if got := inbox(t, s, a.Gid); !slices.Equal(got, toA) {
		t.Errorf("alice's inbox = %v, want %v", got, toA)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, toB) {
		t.Errorf("bob's inbox = %v, want %v", got, toB)
	}

	items, err := s.Head(a.Gid, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if it.Seq != recs[i].Seq {
			t.Errorf("item %d: seq %d, record says %d", i, it.Seq, recs[i].Seq)
		}
		if i > 0 && it.Seq <= items[i-1].Seq {
			t.Errorf("sequence not increasing: %d after %d", it.Seq, items[i-1].Seq)
		}
		if want := fmt.Sprintf("to alice %d", i); it.Env.Body != want {
			t.Errorf("item %d body %q, want %q", i, it.Env.Body, want)
		}
	}
	r := record(t, s, toA[0])
	if r.State != Accepted || r.Recipient != a.Gid || r.Sender != b.Gid || r.Kind != envelope.Send || !r.Accepted.Equal(t0) {
		t.Errorf("record = %+v", r)
	}

	// Paging: n limits, after skips what was already seen.
	two, err := s.Head(a.Gid, 0, 2)
	if err != nil || len(two) != 2 || two[0].Env.MsgID != toA[0] || two[1].Env.MsgID != toA[1] {
		t.Fatalf("Head(n=2) = %v, %v", two, err)
	}
	rest, err := s.Head(a.Gid, two[1].Seq, 10)
	if err != nil || len(rest) != 3 || rest[0].Env.MsgID != toA[2] {
		t.Fatalf("Head(after=%d) = %v, %v", two[1].Seq, rest, err)
	}

	if _, err := s.Head("gid-nobody", 0, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("Head of unknown inbox: %v, want ErrNotFound", err)
	}
	if _, _, err := s.Accept(msg(a.Gid, "gid-nobody", "x"), t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Accept to unknown recipient: %v, want ErrNotFound", err)
	}
}

func TestAcceptDedup(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	e := msg(a.Gid, b.Gid, "first")
	orig := accept(t, s, e)

	// Same msg id, different body and even recipient: nothing is stored.
	again := *e
	again.Body = "second"
	again.Recipient = envelope.Party{Gid: a.Gid}
	rec, dup, err := s.Accept(&again, t0.Add(time.Hour))
	if err != nil || !dup {
		t.Fatalf("second Accept: dup=%v err=%v, want dup", dup, err)
	}
	if *rec != *orig {
		t.Errorf("dup record = %+v, want the original %+v", rec, orig)
	}
	if got := inbox(t, s, b.Gid); len(got) != 1 {
		t.Errorf("bob's inbox has %d messages, want 1", len(got))
	}
	if got := inbox(t, s, a.Gid); len(got) != 0 {
		t.Errorf("alice's inbox has %v, want nothing", got)
	}
	items, _ := s.Head(b.Gid, 0, 10)
	if items[0].Env.Body != "first" {
		t.Errorf("stored body %q, want the first one", items[0].Env.Body)
	}
}

func TestDedupSurvivesReopen(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	queued, done := msg(a.Gid, b.Gid, "queued"), msg(a.Gid, b.Gid, "done")
	orig := accept(t, s, queued)
	accept(t, s, done)
	if err := s.Delivered(done.MsgID, t0); err != nil {
		t.Fatal(err)
	}

	s = reopen(t, s, path)
	for _, e := range []*envelope.Envelope{queued, done} {
		rec, dup, err := s.Accept(e, t0)
		if err != nil || !dup {
			t.Fatalf("Accept(%s) after reopen: dup=%v err=%v, want dup", e.Body, dup, err)
		}
		if e == queued && *rec != *orig {
			t.Errorf("dup record %+v, want %+v", rec, orig)
		}
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{queued.MsgID}) {
		t.Errorf("inbox after reopen = %v, want only the queued message", got)
	}
}

func TestDeliveredIsForwardOnly(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	first, second := msg(a.Gid, b.Gid, "1"), msg(a.Gid, b.Gid, "2")
	accept(t, s, first)
	accept(t, s, second)

	when := t0.Add(time.Minute)
	if err := s.Delivered(first.MsgID, when); err != nil {
		t.Fatal(err)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{second.MsgID}) {
		t.Errorf("inbox = %v, want only the second message", got)
	}
	r := record(t, s, first.MsgID)
	if r.State != Delivered || !r.Done.Equal(when) || r.Attempts != 1 {
		t.Errorf("record after Delivered = %+v", r)
	}
	ents, err := s.Entities()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Gid == b.Gid && !e.LastDelivery.Equal(when) {
			t.Errorf("bob's LastDelivery = %v, want %v", e.LastDelivery, when)
		}
	}

	// Delivered again is a no-op; Kill after Delivered changes nothing.
	if err := s.Delivered(first.MsgID, when.Add(time.Hour)); err != nil {
		t.Errorf("second Delivered: %v", err)
	}
	if err := s.Kill(first.MsgID, "too late", 9); err != nil {
		t.Errorf("Kill after Delivered: %v", err)
	}
	if r2 := record(t, s, first.MsgID); *r2 != *r {
		t.Errorf("record changed after Delivered: %+v, was %+v", r2, r)
	}
	if dl, _ := s.DeadLetters(""); len(dl) != 0 {
		t.Errorf("a delivered message was dead-lettered: %+v", dl[0].Record)
	}
	if n := len(s.DeadCounts()); n != 0 {
		t.Errorf("DeadCounts = %v, want empty", s.DeadCounts())
	}
	if _, err := s.BeginInject(first.MsgID); err == nil {
		t.Error("BeginInject on a delivered message succeeded")
	}
	if r2 := record(t, s, first.MsgID); r2.Attempts != 1 || r2.State != Delivered {
		t.Errorf("record after BeginInject = %+v", r2)
	}
	if got := inflight(t, s); len(got) != 0 {
		t.Errorf("in-flight after BeginInject on delivered: %v", got)
	}

	if err := s.Delivered("no-such-id", when); !errors.Is(err, ErrNotFound) {
		t.Errorf("Delivered(unknown) = %v, want ErrNotFound", err)
	}
}

func TestKillIsForwardOnly(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	e := msg(a.Gid, b.Gid, "doomed")
	accept(t, s, e)
	if err := s.Kill(e.MsgID, "expired before delivery", -1); err != nil {
		t.Fatal(err)
	}
	r := record(t, s, e.MsgID)
	if r.State != Dead {
		t.Fatalf("state %q after Kill", r.State)
	}

	if err := s.Delivered(e.MsgID, t0); err == nil {
		t.Error("Delivered after Kill succeeded")
	}
	if err := s.DeliveredAll([]string{e.MsgID}, t0); err == nil {
		t.Error("DeliveredAll after Kill succeeded")
	}
	if _, err := s.BeginInject(e.MsgID); err == nil {
		t.Error("BeginInject after Kill succeeded")
	}
	if err := s.Kill(e.MsgID, "again", 7); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if r2 := record(t, s, e.MsgID); *r2 != *r {
		t.Errorf("dead record changed: %+v, was %+v", r2, r)
	}
	dl, err := s.DeadLetters("")
	if err != nil || len(dl) != 1 || dl[0].Record.Reason != "expired before delivery" {
		t.Errorf("dead letters = %v, %v; want the one, with the first reason", dl, err)
	}
	if got := inbox(t, s, b.Gid); len(got) != 0 {
		t.Errorf("inbox = %v, want empty", got)
	}
}

// A late Failed (a delivery attempt that ends after the message was
// dead-lettered, e.g. by fleet-roster leave) must not rewrite the dead
// record: the record and its dead letter should tell the same story.
func TestFailedAfterKillKeepsDeadReason(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	e := msg(a.Gid, b.Gid, "x")
	accept(t, s, e)
	if _, err := s.BeginInject(e.MsgID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteEntity(b.Gid, "recipient left the fleet"); err != nil {
		t.Fatal(err)
	}
	_ = s.Failed(e.MsgID, "tmux: can't find pane") // error or no-op both fine
	r := record(t, s, e.MsgID)
	if r.State != Dead || r.Reason != "recipient left the fleet" {
		t.Errorf("record after late Failed = state %q reason %q; want dead, %q", r.State, r.Reason, "recipient left the fleet")
	}
}

func TestInjectAttemptsAndInflight(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	e, other := msg(a.Gid, b.Gid, "inject me"), msg(a.Gid, b.Gid, "other")
	accept(t, s, e)
	accept(t, s, other)

	for want := 1; want <= 2; want++ {
		n, err := s.BeginInject(e.MsgID)
		if err != nil || n != want {
			t.Fatalf("BeginInject #%d = %d, %v", want, n, err)
		}
	}
	if got := inflight(t, s); !slices.Equal(got, []string{e.MsgID}) {
		t.Fatalf("Inflight = %v, want [%s]", got, e.MsgID)
	}

	// A crash here: the marker and the count survive.
	s = reopen(t, s, path)
	if got := inflight(t, s); !slices.Equal(got, []string{e.MsgID}) {
		t.Fatalf("Inflight after reopen = %v, want [%s]", got, e.MsgID)
	}
	if r := record(t, s, e.MsgID); r.Attempts != 2 || r.State != Accepted {
		t.Errorf("record after reopen = %+v", r)
	}
	if n, err := s.BeginInject(e.MsgID); err != nil || n != 3 {
		t.Errorf("BeginInject after reopen = %d, %v; want 3", n, err)
	}

	if err := s.Failed(e.MsgID, "pane busy"); err != nil {
		t.Fatal(err)
	}
	if got := inflight(t, s); len(got) != 0 {
		t.Errorf("Inflight after Failed = %v, want empty", got)
	}
	r := record(t, s, e.MsgID)
	if r.State != Accepted || r.Reason != "pane busy" || r.Attempts != 3 {
		t.Errorf("record after Failed = %+v", r)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{e.MsgID, other.MsgID}) {
		t.Errorf("inbox after Failed = %v: the message must stay at the head", got)
	}
	s = reopen(t, s, path)
	if got := inflight(t, s); len(got) != 0 {
		t.Errorf("Inflight after Failed and reopen = %v, want empty", got)
	}

	// Delivered, Kill and ClearInflight also clear the marker.
	third := msg(a.Gid, b.Gid, "third")
	accept(t, s, third)
	for _, id := range []string{e.MsgID, other.MsgID, third.MsgID} {
		if _, err := s.BeginInject(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delivered(e.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(other.MsgID, "gave up", -1); err != nil {
		t.Fatal(err)
	}
	if got := inflight(t, s); !slices.Equal(got, []string{third.MsgID}) {
		t.Errorf("Inflight = %v, want only [%s]", got, third.MsgID)
	}
	if err := s.ClearInflight(third.MsgID); err != nil {
		t.Fatal(err)
	}
	if got := inflight(t, s); len(got) != 0 {
		t.Errorf("Inflight after ClearInflight = %v", got)
	}
	if r := record(t, s, e.MsgID); r.Attempts != 4 || r.Reason != "" {
		t.Errorf("delivered record = %+v, want 4 attempts and no reason", r)
	}

	if _, err := s.BeginInject("no-such-id"); !errors.Is(err, ErrNotFound) {
		t.Errorf("BeginInject(unknown) = %v, want ErrNotFound", err)
	}
}

func TestKillDeadLetters(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	toA, toB, keep := msg(b.Gid, a.Gid, "for alice"), msg(a.Gid, b.Gid, "for bob"), msg(a.Gid, b.Gid, "stays")
	for _, e := range []*envelope.Envelope{toA, toB, keep} {
		accept(t, s, e)
	}
	s.BeginInject(toA.MsgID)
	s.BeginInject(toA.MsgID)
	s.BeginInject(toB.MsgID)

	before := time.Now()
	if err := s.Kill(toA.MsgID, "delivery failed 2 times", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(toB.MsgID, "expired before delivery", -1); err != nil {
		t.Fatal(err)
	}

	all, err := s.DeadLetters("")
	if err != nil || len(all) != 2 {
		t.Fatalf("DeadLetters(\"\") = %d, %v; want 2", len(all), err)
	}
	onlyA, err := s.DeadLetters(a.Gid)
	if err != nil || len(onlyA) != 1 {
		t.Fatalf("DeadLetters(alice) = %d, %v; want 1", len(onlyA), err)
	}
	d := onlyA[0]
	if d.Record.MsgID != toA.MsgID || d.Record.State != Dead || d.Record.Reason != "delivery failed 2 times" ||
		d.Record.Attempts != 2 || d.Record.Recipient != a.Gid || d.Record.Done.Before(before.Add(-time.Second)) {
		t.Errorf("dead letter record = %+v", d.Record)
	}
	var env envelope.Envelope
	if err := json.Unmarshal(d.Envelope, &env); err != nil || env.MsgID != toA.MsgID || env.Body != "for alice" {
		t.Errorf("dead letter envelope = %s (%v)", d.Envelope, err)
	}
	onlyB, _ := s.DeadLetters(b.Gid)
	if len(onlyB) != 1 || onlyB[0].Record.Attempts != 1 || onlyB[0].Record.Reason != "expired before delivery" {
		t.Errorf("bob's dead letter = %+v (attempts -1 must keep the recorded count)", onlyB)
	}
	if r := record(t, s, toA.MsgID); r.State != Dead || r.Reason != "delivery failed 2 times" || r.Attempts != 2 {
		t.Errorf("record = %+v", r)
	}
	if got := s.DeadCounts(); len(got) != 2 || got[a.Gid] != 1 || got[b.Gid] != 1 {
		t.Errorf("DeadCounts = %v", got)
	}
	if got := inbox(t, s, a.Gid); len(got) != 0 {
		t.Errorf("alice's inbox = %v, want empty", got)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{keep.MsgID}) {
		t.Errorf("bob's inbox = %v, want only %s", got, keep.MsgID)
	}
	if err := s.Kill("no-such-id", "x", 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Kill(unknown) = %v, want ErrNotFound", err)
	}
}

func TestDeleteEntityDeadLettersPending(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	m1, m2, m3 := msg(a.Gid, b.Gid, "1"), msg(a.Gid, b.Gid, "2"), msg(a.Gid, b.Gid, "3")
	for _, e := range []*envelope.Envelope{m1, m2, m3} {
		accept(t, s, e)
	}
	if _, err := s.BeginInject(m1.MsgID); err != nil {
		t.Fatal(err)
	}
	if err := s.Delivered(m3.MsgID, t0); err != nil {
		t.Fatal(err)
	}

	n, err := s.DeleteEntity(b.Gid, "recipient left the fleet")
	if err != nil || n != 2 {
		t.Fatalf("DeleteEntity = %d, %v; want 2", n, err)
	}
	dl, err := s.DeadLetters(b.Gid)
	if err != nil || len(dl) != 2 {
		t.Fatalf("DeadLetters(bob) = %d, %v; want 2", len(dl), err)
	}
	attempts := map[string]int{}
	for _, d := range dl {
		if d.Record.Reason != "recipient left the fleet" || d.Record.State != Dead {
			t.Errorf("dead letter %+v", d.Record)
		}
		attempts[d.Record.MsgID] = d.Record.Attempts
	}
	if len(attempts) != 2 || attempts[m1.MsgID] != 1 || attempts[m2.MsgID] != 0 {
		t.Errorf("dead letters by attempts = %v, want m1:1 m2:0", attempts)
	}
	if r := record(t, s, m3.MsgID); r.State != Delivered {
		t.Errorf("already delivered message became %q", r.State)
	}
	if got := inflight(t, s); len(got) != 0 {
		t.Errorf("Inflight after DeleteEntity = %v", got)
	}
	if s.DeadCounts()[b.Gid] != 2 {
		t.Errorf("DeadCounts = %v", s.DeadCounts())
	}

	ents, _ := s.Entities()
	if len(ents) != 1 || ents[0].Gid != a.Gid {
		t.Errorf("entities after delete = %v", ents)
	}
	if _, err := s.Head(b.Gid, 0, 10); !errors.Is(err, ErrNotFound) {
		t.Errorf("Head of deleted inbox: %v, want ErrNotFound", err)
	}
	if _, _, err := s.Accept(msg(a.Gid, b.Gid, "late"), t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Accept to deleted entity: %v, want ErrNotFound", err)
	}
	// The name is free again.
	if err := s.CreateEntity(&Entity{Gid: "gid-bob-2", Name: "bob"}); err != nil {
		t.Errorf("re-registering bob: %v", err)
	}
	if _, err := s.DeleteEntity("gid-nobody", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteEntity(unknown) = %v, want ErrNotFound", err)
	}
	// An empty inbox deletes with nothing dead-lettered.
	if n, err := s.DeleteEntity(a.Gid, "bye"); err != nil || n != 0 {
		t.Errorf("DeleteEntity(alice) = %d, %v; want 0", n, err)
	}
}

func TestCreateEntityNameTaken(t *testing.T) {
	s, _ := newStore(t)
	orig := mkEntity(t, s, "bob")
	err := s.CreateEntity(&Entity{Gid: "gid-other", Name: "bob"})
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("CreateEntity(taken) = %v, want ErrNameTaken", err)
	}
	ents, _ := s.Entities()
	if len(ents) != 1 || ents[0].Gid != orig.Gid {
		t.Errorf("entities = %+v, want only the original bob", ents)
	}
	// The refused registration left nothing behind: no inbox either.
	if _, _, err := s.Accept(msg(orig.Gid, "gid-other", "x"), t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Accept to the refused gid: %v, want ErrNotFound", err)
	}
	if err := s.CreateEntity(&Entity{Gid: "gid-other", Name: "bobby"}); err != nil {
		t.Errorf("a free name was refused: %v", err)
	}
}

func TestUpdateEntity(t *testing.T) {
	s, _ := newStore(t)
	b := mkEntity(t, s, "bob")
	got, err := s.UpdateEntity(b.Gid, func(e *Entity) error { e.Status = "busy"; return nil })
	if err != nil || got.Status != "busy" {
		t.Fatalf("UpdateEntity = %+v, %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateEntity(b.Gid, func(e *Entity) error { e.Status = "idle"; return boom }); !errors.Is(err, boom) {
		t.Errorf("UpdateEntity error = %v, want boom", err)
	}
	ents, _ := s.Entities()
	if ents[0].Status != "busy" {
		t.Errorf("a failed update was saved: status %q", ents[0].Status)
	}
	if _, err := s.UpdateEntity("gid-nobody", func(*Entity) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateEntity(unknown) = %v, want ErrNotFound", err)
	}
}

func TestPrune(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	now := time.Now().UTC()
	cutoff := now.Add(24 * time.Hour)

	oldDone, newDone, queued, dead := msg(a.Gid, b.Gid, "old"), msg(a.Gid, b.Gid, "new"), msg(a.Gid, b.Gid, "queued"), msg(a.Gid, b.Gid, "dead")
	for _, e := range []*envelope.Envelope{oldDone, newDone, queued, dead} {
		// Accepted long ago: only Done may count.
		if _, _, err := s.Accept(e, now.Add(-1000*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delivered(oldDone.MsgID, now.Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delivered(newDone.MsgID, cutoff.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(dead.MsgID, "gave up", 5); err != nil { // Done = now, before cutoff
		t.Fatal(err)
	}

	n, err := s.Prune(cutoff)
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	if _, err := s.Record(oldDone.MsgID); !errors.Is(err, ErrNotFound) {
		t.Errorf("old delivered record still there: %v", err)
	}
	if r := record(t, s, newDone.MsgID); r.State != Delivered {
		t.Errorf("recent delivered record = %+v", r)
	}
	if r := record(t, s, queued.MsgID); r.State != Accepted {
		t.Errorf("queued record = %+v", r)
	}
	if r := record(t, s, dead.MsgID); r.State != Dead {
		t.Errorf("dead record = %+v", r)
	}
	if dl, _ := s.DeadLetters(""); len(dl) != 1 || dl[0].Record.MsgID != dead.MsgID {
		t.Errorf("dead letters after Prune = %v", dl)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{queued.MsgID}) {
		t.Errorf("inbox after Prune = %v", got)
	}

	// The dedup window: a pruned id is new again; the others are still dups.
	if _, dup, err := s.Accept(oldDone, now); err != nil || dup {
		t.Errorf("Accept of a pruned id: dup=%v err=%v, want stored anew", dup, err)
	}
	for _, e := range []*envelope.Envelope{newDone, queued, dead} {
		if _, dup, err := s.Accept(e, now); err != nil || !dup {
			t.Errorf("Accept(%s) after Prune: dup=%v err=%v, want dup", e.Body, dup, err)
		}
	}
	if n, err := s.Prune(cutoff); err != nil || n != 0 {
		t.Errorf("second Prune = %d, %v; want 0", n, err)
	}
}

func TestDeliveredAll(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	m1, m2, m3 := msg(a.Gid, b.Gid, "1"), msg(a.Gid, b.Gid, "2"), msg(a.Gid, b.Gid, "3")
	for _, e := range []*envelope.Envelope{m1, m2, m3} {
		accept(t, s, e)
	}
	if err := s.DeliveredAll([]string{m1.MsgID, m2.MsgID}, t0); err != nil {
		t.Fatal(err)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{m3.MsgID}) {
		t.Errorf("inbox = %v", got)
	}
	// One unknown id fails the whole batch: m3 stays queued.
	if err := s.DeliveredAll([]string{m3.MsgID, "no-such-id"}, t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeliveredAll with unknown id = %v, want ErrNotFound", err)
	}
	if r := record(t, s, m3.MsgID); r.State != Accepted {
		t.Errorf("m3 = %q after a failed batch, want accepted", r.State)
	}
}

func TestMeta(t *testing.T) {
	s, path := newStore(t)
	if s.Meta("schema") != "1" {
		t.Errorf("schema meta = %q", s.Meta("schema"))
	}
	if err := s.SetMeta("host", "h1"); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	if s.Meta("host") != "h1" || s.Meta("nothing") != "" {
		t.Errorf("meta after reopen: host=%q nothing=%q", s.Meta("host"), s.Meta("nothing"))
	}
}

func TestOpenRefusesSecondHolder(t *testing.T) {
	_, path := newStore(t)
	if s2, err := Open(path); err == nil {
		s2.Close()
		t.Fatal("a second Open of a held store succeeded")
	}
}

// ---- the group committer ----

func TestConcurrentAcceptsLandOnceInSenderOrder(t *testing.T) {
	const senders, each = 8, 500
	s, path := newStore(t)
	r := mkEntity(t, s, "sink")

	var wg sync.WaitGroup
	errs := make(chan error, senders*each)
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := fmt.Sprintf("sender-%d", g)
			for i := range each {
				e := msg(from, r.Gid, fmt.Sprintf("%d:%d", g, i))
				e.MsgID = fmt.Sprintf("%s-%04d", from, i)
				if _, dup, err := s.Accept(e, t0); err != nil || dup {
					errs <- fmt.Errorf("Accept(%s): dup=%v err=%v", e.MsgID, dup, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	check := func(s *Store) {
		t.Helper()
		items, err := s.Head(r.Gid, 0, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) != senders*each {
			t.Fatalf("inbox holds %d messages, want %d", len(items), senders*each)
		}
		next := make([]int, senders)
		seen := map[string]bool{}
		for _, it := range items {
			if seen[it.Env.MsgID] {
				t.Fatalf("%s stored twice", it.Env.MsgID)
			}
			seen[it.Env.MsgID] = true
			var g, i int
			if _, err := fmt.Sscanf(it.Env.Body, "%d:%d", &g, &i); err != nil {
				t.Fatalf("body %q: %v", it.Env.Body, err)
			}
			if i != next[g] {
				t.Fatalf("sender %d: message %d came where %d was due (per-sender order broken)", g, i, next[g])
			}
			next[g]++
			if rec := record(t, s, it.Env.MsgID); rec.Seq != it.Seq || rec.State != Accepted {
				t.Fatalf("record %+v does not match inbox seq %d", rec, it.Seq)
			}
		}
	}
	check(s)
	check(reopen(t, s, path)) // and it is all on disk
}

func TestConcurrentFailuresDoNotLoseOthersWrites(t *testing.T) {
	const good, bad, each = 4, 4, 250
	s, _ := newStore(t)
	r := mkEntity(t, s, "sink")

	var wg sync.WaitGroup
	errs := make(chan error, (good+bad)*each)
	for g := range good + bad {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := fmt.Sprintf("sender-%d", g)
			to := r.Gid
			if g >= good {
				to = "gid-nobody"
			}
			for i := range each {
				e := msg(from, to, "x")
				e.MsgID = fmt.Sprintf("%s-%04d", from, i)
				_, _, err := s.Accept(e, t0)
				switch {
				case g < good && err != nil:
					errs <- fmt.Errorf("good Accept(%s): %v", e.MsgID, err)
				case g >= good && !errors.Is(err, ErrNotFound):
					errs <- fmt.Errorf("bad Accept(%s) = %v, want ErrNotFound", e.MsgID, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := inbox(t, s, r.Gid); len(got) != good*each {
		t.Errorf("inbox holds %d messages, want %d", len(got), good*each)
	}
	for g := range good + bad {
		for i := range each {
			id := fmt.Sprintf("sender-%d-%04d", g, i)
			_, err := s.Record(id)
			if g < good && err != nil {
				t.Fatalf("good message %s lost: %v", id, err)
			}
			if g >= good && !errors.Is(err, ErrNotFound) {
				t.Fatalf("failed message %s has a record: %v", id, err)
			}
		}
	}
}

// holdCommitter blocks the commit loop inside a transaction of its own and
// returns a func that lets it go. Writes issued meanwhile queue up and are
// then taken as one group.
func holdCommitter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	entered, gate, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	go func() {
		done <- s.update(func(*wtx) error {
			once.Do(func() { close(entered) })
			<-gate
			return nil
		})
	}()
	<-entered
	return func() {
		close(gate)
		if err := <-done; err != nil {
			t.Errorf("holding op: %v", err)
		}
	}
}

// waitQueued yields until n writes wait in the committer's queue.
func waitQueued(s *Store, n int) {
	for len(s.ops) < n {
		runtime.Gosched()
	}
}

type acceptResult struct {
	rec *Record
	dup bool
	err error
}

func TestGroupWithFailingOpKeepsTheOthers(t *testing.T) {
	// The failing op first, in the middle, last.
	for _, failAt := range []int{0, 2, 4} {
		t.Run(fmt.Sprintf("fail at %d", failAt), func(t *testing.T) {
			s, _ := newStore(t)
			a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
			x, y, z := msg(a.Gid, b.Gid, "x"), msg(a.Gid, b.Gid, "y"), msg(a.Gid, b.Gid, "z")
			xAgain := *x
			xAgain.Body = "x again"
			lost := msg(a.Gid, "gid-nobody", "lost")
			ops := []*envelope.Envelope{x, y, &xAgain, z}
			ops = slices.Insert(ops, failAt, lost)

			release := holdCommitter(t, s)
			results := make([]chan acceptResult, len(ops))
			for i, e := range ops {
				results[i] = make(chan acceptResult, 1)
				go func() {
					rec, dup, err := s.Accept(e, t0)
					results[i] <- acceptResult{rec, dup, err}
				}()
				waitQueued(s, i+1) // queue them in this order
			}
			release()

			got := map[*envelope.Envelope]acceptResult{}
			for i, e := range ops {
				got[e] = <-results[i]
			}
			if err := got[lost].err; !errors.Is(err, ErrNotFound) {
				t.Errorf("Accept to unknown recipient = %v, want ErrNotFound", err)
			}
			for _, e := range []*envelope.Envelope{x, y, z} {
				if r := got[e]; r.err != nil || r.dup {
					t.Errorf("Accept(%s) = dup %v, err %v", e.Body, r.dup, r.err)
				}
			}
			if r := got[&xAgain]; r.err != nil || !r.dup || r.rec == nil || *r.rec != *got[x].rec {
				t.Errorf("Accept(x again) = %+v, want dup with x's record %+v", r, got[x].rec)
			}
			if ids := inbox(t, s, b.Gid); !slices.Equal(ids, []string{x.MsgID, y.MsgID, z.MsgID}) {
				t.Errorf("inbox = %v, want x, y, z once each", ids)
			}
			items, _ := s.Head(b.Gid, 0, 10)
			for i, e := range []*envelope.Envelope{x, y, z} {
				if i < len(items) && got[e].rec != nil && items[i].Seq != got[e].rec.Seq {
					t.Errorf("%s: inbox seq %d, Accept returned %d", e.Body, items[i].Seq, got[e].rec.Seq)
				}
			}
			if items[0].Env.Body != "x" {
				t.Errorf("x stored with body %q", items[0].Env.Body)
			}
			if _, err := s.Record(lost.MsgID); !errors.Is(err, ErrNotFound) {
				t.Errorf("the failed message has a record: %v", err)
			}
		})
	}
}

func TestGroupOfGoodOpsCommitsTogether(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	const n = 50
	release := holdCommitter(t, s)
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		e := msg(a.Gid, b.Gid, fmt.Sprint(i))
		ids[i] = e.MsgID
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.Accept(e, t0)
		}()
		waitQueued(s, i+1)
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Accept %d: %v", i, err)
		}
	}
	s = reopen(t, s, path)
	if got := inbox(t, s, b.Gid); !slices.Equal(got, ids) {
		t.Errorf("inbox after reopen has %d messages in order %v..., want %d in queue order", len(got), got[:min(3, len(got))], n)
	}
}

func TestCloseFinishesQueuedWrites(t *testing.T) {
	s, path := newStore(t)
	b := mkEntity(t, s, "bob")
	release := holdCommitter(t, s)
	const n = 20
	errs := make(chan error, n)
	var ids []string
	for i := range n {
		e := msg("x", b.Gid, fmt.Sprint(i))
		ids = append(ids, e.MsgID)
		go func() {
			_, _, err := s.Accept(e, t0)
			errs <- err
		}()
		waitQueued(s, i+1)
	}
	if p, ok := trackers.Load(s); ok {
		*p.(*bool) = true // closed below
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	<-s.done // Close has begun while the writes wait in the queue
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("queued Accept: %v", err)
		}
	}
	s = openTracked(t, path)
	if got := inbox(t, s, b.Gid); !slices.Equal(got, ids) {
		t.Errorf("after Close and reopen, inbox has %d of the %d queued messages", len(got), n)
	}
}

// A write after Close must fail at once, not queue an operation the
// stopped committer never answers.
func TestWriteAfterCloseFails(t *testing.T) {
	s, _ := newStore(t)
	closeStore(t, s)
	for i := range 64 {
		res := make(chan error, 1)
		go func() { res <- s.SetMeta("k", "v") }()
	wait:
		for {
			select {
			case err := <-res:
				if err == nil || !strings.Contains(err.Error(), "closed") {
					t.Fatalf("write %d after Close = %v, want a store-closed error", i, err)
				}
				break wait
			default:
			}
			if len(s.ops) > 0 {
				t.Fatalf("write %d after Close was queued to the stopped committer: its caller waits forever", i)
			}
			runtime.Gosched()
		}
	}
}

// One replay of a dead letter per recipient, the dead letter named by its
// msg id and its sender's host: another host's replay of the same msg id
// is a message of its own and never stands in for the real one; a second
// replay of the real one (the recipient's host replaying the bridge.dlq
// copy, the sender's host its own) is a dup. A replay recorded before the
// key named the host counts only for the host its record shows.
func TestReplayDedupPerSenderHost(t *testing.T) {
	s, _ := newStore(t)
	full := mkEntity(t, s, "full")
	replay := func(senderGid, host, of string) *envelope.Envelope {
		e := envelope.New(envelope.Send, envelope.Party{Gid: senderGid, Host: host}, envelope.Party{Gid: full.Gid}, "again")
		e.ReplayOf = of
		return e
	}
	const alice, mallory = "da.01a22a93-8b62-7719-997e-dae6eae12382", "db.01a22a93-8b62-7719-997e-dae6eae12383"
	forged := accept(t, s, replay(mallory, "db", "dead-1"))
	real := accept(t, s, replay(alice, "da", "dead-1"))
	if forged.MsgID == real.MsgID {
		t.Fatal("one record for two replays")
	}
	rec, dup, err := s.Accept(replay(alice, "da", "dead-1"), t0)
	if err != nil || !dup || rec.MsgID != real.MsgID {
		t.Fatalf("a second replay of da's dead-1: %+v dup=%v err=%v, want the first", rec, dup, err)
	}
	if got := inbox(t, s, full.Gid); len(got) != 2 {
		t.Fatalf("full's inbox %v, want the two first replays", got)
	}

	// before: msg id/recipient -> the first replay's key
	old := accept(t, s, msg(alice, full.Gid, "taken before the upgrade"))
	if err := s.update(func(tx *wtx) error {
		rb, err := tx.CreateBucketIfNotExists(bReplayed)
		if err != nil {
			return err
		}
		return rb.Put([]byte("dead-2/"+full.Gid), []byte(old.MsgID))
	}); err != nil {
		t.Fatal(err)
	}
	if _, dup, err := s.Accept(replay(mallory, "db", "dead-2"), t0); err != nil || dup {
		t.Fatalf("db's dead-2 against da's legacy replay: dup=%v err=%v, want taken", dup, err)
	}
	if rec, dup, err := s.Accept(replay(alice, "da", "dead-2"), t0); err != nil || !dup || rec.MsgID != old.MsgID {
		t.Fatalf("da's dead-2 against its legacy replay: %+v dup=%v err=%v, want the legacy one", rec, dup, err)
	}
}

// A dead letter replayed on this host is known by its msg id and its
// sender's host: another host's dead letter under the same msg id is a
// replay of its own; one recorded before the host was in the key counts
// for the host its envelope's sender names.
func TestReplaysPerSenderHost(t *testing.T) {
	s, _ := newStore(t)
	made := func(host, body string) []byte {
		e := envelope.New(envelope.Send, envelope.Party{Gid: host + ".01a22a93-8b62-7719-997e-dae6eae12382", Host: host}, envelope.Party{Gid: "gid-full"}, body)
		raw, err := envelope.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	db, da := made("db", "forged"), made("da", "real")
	if prev, err := s.PutReplay("dead-1", "db", db); err != nil || prev != nil {
		t.Fatalf("db's replay: %q %v", prev, err)
	}
	if prev, err := s.PutReplay("dead-1", "da", da); err != nil || prev != nil {
		t.Fatalf("da's replay after db's: %q %v, want none before", prev, err)
	}
	if got := s.Replay("dead-1", "da"); string(got) != string(da) {
		t.Fatalf("da's replay: %q", got)
	}
	if prev, _ := s.PutReplay("dead-1", "da", made("da", "again")); string(prev) != string(da) {
		t.Fatalf("a second replay of da's: prev %q, want the first", prev)
	}
	if err := s.DropReplay("dead-1", "db"); err != nil || s.Replay("dead-1", "db") != nil || s.Replay("dead-1", "da") == nil {
		t.Fatalf("dropping db's replay: %v", err)
	}

	if err := s.update(func(tx *wtx) error { // before: msg id -> envelope
		return tx.Bucket(bReplays).Put([]byte("dead-2"), da)
	}); err != nil {
		t.Fatal(err)
	}
	if s.Replay("dead-2", "db") != nil || string(s.Replay("dead-2", "da")) != string(da) {
		t.Fatal("a replay recorded before the host was in the key: not found for its own host only")
	}
	if err := s.DropReplay("dead-2", "da"); err != nil || s.Replay("dead-2", "da") != nil {
		t.Fatalf("dropping a legacy replay: %v", err)
	}
}

// ExpireHead kills, in one operation, what waited since before the
// cutoff at the head of one inbox: at most n at a time, a broadcast copy
// by its own key, the rest left in order; an unknown inbox is ErrNotFound.
func TestExpireHead(t *testing.T) {
	s, path := newStore(t)
	bob := mkEntity(t, s, "bob")
	var sent []*envelope.Envelope
	for i, body := range []string{"a", "b", "c"} {
		e := msg("gid-alice", bob.Gid, body)
		if i == 1 {
			e.Kind, e.Recipient.Group = envelope.Broadcast, "all"
		}
		if _, _, err := s.Accept(e, t0.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, e)
	}
	cutoff := t0.Add(90 * time.Second) // a and b are older
	got, err := s.ExpireHead(bob.Gid, cutoff, "expired in the inbox: test", 1, nil)
	if err != nil || len(got) != 1 || got[0].Body != "a" {
		t.Fatalf("first: %v %v", got, err)
	}
	got, err = s.ExpireHead(bob.Gid, cutoff, "expired in the inbox: test", 10, nil)
	if err != nil || len(got) != 1 || got[0].Body != "b" {
		t.Fatalf("second: %v %v", got, err)
	}
	s = reopen(t, s, path) // what died is on disk
	for i, want := range []string{Dead, Dead, Accepted} {
		r, err := s.Record(Key(sent[i]))
		if err != nil || r.State != want {
			t.Fatalf("%s: %+v %v", sent[i].Body, r, err)
		}
	}
	if n := s.Pending(bob.Gid); n != 1 {
		t.Fatalf("pending %d", n)
	}
	if d, err := s.DeadLetter(Key(sent[1])); err != nil || d.Record.Reason != "expired in the inbox: test" {
		t.Fatalf("broadcast copy's dead letter: %+v %v", d, err)
	}
	if got, err := s.ExpireHead(bob.Gid, cutoff, "x", 10, nil); err != nil || len(got) != 0 {
		t.Fatalf("nothing more due: %v %v", got, err)
	}
	if _, err := s.ExpireHead("gid-nobody", cutoff, "x", 10, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown inbox: %v", err)
	}
}

// An outbound record whose confirm was lost reads unknown; a receipt
// settles it as it would an accepted one, and a retry confirmed makes it
// accepted again; a settled record never moves back.
func TestMarkOutbound(t *testing.T) {
	s, _ := newStore(t)
	env := envelope.New(envelope.Send, envelope.Party{Gid: "h1.a", Host: "h1"}, envelope.Party{Gid: "h2.b", Host: "h2"}, "x")
	if err := s.RecordOutboundStart(env, time.Now())(); err != nil {
		t.Fatal(err)
	}
	if r, err := s.MarkOutbound(env.MsgID, Unknown); err != nil || r.State != Unknown {
		t.Fatalf("mark unknown: %+v %v", r, err)
	}
	if r, err := s.MarkOutbound(env.MsgID, Accepted); err != nil || r.State != Accepted {
		t.Fatalf("mark accepted: %+v %v", r, err)
	}
	s.MarkOutbound(env.MsgID, Unknown)
	if r, err := s.SettleOutbound(env.MsgID, Delivered, "", 1, time.Now()); err != nil || r.State != Delivered {
		t.Fatalf("settle from unknown: %+v %v", r, err)
	}
	if r, err := s.MarkOutbound(env.MsgID, Unknown); err != nil || r.State != Delivered {
		t.Fatalf("a settled record moved back: %+v %v", r, err)
	}
	if _, err := s.MarkOutbound(env.MsgID, Delivered); err == nil {
		t.Fatal("MarkOutbound took delivered")
	}
	if _, err := s.MarkOutbound("no-such-id", Unknown); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}
