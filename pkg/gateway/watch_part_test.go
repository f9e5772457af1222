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
	w := newWatchers("h1", slog.New(slog.NewTextHandler(io.Discard, nil)), newRegistry())
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
	w := newWatchers("h1", slog.New(slog.NewTextHandler(io.Discard, nil)), newRegistry())
	served := make(chan struct{})
	go func() { w.Serve(&conn{c: uc}, nil); uc.Close(); close(served) }()
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
