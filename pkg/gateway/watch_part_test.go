package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// TestWatcherBehindIsDropped: Emit never waits; a watcher whose queue
// is full is dropped, the others keep every event.
func TestWatcherBehindIsDropped(t *testing.T) {
	w := newWatchers("h1", slog.New(slog.NewTextHandler(io.Discard, nil)), newRegistry(), nil, 0)
	w.Emit(api.WatchEvent{Event: "nobody watches"}) // no watcher: nothing to do
	slow, fast := w.add(), w.add()
	got := 0
	for i := 0; i < watchQueue+1; i++ {
		w.Emit(api.WatchEvent{Event: fmt.Sprint(i)})
		select { // fast reads as it comes
		case <-fast.ch:
			got++
		default:
		}
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("a watcher past its queue was not dropped")
	}
	select {
	case <-fast.dropped:
		t.Fatal("a watcher that kept up was dropped")
	default:
	}
	if got != watchQueue+1 {
		t.Fatalf("the watcher that kept up got %d events, want %d", got, watchQueue+1)
	}
	if n := w.n.Load(); n != 1 {
		t.Fatalf("%d watchers counted, want 1", n)
	}
}

// TestStuckWatcherToldOverItsSocket: a watcher on a real unix socket
// that stops reading is dropped, and told why (slow_watcher) once it
// reads again; Emit never waited for it.
func TestStuckWatcherToldOverItsSocket(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	uc, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	w := newWatchers("h1", slog.New(slog.NewTextHandler(io.Discard, nil)), newRegistry(), nil, 0)
	served := make(chan struct{})
	go func() { w.Serve(&conn{c: uc}, nil, ""); uc.Close(); close(served) }()
	read := func() *api.Response {
		t.Helper()
		client.SetReadDeadline(time.Now().Add(30 * time.Second))
		data, err := api.ReadFrame(client, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var r api.Response
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	if r := read(); !r.OK || r.Event != nil {
		t.Fatalf("first frame %+v, want OK and no event", r)
	}
	// the client reads nothing while far more than its queue and the
	// socket's buffers hold is emitted: Emit returns every time
	start := time.Now()
	for i := 0; i < 20*watchQueue; i++ {
		w.Emit(api.WatchEvent{Event: "filler", Reason: fmt.Sprintf("%0200d", i)})
	}
	if w.n.Load() != 0 {
		t.Fatal("the stuck watcher is still counted")
	}
	t.Logf("%d events emitted in %v", 20*watchQueue, time.Since(start))
	for {
		r := read()
		if r.Error != nil {
			if fe := r.Error.Fault(); fe.Kind != fault.KindSlowWatcher {
				t.Fatalf("the stream ended with %v, want slow_watcher", fe)
			}
			break
		}
	}
	<-served
}

type linked bool

func (l linked) Connected() bool { return bool(l) }

// TestWatcherHearsPeersGo: while someone watches, a host the view heard
// going stale then gone by time passing is said as peer events, each
// change once; with the last watcher gone the loop ends.
func TestWatcherHearsPeersGo(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := newPeerView(40*time.Millisecond, log)
	v.mu.Lock()
	v.peerLocked("h2").heard = time.Now() // heard now, every 40ms: live
	v.mu.Unlock()
	w := newWatchers("h1", log, newRegistry(), v, 300*time.Millisecond)
	w.every = 10 * time.Millisecond
	w.Link(linked(true))
	s := w.add()
	var got []string
	deadline := time.After(10 * time.Second)
	for len(got) < 2 {
		select {
		case ev := <-s.ch:
			if ev.Event != "peer" || ev.Peer != "h2" {
				t.Fatalf("event %+v, want peer h2", ev)
			}
			got = append(got, ev.Status)
		case <-deadline:
			t.Fatalf("peer events %v, want stale then gone", got)
		}
	}
	if got[0] != hostStale || got[1] != hostGone {
		t.Fatalf("peer events %v, want stale then gone", got)
	}
	select {
	case ev := <-s.ch:
		t.Fatalf("a change said twice: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	stop := w.stop
	w.remove(s)
	select {
	case <-stop:
	default:
		t.Fatal("the last watcher went and the peer loop was not stopped")
	}
}

// TestWatchBurstInOrder: a burst of events reaches the client whole and
// in order, each its own frame, though written in few writes; an event
// after the burst still comes.
func TestWatchBurstInOrder(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	uc, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	w := newWatchers("h1", slog.New(slog.NewTextHandler(io.Discard, nil)), newRegistry(), nil, 0)
	go w.Serve(&conn{c: uc}, nil, "")
	read := func() *api.Response {
		t.Helper()
		client.SetReadDeadline(time.Now().Add(30 * time.Second))
		data, err := api.ReadFrame(client, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		var r api.Response
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	if r := read(); !r.OK || r.Event != nil {
		t.Fatalf("first frame %+v, want OK and no event", r)
	}
	n := 3*watchBatch + 5 // more than one write's worth
	for i := range n {
		w.Emit(api.WatchEvent{Event: "accepted", MsgID: fmt.Sprint(i)})
	}
	for i := range n {
		if r := read(); r.Event == nil || r.Event.MsgID != fmt.Sprint(i) || r.Event.Host != "h1" {
			t.Fatalf("frame %d is %+v, want the event of msg %d", i, r, i)
		}
	}
	w.Emit(api.WatchEvent{Event: "taken", MsgID: "last"})
	if r := read(); r.Event == nil || r.Event.MsgID != "last" {
		t.Fatalf("after the burst: %+v, want the event of msg last", r)
	}
}
