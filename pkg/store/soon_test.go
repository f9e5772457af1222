package store

import (
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// soonSetup is a store whose soon flushes wait as long as the test likes
// (an hour: nothing in these tests may rely on the delay running out),
// with its groups and flushes counted, alice and bob, and two messages
// from alice in bob's inbox.
type soonSetup struct {
	s       *Store
	path    string
	groups  *atomic.Int64
	flushes *atomic.Int64
	bob     *Entity
	m1, m2  *envelope.Envelope
}

func newSoon(t *testing.T) *soonSetup {
	t.Helper()
	s, path := newStore(t)
	groups, flushes := new(atomic.Int64), new(atomic.Int64)
	// set before any operation of this test
	s.groupHook = func(int, int) { groups.Add(1) }
	s.soonDelay = time.Hour
	s.OnFlush(func(time.Duration) { flushes.Add(1) })
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	m1, m2 := msg(a.Gid, b.Gid, "1"), msg(a.Gid, b.Gid, "2")
	accept(t, s, m1)
	accept(t, s, m2)
	return &soonSetup{s: s, path: path, groups: groups, flushes: flushes, bob: b, m1: m1, m2: m2}
}

// ackSoon starts DeliveredSoon of ids and returns once its group is with
// the syncer; its answer arrives on the channel.
func (x *soonSetup) ackSoon(t *testing.T, ids ...string) <-chan error {
	t.Helper()
	before := x.groups.Load()
	done := make(chan error, 1)
	go func() { done <- x.s.DeliveredSoon(ids, t0) }()
	for x.groups.Load() == before {
		runtime.Gosched() // waiting for an event, not for a time
	}
	return done
}

// notYet fails if the acknowledgement was answered: with an hour's delay
// and nothing else written, it cannot be on disk yet.
func notYet(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("a soon write was answered before any flush could carry it (err %v)", err)
	default:
	}
}

// A soon write waits for the next ordinary write and shares its flush;
// both are on disk once answered.
func TestSoonSharesTheNextFlush(t *testing.T) {
	x := newSoon(t)
	flushes := x.flushes.Load()
	done := x.ackSoon(t, x.m1.MsgID)
	notYet(t, done)
	if n := x.flushes.Load(); n != flushes {
		t.Fatalf("%d flushes for a soon write alone, want none yet", n-flushes)
	}
	m3 := msg(x.m1.Sender.Gid, x.bob.Gid, "3")
	accept(t, x.s, m3) // an ordinary write: flushed at once, with the acknowledgement
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := x.flushes.Load() - flushes; n != 1 {
		t.Errorf("the acknowledgement and the send took %d flushes, want 1", n)
	}
	crash(t, x.s) // no checkpoint: only the log has them
	s := openTracked(t, x.path)
	if r := record(t, s, x.m1.MsgID); r.State != Delivered {
		t.Errorf("m1 is %s after a crash, want delivered", r.State)
	}
	if got := inbox(t, s, x.bob.Gid); !slices.Equal(got, []string{x.m2.MsgID, m3.MsgID}) {
		t.Errorf("bob's inbox after a crash = %v, want m2, m3", got)
	}
}

// An ordinary read behind a soon write does not wait for the delay: it
// flushes the write and sees it.
func TestSoonIsFlushedForAReadBehindIt(t *testing.T) {
	x := newSoon(t)
	done := x.ackSoon(t, x.m1.MsgID)
	notYet(t, done)
	if r := record(t, x.s, x.m1.MsgID); r.State != Delivered {
		t.Errorf("m1 = %s, want delivered", r.State)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// a soon read behind a soon write waits with it; an ordinary write
	// releases both
	done = x.ackSoon(t, x.m2.MsgID)
	head := make(chan []Item, 1)
	go func() {
		items, err := x.s.HeadSoon(x.bob.Gid, After{}, 10)
		if err != nil {
			t.Error(err)
		}
		head <- items
	}()
	notYet(t, done)
	if err := x.s.SetMeta("k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if items := <-head; len(items) != 0 {
		t.Errorf("HeadSoon after both acknowledgements: %d items, want none", len(items))
	}
}

// Close flushes a soon write that still waits.
func TestSoonIsFlushedAtClose(t *testing.T) {
	x := newSoon(t)
	done := x.ackSoon(t, x.m1.MsgID, x.m2.MsgID)
	notYet(t, done)
	closeStore(t, x.s)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := openTracked(t, x.path)
	if got := inbox(t, s, x.bob.Gid); len(got) != 0 {
		t.Errorf("bob's inbox after close = %v, want empty", got)
	}
}

// With the real delay, a soon write alone is flushed by itself.
func TestSoonAloneIsFlushed(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	m := msg(a.Gid, b.Gid, "1")
	accept(t, s, m)
	if err := s.DeliveredSoon([]string{m.MsgID}, t0); err != nil {
		t.Fatal(err)
	}
	crash(t, s)
	s = openTracked(t, path)
	if r := record(t, s, m.MsgID); r.State != Delivered {
		t.Errorf("m = %s after a crash, want delivered", r.State)
	}
}
