package gateway

// slots.go — the socket's connection slots: how many connections are
// served at once, what each one is doing with its slot, and the bound on
// connections that never say anything.

import (
	"container/list"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// hold is what a connection does with its slot.
type hold int

const (
	holdSilent hold = iota // no complete frame yet: not a client until it says something
	holdBusy               // a request being served
	holdStream             // a stream or a wait: recv, ask, send --wait, wait_reply, wait --until
	holdIdle               // between requests, after its hello
	nHolds
)

// holdNames name the holds in a refusal, in this order.
var holdNames = [nHolds]string{
	holdSilent: "waiting for a first frame",
	holdBusy:   "in a request",
	holdStream: "streams or waits",
	holdIdle:   "idle between requests",
}

// slots bounds the socket's connections. At most max are served at once.
// A connection that has sent no complete frame within timeout of being
// admitted is cut (a stream or an idle client that has said hello keeps
// its slot however long it waits); and at the cap, a newcomer takes the
// slot of the oldest connection that has sent nothing yet, so connections
// that never speak cannot keep a client out. A newcomer is refused only
// when every slot is held by a connection that spoke (or whose first
// bytes are there, not read yet), and the refusal says what holds them.
//
// The silent connections are a list, oldest first; one timer sweeps it.
type slots struct {
	max     int
	timeout time.Duration

	onTimeout func() // a silent connection was cut at the deadline (nil: nothing)
	onEvict   func() // a silent connection was cut to make room (nil: nothing)

	n [nHolds]atomic.Int64 // connections by hold: what a refusal names

	mu     sync.Mutex
	open   int         // connections admitted and not left
	silent list.List   // *slot, oldest first: the holdSilent ones not cut
	sweep  *time.Timer // armed while silent is not empty
}

// slot is one connection's place. Only its connection's goroutine calls
// its methods; the slots' sweep and a newcomer cut it through kick.
type slot struct {
	s      *slots
	hold   hold          // the connection's goroutine's; holdSilent changes under s.mu
	at     time.Time     // admitted
	el     *list.Element // in s.silent while silent and not cut
	kick   func()        // ends the connection's reads (it reads an end of file)
	queued func() bool   // whether bytes the gateway has not read yet are waiting
	cut    error         // why it was cut, under s.mu; nil: not cut
	given  bool          // cut to make room: its place is the newcomer's already (under s.mu)
}

// evictScan bounds how many of the oldest silent connections a newcomer
// looks at for one that has sent nothing (the others' first frames are
// there, not read yet: they are about to be clients).
const evictScan = 16

func newSlots(max int, timeout time.Duration) *slots {
	return &slots{max: max, timeout: timeout}
}

// admit gives a new connection a slot, or returns the refusal to send it
// (a fault.TempFail that names what holds the slots). kick must make the
// connection's blocked read return; queued reports whether it has bytes
// waiting to be read.
func (s *slots) admit(kick func(), queued func() bool) (*slot, error) {
	now := time.Now()
	s.mu.Lock()
	var victim *slot
	if s.open >= s.max {
		victim = s.evictable()
		if victim == nil {
			err := s.refusal()
			s.mu.Unlock()
			return nil, err
		}
		victim.cutLocked(fault.New(fault.TempFail, fault.KindTooManyConnections,
			"connection closed to make room: it sent no request within %v of connecting, and the gateway is at its limit of %d connections",
			now.Sub(victim.at).Round(time.Millisecond), s.max).
			WithHint("a client sends its hello at once; one that waits loses its place when the gateway is full"))
		victim.given = true
		s.n[holdSilent].Add(-1)
		s.open--
	}
	sl := &slot{s: s, hold: holdSilent, at: now, kick: kick, queued: queued}
	sl.el = s.silent.PushBack(sl)
	s.open++
	s.n[holdSilent].Add(1)
	if s.sweep == nil {
		s.sweep = time.AfterFunc(s.timeout, s.expire)
	}
	s.mu.Unlock()
	if victim != nil {
		victim.kick()
		if s.onEvict != nil {
			s.onEvict()
		}
	}
	return sl, nil
}

// evictable is the oldest silent connection that has sent nothing, among
// the evictScan oldest; nil if none.
func (s *slots) evictable() *slot {
	i := 0
	for e := s.silent.Front(); e != nil && i < evictScan; e, i = e.Next(), i+1 {
		if sl := e.Value.(*slot); !sl.queued() {
			return sl
		}
	}
	return nil
}

// refusal says, for a newcomer over the cap, what holds the slots.
func (s *slots) refusal() error {
	hint := "try again shortly; each fleet-recv --follow, fleet-ask and fleet-send --wait or --until holds a connection while it waits: " +
		"a host that needs more raises max-connections (FLEET_MAX_CONNECTIONS)"
	if s.n[holdSilent].Load() > 0 {
		hint = fmt.Sprintf("try again shortly: a connection that sends no request is closed %v after it connects (frame-timeout); ", s.timeout) +
			"a host that needs more raises max-connections (FLEET_MAX_CONNECTIONS)"
	}
	return fault.New(fault.TempFail, fault.KindTooManyConnections,
		"the gateway is serving its limit of %d connections: %s", s.max, s.holders()).WithHint("%s", hint)
}

// holders is what holds the slots now, as a refusal names it: "1000
// waiting for a first frame, 24 streams or waits".
func (s *slots) holders() string {
	var parts []string
	for h := range nHolds {
		if n := s.n[h].Load(); n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, holdNames[h]))
		}
	}
	if len(parts) == 0 {
		return "none" // a cap of 0
	}
	return strings.Join(parts, ", ")
}

// expire cuts the silent connections whose deadline has passed, and arms
// the sweep for the next one.
func (s *slots) expire() {
	now := time.Now()
	var cut []*slot
	s.mu.Lock()
	for e := s.silent.Front(); e != nil; e = s.silent.Front() {
		sl := e.Value.(*slot)
		if wait := sl.at.Add(s.timeout).Sub(now); wait > 0 {
			s.sweep = time.AfterFunc(wait, s.expire)
			break
		}
		sl.cutLocked(fault.New(fault.Data, fault.KindBadFrame,
			"no complete request frame within %v of connecting (frame-timeout)", s.timeout))
		cut = append(cut, sl)
	}
	if s.silent.Len() == 0 {
		s.sweep = nil
	}
	s.mu.Unlock()
	for _, sl := range cut {
		// counted before the kick, so whoever sees the cut sees the count
		if s.onTimeout != nil {
			s.onTimeout()
		}
		sl.kick()
	}
}

// cutLocked takes a silent slot off the silent list with its reason; the
// caller kicks it once s.mu is released. Its count stays until it leaves.
func (sl *slot) cutLocked(why error) {
	sl.s.silent.Remove(sl.el)
	sl.el = nil
	sl.cut = why
}

// spoke records the connection's first complete frame: it is a client
// now, and keeps its slot. If it was cut first, spoke returns why; the
// connection tells its client so and closes.
func (sl *slot) spoke() error {
	if sl.hold != holdSilent {
		return nil
	}
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.cut != nil {
		return sl.cut
	}
	s.silent.Remove(sl.el)
	sl.el = nil
	s.n[holdSilent].Add(-1)
	s.n[holdIdle].Add(1)
	sl.hold = holdIdle
	return nil
}

// set records what a connection that spoke does now: idle, busy or in a
// stream (holdSilent is left only by spoke, and never gone back to).
func (sl *slot) set(h hold) {
	if sl.hold == h || sl.hold == holdSilent || h == holdSilent {
		return
	}
	sl.s.n[sl.hold].Add(-1)
	sl.s.n[h].Add(1)
	sl.hold = h
}

// leave gives the slot back, once the connection is closed.
func (sl *slot) leave() {
	s := sl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.given {
		return // counted out when it was cut
	}
	s.n[sl.hold].Add(-1)
	if sl.el != nil {
		s.silent.Remove(sl.el)
		sl.el = nil
	}
	s.open--
}
