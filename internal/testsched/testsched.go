// Package testsched runs a test package's parallel tests itself, so that
// a test waiting for its turn holds no place. Go's own limit (-parallel
// N) counts a test from the moment it is let go: a test that then waits
// for a lock (a broker test while another has the node alone, a third
// agent CLI while two run) keeps one of the N places idle, and the tests
// that could use it wait behind it. Here a test waits for everything it
// needs at once — a place (still at most N at a time), a place in its
// lane, a resource shared or alone — and the longest start first. Only
// tests import it.
//
// A package that uses it calls Main from its TestMain before m.Run, and
// every parallel test of the package goes through Take (or Acquire, for
// a test that is already parallel, as testscript's scripts are): Main
// lifts Go's limit, so a parallel test that bypassed Take would run
// beside all the others.
package testsched

import (
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Need is what a test waits for besides a place.
type Need struct {
	// Lane, when set, is a lane of at most LaneCap tests at a time (the
	// agent CLIs: one at a time).
	Lane    string
	LaneCap int
	// Group, when set, is a resource the test shares with the other
	// tests of its group (the broker node), or has alone (Alone).
	Group string
	Alone bool
	// Long is about how long the test takes when it has its place: the
	// longer start first (ties in the order they asked). Only the order
	// depends on it.
	Long time.Duration
}

type waiter struct {
	need Need
	seq  int
}

var (
	mu      sync.Mutex
	cond    = sync.NewCond(&mu)
	places  int // Main's -parallel; 0: Go's limit applies
	used    int // places taken
	lanes   = map[string]int{}
	groups  = map[string]int{} // holders; -1: held alone
	waiting []*waiter
	seq     int
	open    bool // the first gather is over
)

// gather is how long the first test waits for the others to ask, so the
// longest, not the first to ask, start first: when the sequential tests
// are over, Go lets every paused test go within a few milliseconds.
var gather = 300 * time.Millisecond

// Main takes -parallel N as this package's number of places and lifts
// Go's own limit. Call it from TestMain before m.Run.
func Main() {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	n, err := strconv.Atoi(f.Value.String())
	if err != nil || n < 1 {
		return
	}
	mu.Lock()
	places = n
	mu.Unlock()
	f.Value.Set(strconv.Itoa(1 << 16))
}

// Take makes t a parallel test (t.Parallel) and waits until it may run:
// a place, and what need says. All of it is given back when t ends.
//
// Go counts the wait in the test's elapsed time (it leaves out only its
// own); Take logs it ("testsched: waited 12.3s for its turn", Waited
// reads it back) so a report of the slowest tests can leave it out too.
func Take(t *testing.T, need Need) {
	t.Helper()
	t.Parallel()
	start := time.Now()
	t.Cleanup(Acquire(need))
	LogWait(t, time.Since(start))
}

// waitLine is the line Take and LogWait log; Waited reads it.
const waitLine = "testsched: waited %.1fs for its turn"

// LogWait logs how long a test waited for its turn, from 0.1s.
func LogWait(t interface{ Log(...any) }, waited time.Duration) {
	if waited >= 100*time.Millisecond {
		t.Log(fmt.Sprintf(waitLine, waited.Seconds()))
	}
}

// Waited is how long a test waited for its turn, from a line of its
// output (go test -json); ok is false for any other line.
func Waited(line string) (waited time.Duration, ok bool) {
	_, rest, ok := strings.Cut(line, "testsched: waited ")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "s for its turn")
	if !ok {
		return 0, false
	}
	secs, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// Acquire waits until a test that is already parallel may run, and
// returns the function that gives back what it took.
func Acquire(need Need) (release func()) {
	mu.Lock()
	defer mu.Unlock()
	if !open && len(waiting) == 0 && used == 0 {
		time.AfterFunc(gather, func() {
			mu.Lock()
			open = true
			cond.Broadcast()
			mu.Unlock()
		})
	}
	seq++
	w := &waiter{need: need, seq: seq}
	waiting = append(waiting, w)
	for !open || next() != w {
		cond.Wait()
	}
	for i, x := range waiting {
		if x == w {
			waiting = append(waiting[:i], waiting[i+1:]...)
			break
		}
	}
	used++
	if need.Lane != "" {
		lanes[need.Lane]++
	}
	if need.Group != "" {
		if need.Alone {
			groups[need.Group] = -1
		} else {
			groups[need.Group]++
		}
	}
	cond.Broadcast() // the next one may go too
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			used--
			if need.Lane != "" {
				lanes[need.Lane]--
			}
			if need.Group != "" {
				if need.Alone {
					groups[need.Group] = 0
				} else {
					groups[need.Group]--
				}
			}
			cond.Broadcast()
		})
	}
}

// next is the waiter to go now, nil if none may: the longest first, then
// the first to ask, skipping one that must wait for its lane or group.
// A test waiting to have its group alone goes before any that would
// share it and asked later (else sharers could hold it forever).
func next() *waiter {
	if places > 0 && used >= places {
		return nil
	}
	order := append([]*waiter(nil), waiting...)
	sort.Slice(order, func(i, j int) bool {
		if order[i].need.Long != order[j].need.Long {
			return order[i].need.Long > order[j].need.Long
		}
		return order[i].seq < order[j].seq
	})
	wantAlone := map[string]bool{}
	for _, w := range order {
		n := w.need
		if n.Lane != "" && n.LaneCap > 0 && lanes[n.Lane] >= n.LaneCap {
			continue
		}
		if n.Group != "" {
			held := groups[n.Group]
			if n.Alone && held != 0 {
				wantAlone[n.Group] = true
				continue
			}
			if !n.Alone && (held < 0 || wantAlone[n.Group]) {
				continue
			}
		}
		return w
	}
	return nil
}
