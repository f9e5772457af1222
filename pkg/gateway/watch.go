package gateway

// watch.go — the watch stream (issue 38): what happens on this gateway,
// as events, to whoever holds an OpWatch connection (fleet-roster
// --watch, fleet-top). The events come from the parts that already say
// what happened: every audit line (the audit log's tap: messages,
// receipts, bounces, joins and leaves, dead letters), the entities'
// changes of state (the change notices presence announces), and the
// peers' changes (peers.go). No event carries a message's text, and no
// event adds traffic between hosts: another host's rows are what this
// gateway hears anyway.
//
// A watcher never slows the gateway: an event is handed to each
// watcher's bounded queue without waiting, and a watcher whose queue is
// full is dropped, told why (slow_watcher) if its socket still takes a
// frame within watchWrite.

import (
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// watchQueue is how many events a watcher may be behind before it is
// dropped; watchWrite how long one frame to it may take.
const (
	watchQueue = 1024
	watchWrite = 5 * time.Second
)

// watchLinger is how long the stream waits after an event for more to
// write with it, watchBatch how many it writes at most in one write. At
// 100 messages a second a watcher's stream was one write and one wake-up
// per event: about an eighth of the gateway's CPU (scripts/BENCHMARKS.md,
// bench-top).
const (
	watchLinger = 50 * time.Millisecond
	watchBatch  = 64
)

// watchers owns the open watch streams: who watches, and each one's
// queue. Emit is safe from any goroutine and costs one atomic load when
// nobody watches.
type watchers struct {
	host string
	log  *slog.Logger
	reg  *registry    // an entity's state, for its status events
	st   *store.Store // a watcher's own mail, for its text (nil: never)

	// the peers' states, read while anyone watches (peerLoop): the view,
	// the presence TTL and the broker (linked once in Run; nil in
	// single-host mode, where there are no peers)
	peers *peerView
	ttl   time.Duration
	link  linkState
	every time.Duration // how often the peers' states are read
	stop  chan struct{} // closed when the last watcher goes: peerLoop ends

	n    atomic.Int32 // open watchers: Emit's fast path
	mu   sync.Mutex
	subs map[*watcher]struct{}
}

// watcher is one open stream: its queue, and dropped, closed once when
// it fell behind.
type watcher struct {
	ch      chan api.WatchEvent
	dropped chan struct{}
}

// linkState is whether this gateway is connected to the broker now.
type linkState interface{ Connected() bool }

func newWatchers(host string, log *slog.Logger, reg *registry, peers *peerView, ttl time.Duration) *watchers {
	return &watchers{host: host, log: log, reg: reg, peers: peers, ttl: ttl, every: 500 * time.Millisecond, subs: map[*watcher]struct{}{}}
}

// Link gives the watch stream the broker whose connection decides how the
// peers read (Run, before any client is served).
func (w *watchers) Link(l linkState) { w.link = l }

// Emit hands ev to every watcher, never waiting: one that has no room is
// dropped.
func (w *watchers) Emit(ev api.WatchEvent) {
	if w == nil || w.n.Load() == 0 {
		return
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	ev.Host = w.host
	w.mu.Lock()
	defer w.mu.Unlock()
	for s := range w.subs {
		select {
		case s.ch <- ev:
		default:
			delete(w.subs, s)
			w.dropLocked()
			close(s.dropped)
		}
	}
}

// Tap is the audit log's tap: each audit line, as an event.
func (w *watchers) Tap(l audit.Line) {
	if w.n.Load() == 0 {
		return
	}
	w.Emit(api.WatchEvent{Time: l.Time, Event: l.Event, Entity: l.Entity, TraceID: dash(l.TraceID), MsgID: l.MsgID,
		Kind: l.Kind, Sender: l.Sender, Recipient: l.Recipient, Size: l.Size, Attempt: l.Attempt, Reason: l.Reason})
}

// dash is s, "" for the audit log's "-" (a line of no trace).
func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// Change is a change notice of a local entity: its state now, as a
// status event.
func (w *watchers) Change(gid string) {
	if w.n.Load() == 0 {
		return
	}
	b := w.reg.Get(gid)
	if b == nil {
		return // left: its "left" audit line says so
	}
	e := b.snapshot()
	w.Emit(api.WatchEvent{Event: "status", Entity: e.Name, Gid: e.Gid, Status: e.Status, Reason: e.StatusReason})
}

// Peer is a host seen going live, stale, gone or unknown.
func (w *watchers) Peer(host, status string) {
	w.Emit(api.WatchEvent{Event: "peer", Peer: host, Status: status})
}

func (w *watchers) add() *watcher {
	s := &watcher{ch: make(chan api.WatchEvent, watchQueue), dropped: make(chan struct{})}
	w.mu.Lock()
	w.subs[s] = struct{}{}
	if w.n.Add(1) == 1 && w.link != nil {
		w.stop = make(chan struct{})
		go w.peerLoop(w.stop)
	}
	w.mu.Unlock()
	return s
}

func (w *watchers) remove(s *watcher) {
	w.mu.Lock()
	if _, ok := w.subs[s]; ok {
		delete(w.subs, s)
		w.dropLocked()
	}
	w.mu.Unlock()
}

// dropLocked counts one watcher gone; the last one ends peerLoop. w.mu
// is held.
func (w *watchers) dropLocked() {
	if w.n.Add(-1) == 0 && w.stop != nil {
		close(w.stop)
		w.stop = nil
	}
}

// peerLoop reads the peers' states while anyone watches, and says each
// change as a peer event. A host goes stale or gone by time passing, not
// by anything heard, so it is read, every w.every: from the view this
// gateway keeps anyway, with no traffic between hosts. What the peers
// read when the first watcher came is the baseline, not an event
// (fleet-gw status --json lists them).
func (w *watchers) peerLoop(stop <-chan struct{}) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	last := w.peers.States(time.Now(), w.link.Connected(), w.ttl)
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := w.peers.States(time.Now(), w.link.Connected(), w.ttl)
		for _, host := range slices.Sorted(maps.Keys(now)) {
			if now[host] != last[host] {
				w.Peer(host, now[host])
			}
		}
		last = now
	}
}

// Serve streams events to c until the client goes, the gateway stops
// (closing), or the watcher falls behind. The first frame is an OK
// without an event: the stream is open, and every event after it is
// sent. own is the watcher's gid when it asked for its own mail's text
// ("" otherwise): a message stored in that inbox carries it.
func (w *watchers) Serve(c *conn, closing <-chan struct{}, own string) {
	s := w.add()
	defer w.remove(s)
	gone := make(chan struct{})
	go func() {
		// the client sends nothing more: a read ends when it closes
		var one [1]byte
		c.c.SetReadDeadline(time.Time{})
		c.c.Read(one[:])
		close(gone)
	}()
	if w.write(c, &api.Response{OK: true}) != nil {
		return
	}
	var (
		batch []api.WatchEvent
		buf   []byte
	)
	for {
		select {
		case ev := <-s.ch:
			batch = s.gather(ev, batch)
			for i := range batch {
				if ev := &batch[i]; own != "" && ev.Recipient == own && (ev.Event == "accepted" || ev.Event == "taken") {
					ev.Body = w.text(own, ev.MsgID)
				}
			}
			if w.writeAll(c, batch, &buf) != nil {
				return
			}
		case <-s.dropped:
			w.log.Warn("a watcher fell behind: dropped", "pid", c.pid, "queue", watchQueue)
			w.write(c, &api.Response{Error: api.FromFault(fault.New(fault.TempFail, fault.KindSlowWatcher,
				"this watch stream fell %d events behind: the gateway dropped it", watchQueue))})
			return
		case <-gone:
			return
		case <-closing:
			w.write(c, &api.Response{Error: api.FromFault(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))})
			return
		}
	}
}

// text is the body of message msgID in gid's inbox ("" once it left it).
func (w *watchers) text(gid, msgID string) string {
	if w.st == nil {
		return ""
	}
	rec, err := w.st.Record(msgID)
	if err != nil || rec.Recipient != gid { // a broadcast copy is recorded per member
		if rec, err = w.st.Record(msgID + "/" + gid); err != nil {
			return ""
		}
	}
	env, err := w.st.At(gid, rec.Seq)
	if err != nil || env == nil || env.MsgID != msgID {
		return ""
	}
	return env.Body
}

// gather is first and the events that follow it within watchLinger, at
// most watchBatch: one write for a burst (a message's steps come
// together), not one write, and one wake-up of the watcher, for each.
func (s *watcher) gather(first api.WatchEvent, batch []api.WatchEvent) []api.WatchEvent {
	batch = append(batch[:0], first)
	t := time.NewTimer(watchLinger)
	defer t.Stop()
	for len(batch) < watchBatch {
		select {
		case ev := <-s.ch:
			batch = append(batch, ev)
		case <-t.C:
			return batch
		case <-s.dropped:
			return batch
		}
	}
	return batch
}

// writeAll writes the events as frames in one write to c.
func (w *watchers) writeAll(c *conn, evs []api.WatchEvent, buf *[]byte) error {
	out := (*buf)[:0]
	for i := range evs {
		var err error
		if out, err = api.AppendEventFrame(out, &evs[i]); err != nil {
			return err
		}
	}
	*buf = out
	c.c.SetWriteDeadline(time.Now().Add(watchWrite))
	_, err := c.c.Write(out)
	return err
}

func (w *watchers) write(c *conn, resp *api.Response) error {
	c.c.SetWriteDeadline(time.Now().Add(watchWrite))
	return c.reply(resp)
}

// changes are the parts told of a change of a local entity's state:
// presence (announcer.go) and the watch stream.
type changes []interface{ Change(gid string) }

// Change tells each of them of gid's change.
func (cs changes) Change(gid string) {
	for _, c := range cs {
		c.Change(gid)
	}
}
