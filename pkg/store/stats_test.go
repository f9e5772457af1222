package store

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Inboxes reports each inbox's depth and its head's creation time from
// one pass, and keeps doing so as messages arrive and leave; a head with a
// body far larger than the prefix copied still shows its time.
func TestInboxesDepthAndOldest(t *testing.T) {
	s, _ := newStore(t)
	a, b, c := mkEntity(t, s, "a"), mkEntity(t, s, "b"), mkEntity(t, s, "c")
	first := msg(b.Gid, a.Gid, strings.Repeat("x", 3*headPrefix))
	first.Created = t0.Add(-time.Hour)
	accept(t, s, first)
	accept(t, s, msg(b.Gid, a.Gid, "second"))
	accept(t, s, msg(a.Gid, b.Gid, "one"))

	byGid := func() map[string]InboxStat {
		t.Helper()
		stats, err := s.Inboxes()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]InboxStat{}
		for _, st := range stats {
			m[st.Gid] = st
		}
		return m
	}
	got := byGid()
	if len(got) != 3 {
		t.Fatalf("want 3 inboxes, got %+v", got)
	}
	if st := got[a.Gid]; st.Depth != 2 || !st.Oldest.Equal(first.Created) {
		t.Errorf("a: %+v, want depth 2, oldest %v", st, first.Created)
	}
	if st := got[b.Gid]; st.Depth != 1 || !st.Oldest.Equal(t0) {
		t.Errorf("b: %+v, want depth 1, oldest %v", st, t0)
	}
	if st := got[c.Gid]; st.Depth != 0 || !st.Oldest.IsZero() {
		t.Errorf("c: %+v, want empty", st)
	}
	if err := s.Delivered(first.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if st := byGid()[a.Gid]; st.Depth != 1 || !st.Oldest.Equal(t0) {
		t.Errorf("a after its head was delivered: %+v, want depth 1, oldest %v", st, t0)
	}
}

// OnFlush hears each log flush a write waits for, and nothing once unset.
func TestOnFlush(t *testing.T) {
	s, _ := newStore(t)
	var n atomic.Int64
	var total atomic.Int64
	s.OnFlush(func(took time.Duration) {
		n.Add(1)
		total.Add(int64(took))
	})
	mkEntity(t, s, "a")
	if n.Load() == 0 || total.Load() <= 0 {
		t.Fatalf("a durable write was not observed: %d flushes, %v", n.Load(), time.Duration(total.Load()))
	}
	s.OnFlush(nil)
	before := n.Load()
	mkEntity(t, s, "b")
	if n.Load() != before {
		t.Fatalf("flushes observed after OnFlush(nil)")
	}
}

// BenchmarkInboxes is one scrape's pass over the inboxes of 10,000
// entities, half of them holding a message (fleet-metrics(7)):
// go test -run '^$' -bench Inboxes ./pkg/store/
func BenchmarkInboxes(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "fleet.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 { // concurrent writers share the log's flushes
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 10000; i += 64 {
				e := &Entity{Gid: fmt.Sprintf("gid-e%05d", i), Name: fmt.Sprintf("e%05d", i), Host: "h1", Mode: "pull", Status: "idle", Created: t0}
				if err := s.CreateEntity(e); err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					if _, _, err := s.Accept(msg(e.Gid, e.Gid, "a short body"), t0); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if _, err := s.Inboxes(); err != nil { // the first pass counts each inbox once
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		stats, err := s.Inboxes()
		if err != nil || len(stats) != 10000 {
			b.Fatalf("%d inboxes, %v", len(stats), err)
		}
	}
}
