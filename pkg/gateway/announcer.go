package gateway

// announcer.go — what this host says of its own entities on the broker:
// the chain of its presence messages (presence.go has their wire format
// and the receiving side). One goroutine owns the chain: it takes each
// message's place in it, reads what the message says (the store) and
// hands it to the broker, one at a time, in sequence order — so the
// order is kept without a lock held across the store or the broker. The
// lock guards only the announcer's small state (the sequence, what was
// said, the queue of notices).

import (
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
)

// statusSettle is how long a status change from an ask waits before it is
// announced: an ask answered within it ("waiting", then back) costs the
// fleet no presence traffic at all, where announcing each change would
// put two presence messages, copied to every gateway, beside each ask. A
// longer ask reads "waiting" on the other hosts this much later; the local
// roster shows it at once either way.
const statusSettle = 500 * time.Millisecond

// announceHooks is what the announcer reads and where it publishes: the
// Gateway wires them. Each is called from the chain's goroutine, with no
// lock of the announcer's held.
type announceHooks struct {
	row     func(gid string) (api.EntityRow, bool) // a local entity's row now; false: it is not here
	rows    func() ([]api.EntityRow, error)        // every local entity's row
	cert    func() string                          // the host's operator certificate ("": none; certs.go)
	sealKey func() string                          // the host's current public sealing key ("": none; sealkeys.go)
	extras  func() (revoked, admits []string, certified bool)
	publish func(env *envelope.Envelope, what string, ttl time.Duration) (confirmed func() error, err error)
	up      func() bool // connected to the broker now
	told    func()      // after each snapshot (names.go: a name on two hosts, told)
}

// announcer owns what this gateway has said of its own entities: the
// chain of its presence messages, the status last announced per entity,
// the change notices waiting their turn and the settled announcements
// scheduled, and the goroutines that publish them.
type announcer struct {
	host     string
	interval time.Duration
	ttl      time.Duration // presence-ttl: a message lives twice that on the broker
	log      *slog.Logger
	h        announceHooks

	mu      sync.Mutex
	seq     int64             // the last presence sequence taken
	said    map[string]string // gid -> the status last announced
	due     map[string]bool   // gid -> a settled status announcement is scheduled
	queue   []notice          // change notices waiting their turn, in order
	queued  map[string]bool   // gid -> a plain notice of it is in queue
	big     int               // the entities last found too many for a snapshot (logged once per count)
	running bool              // Start was called, Stop not yet: notices are taken
	leaving bool              // Leave was called
	wake    chan struct{}     // cap 1: queue has something
	leave   chan struct{}     // closed: the leaving notice is the next link
	rekey   chan struct{}     // cap 1: the sealing key changed, a snapshot says so now
	quit    chan struct{}     // closed: stop now
	wg      sync.WaitGroup    // the chain's goroutine and its confirmer

	prev     int64             // the chain's own: the seq of the last message handed to the broker
	confirms chan func() error // the chain's: confirms to wait for, off its path
}

// notice is a change notice waiting its turn: settled ones are said only
// if the status differs, by then, from the one last said.
type notice struct {
	gid     string
	settled bool
}

func newAnnouncer(host string, interval, ttl time.Duration, log *slog.Logger, h announceHooks) *announcer {
	return &announcer{host: host, interval: interval, ttl: ttl, log: log, h: h,
		said: map[string]string{}, due: map[string]bool{}, queued: map[string]bool{},
		wake: make(chan struct{}, 1), rekey: make(chan struct{}, 1), leave: make(chan struct{}), quit: make(chan struct{})}
}

// Start starts the chain: a whole snapshot every interval, and one at
// once when the broker comes back (up), until ticks is done; change
// notices until Leave or Stop.
func (a *announcer) Start(ticks <-chan struct{}, up <-chan bool) {
	a.mu.Lock()
	a.running = true
	a.mu.Unlock()
	a.confirms = make(chan func() error, 64)
	a.wg.Add(2)
	go a.run(ticks, up)
	go func() { // confirms are awaited off the chain's path
		defer a.wg.Done()
		for c := range a.confirms {
			if err := c(); err != nil {
				a.log.Debug("presence not confirmed", "err", err)
			}
		}
	}()
}

// Change announces at once, in the chain's turn, that gid joined, left
// or changed status or groups: the notice carries its row as it is when
// it is published, so two quick changes never reach the other hosts in
// the wrong order — whichever notice goes last carries the latest state.
func (a *announcer) Change(gid string) { a.enqueue(notice{gid: gid}) }

// Soon announces gid's row statusSettle from now, unless by then its
// status is back to the one last announced.
func (a *announcer) Soon(gid string) {
	a.mu.Lock()
	if !a.running || a.due[gid] {
		a.mu.Unlock()
		return
	}
	a.due[gid] = true
	a.mu.Unlock()
	time.AfterFunc(statusSettle, func() { a.enqueue(notice{gid: gid, settled: true}) })
}

func (a *announcer) enqueue(n notice) {
	a.mu.Lock()
	if n.settled {
		delete(a.due, n.gid)
	}
	if !a.running || a.queued[n.gid] {
		a.mu.Unlock()
		return // stopped, or a notice of it still waits: that one says the latest
	}
	if !n.settled {
		a.queued[n.gid] = true
	}
	a.queue = append(a.queue, n)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Rekey announces a whole snapshot at once, in the chain's turn: the
// host's sealing key changed (fleet-gw seal rotate), and every message
// carries the current one, so the other hosts seal to it from the next
// message on, not an interval later.
func (a *announcer) Rekey() {
	select {
	case a.rekey <- struct{}{}:
	default:
	}
}

// Leave publishes the leaving notice, after the notices already waiting,
// as the chain's last link (other hosts drop this one now, not after the
// TTL), and stops the chain. It waits at most wait for the chain.
func (a *announcer) Leave(wait time.Duration) {
	a.mu.Lock()
	first := a.running && !a.leaving
	a.leaving = true
	a.mu.Unlock()
	if !first {
		return
	}
	close(a.leave)
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
	}
	a.Stop()
}

// Stop ends the chain without a leaving notice (another gateway has this
// host id: nothing more is said on its behalf) and waits for its
// goroutines; notices still waiting are dropped.
func (a *announcer) Stop() {
	a.mu.Lock()
	if !a.running {
		a.mu.Unlock()
		return
	}
	a.running = false
	a.mu.Unlock()
	close(a.quit)
	a.wg.Wait()
}

// run is the chain's goroutine.
func (a *announcer) run(ticks <-chan struct{}, up <-chan bool) {
	defer a.wg.Done()
	defer close(a.confirms)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	tick := t.C
	if a.h.up() { // connected before the chain started: say so now
		a.snapshot()
	}
	for {
		select {
		case <-a.quit:
			return
		case <-ticks: // shutdown: no more snapshots, notices until the leaving one
			tick, up, ticks = nil, nil, nil
		case <-tick:
			a.snapshot()
		case ok := <-up:
			if ok {
				a.snapshot()
			}
		case <-a.rekey:
			if tick != nil { // not once shutting down: the leaving notice is next
				a.snapshot()
			}
		case <-a.wake:
			a.notices()
		case <-a.leave:
			a.notices()
			a.sendLeaving()
			return
		}
	}
}

// notices publishes the change notices waiting, in order.
func (a *announcer) notices() {
	for {
		a.mu.Lock()
		if len(a.queue) == 0 {
			a.mu.Unlock()
			return
		}
		n := a.queue[0]
		a.queue = a.queue[1:]
		if !n.settled {
			delete(a.queued, n.gid)
		}
		said := a.said[n.gid]
		a.mu.Unlock()

		var c presenceChange
		r, here := a.h.row(n.gid)
		if n.settled && (!here || wireStatus(r.Status) == said) {
			continue // gone, or flapped back: nothing new to say
		}
		if here {
			r.Host, r.Target = "", "" // the host is the message's; a pane or command is this host's business
			onWire(&r)
			c.Row = &r
			a.say(n.gid, r.Status)
		} else {
			c.Gone = n.gid
			a.say(n.gid, "")
		}
		if err := a.send("change", presenceBody{Seq: a.next(), Change: &c}); err != nil {
			a.log.Debug("presence change not announced", "gid", n.gid, "err", err)
		}
	}
}

// snapshot publishes a snapshot of every local entity, in as few pages as
// fit, one page after another; their confirms are awaited together, off
// the chain's path, so a big snapshot takes a moment, not a round trip a
// page.
func (a *announcer) snapshot() {
	defer a.h.told()
	revoked, admits, certified := a.h.extras() // a certificate installed, a revocation list imported
	rows, err := a.h.rows()
	if err != nil {
		return
	}
	if len(rows) > maxSnapshotRows {
		a.tooMany(len(rows))
		rows = rows[:maxSnapshotRows]
	}
	raw := make([]json.RawMessage, 0, len(rows))
	for i := range rows {
		r := &rows[i]
		onWire(r)
		a.say(r.Gid, r.Status)
		r.Host, r.Target = "", "" // the host is the message's; a pane or command is this host's business
		j, err := json.Marshal(r)
		if err != nil {
			continue
		}
		raw = append(raw, j)
	}
	pages := snapshotPages(raw, presencePageBytes)
	if len(pages) > maxSnapshotPages {
		a.tooMany(len(rows))
		pages = pages[:maxSnapshotPages]
		for i := range pages {
			pages[i].Pages = maxSnapshotPages
		}
	}
	for i := range pages {
		seq := a.next()
		if i == 0 {
			for j := range pages {
				pages[j].ID = seq
			}
		}
		b := presenceBody{Seq: seq, Snapshot: &pages[i]}
		if i == 0 {
			b.Revoked = revoked
			b.Admits, b.AdmitsCertified = &admits, certified
		}
		if err := a.send("snapshot", b); err != nil {
			a.log.Debug("presence snapshot not announced", "page", i, "pages", len(pages), "err", err)
			return // the rest could not complete it
		}
	}
}

// sendLeaving publishes the leaving notice and waits for its confirm: it
// is the last word on the broker.
func (a *announcer) sendLeaving() {
	b := presenceBody{Seq: a.next(), Leaving: true}
	confirmed, err := a.publish("leaving", b)
	if err == nil {
		_ = confirmed()
	}
}

// send hands one presence message (b.Seq taken) to the broker as the
// next link of this host's chain, its confirm awaited off the chain's
// path. A message the broker did not take leaves the chain where it was;
// one taken but not confirmed may or may not reach the others, and the
// chain moves on: a receiver that missed it waits for the next snapshot.
func (a *announcer) send(what string, b presenceBody) error {
	confirmed, err := a.publish(what, b)
	if err != nil {
		return err
	}
	a.confirms <- confirmed
	return nil
}

func (a *announcer) publish(what string, b presenceBody) (confirmed func() error, err error) {
	b.Host, b.IntervalMS, b.Prev = a.host, a.interval.Milliseconds(), a.prev
	b.Cert = a.h.cert()
	if a.h.sealKey != nil {
		b.SealKey = a.h.sealKey()
	}
	body, err := json.Marshal(b)
	if err != nil {
		return nil, err
	}
	env := envelope.New(envelope.Presence, envelope.Party{Host: a.host}, envelope.Party{Group: "roster"}, string(body))
	confirmed, err = a.h.publish(env, what, 2*a.ttl)
	if err != nil {
		return nil, err
	}
	a.prev = b.Seq
	return confirmed, nil
}

// next is the sequence of the next presence message: the clock in ns,
// strictly increasing.
func (a *announcer) next() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq = max(time.Now().UnixNano(), a.seq+1)
	return a.seq
}

// say records the status announced for gid ("" forgets it).
func (a *announcer) say(gid, status string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if status == "" {
		delete(a.said, gid)
		return
	}
	a.said[gid] = status
}

// tooMany says, once per count, that this host has more entities than a
// snapshot carries: the others see only the first ones.
func (a *announcer) tooMany(n int) {
	a.mu.Lock()
	say := a.big != n
	a.big = n
	a.mu.Unlock()
	if say {
		a.log.Error("too many entities for a presence snapshot: the other hosts see only the first ones",
			"entities", n, "max_rows", maxSnapshotRows, "max_pages", maxSnapshotPages)
	}
}
