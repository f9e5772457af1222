package gateway

import (
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// testSlot is a connection as the slots see it: whether it was kicked,
// and whether it has bytes waiting.
type testSlot struct {
	*slot
	kicked chan struct{}
	queued atomic.Bool
}

func admitTest(t *testing.T, s *slots) (*testSlot, error) {
	t.Helper()
	ts := &testSlot{kicked: make(chan struct{})}
	sl, err := s.admit(func() { close(ts.kicked) }, ts.queued.Load)
	ts.slot = sl
	return ts, err
}

func mustAdmit(t *testing.T, s *slots) *testSlot {
	t.Helper()
	ts, err := admitTest(t, s)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	return ts
}

func (ts *testSlot) wasKicked() bool {
	select {
	case <-ts.kicked:
		return true
	default:
		return false
	}
}

// A connection that sends no complete frame within the timeout is cut
// and told why; one that spoke keeps its slot, idle or in a stream, for
// as long as it likes.
func TestSlotsCutSilent(t *testing.T) {
	s := newSlots(8, 50*time.Millisecond)
	var timeouts atomic.Int32
	s.onTimeout = func() { timeouts.Add(1) }
	idle, streaming, mute := mustAdmit(t, s), mustAdmit(t, s), mustAdmit(t, s)
	if err := idle.spoke(); err != nil {
		t.Fatal(err)
	}
	if err := streaming.spoke(); err != nil {
		t.Fatal(err)
	}
	streaming.set(holdStream)
	select {
	case <-mute.kicked:
	case <-time.After(30 * time.Second): // only so that a hang ends
		t.Fatal("a connection that never spoke was not cut")
	}
	err := mute.spoke()
	if fault.KindOf(err) != fault.KindBadFrame || fault.CodeOf(err) != fault.Data || !strings.Contains(err.Error(), "within 50ms of connecting (frame-timeout)") {
		t.Fatalf("the cut connection's reason: %v", err)
	}
	// a later one, cut by a later sweep: the clients that spoke are past
	// two deadlines by then
	late := mustAdmit(t, s)
	select {
	case <-late.kicked:
	case <-time.After(30 * time.Second):
		t.Fatal("the second connection that never spoke was not cut")
	}
	if idle.wasKicked() || streaming.wasKicked() {
		t.Fatalf("a connection that spoke was cut (idle %v, streaming %v)", idle.wasKicked(), streaming.wasKicked())
	}
	if n := timeouts.Load(); n != 2 {
		t.Errorf("%d timeouts counted, want 2", n)
	}
	if got, want := s.holders(), "2 waiting for a first frame, 1 streams or waits, 1 idle between requests"; got != want {
		t.Errorf("holders before the cut ones leave: %q, want %q", got, want)
	}
	mute.leave()
	late.leave()
	if got, want := s.holders(), "1 streams or waits, 1 idle between requests"; got != want {
		t.Errorf("holders: %q, want %q", got, want)
	}
}

// At the cap, a newcomer takes the place of the oldest connection that
// has sent nothing; one whose first bytes wait unread, or one that spoke,
// is never taken. With nothing to take, the refusal names the holders.
func TestSlotsEvictOldestSilent(t *testing.T) {
	s := newSlots(3, time.Hour)
	var evicted atomic.Int32
	s.onEvict = func() { evicted.Add(1) }
	a, b, c := mustAdmit(t, s), mustAdmit(t, s), mustAdmit(t, s)
	b.queued.Store(true) // its hello is there, not read yet
	if err := c.spoke(); err != nil {
		t.Fatal(err)
	}
	c.set(holdStream)

	d := mustAdmit(t, s) // takes a's place
	if !a.wasKicked() || b.wasKicked() || c.wasKicked() {
		t.Fatalf("kicked: a %v b %v c %v, want a alone", a.wasKicked(), b.wasKicked(), c.wasKicked())
	}
	if err := a.spoke(); fault.KindOf(err) != fault.KindTooManyConnections || fault.CodeOf(err) != fault.TempFail {
		t.Fatalf("the connection cut to make room: %v", err)
	}
	a.leave()            // its place went to d: leaving frees none
	e := mustAdmit(t, s) // b is skipped (queued): d's place
	if b.wasKicked() || !d.wasKicked() {
		t.Fatalf("kicked: b %v d %v, want d", b.wasKicked(), d.wasKicked())
	}
	d.leave()
	if err := b.spoke(); err != nil {
		t.Fatal(err)
	}
	e.queued.Store(true)

	_, err := admitTest(t, s)
	want := "the gateway is serving its limit of 3 connections: 1 waiting for a first frame, 1 streams or waits, 1 idle between requests"
	if fault.KindOf(err) != fault.KindTooManyConnections || fault.CodeOf(err) != fault.TempFail || err.Error() != want {
		t.Fatalf("over the cap: %v, want %q", err, want)
	}
	if h := fault.HintOf(err); !strings.Contains(h, "frame-timeout") {
		t.Errorf("hint with a connection waiting for its first frame: %q", h)
	}
	if err := e.spoke(); err != nil {
		t.Fatal(err)
	}
	e.set(holdBusy)
	_, err = admitTest(t, s)
	if want := "limit of 3 connections: 1 in a request, 1 streams or waits, 1 idle between requests"; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("over the cap held by clients: %v, want %q", err, want)
	}
	if h := fault.HintOf(err); !strings.Contains(h, "fleet-recv --follow") || !strings.Contains(h, "max-connections") {
		t.Errorf("hint with clients holding every slot: %q", h)
	}
	if n := evicted.Load(); n != 2 {
		t.Errorf("%d evictions counted, want 2", n)
	}
	c.leave() // a place comes free
	f := mustAdmit(t, s)
	if b.wasKicked() || e.wasKicked() || f.wasKicked() {
		t.Fatal("a client was cut")
	}
}

// What the gateway's slots do to a real connection: kicking it ends a
// read that waits (an end of file), and unread sees bytes that came.
func TestSlotsKickRealConn(t *testing.T) {
	srv, cli := unixPair(t)
	if unread(srv) {
		t.Fatal("unread before anything was sent")
	}
	cli.Write([]byte("hello"))
	deadline := time.Now().Add(30 * time.Second)
	for !unread(srv) {
		if time.Now().After(deadline) {
			t.Fatal("unread never saw the bytes sent")
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, 5)
	io.ReadFull(srv, buf)

	read := make(chan error, 1)
	go func() {
		_, err := srv.Read(buf)
		read <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block (if it has not yet, it reads the end at once)
	srv.CloseRead()
	select {
	case err := <-read:
		if !errors.Is(err, io.EOF) {
			t.Fatalf("a kicked read: %v, want io.EOF", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("CloseRead did not end a blocked read")
	}
}
