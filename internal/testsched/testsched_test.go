package testsched

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// Many takers at once: never more than the places, the lane's cap, or a
// sharer beside one that has the group alone; the longest asked first go
// first; everyone gets a turn.
func TestAcquireKeepsTheLimits(t *testing.T) {
	mu.Lock()
	places, gather, open = 3, time.Hour, false // the test opens the gate itself
	mu.Unlock()

	var (
		smu                   sync.Mutex
		running, inLane       int
		sharing, aloneHolders int
		order                 []int
		bad                   []string
	)
	needs := []Need{
		{Lane: "agent", LaneCap: 2, Long: time.Second},
		{Lane: "agent", LaneCap: 2, Long: 3 * time.Second},
		{Lane: "agent", LaneCap: 2, Long: 2 * time.Second},
		{Group: "node"},
		{Group: "node", Alone: true},
		{Group: "node"},
		{},
		{Lane: "agent", LaneCap: 2, Group: "node"},
		{},
	}
	var wg sync.WaitGroup
	for i, n := range needs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release := Acquire(n)
			smu.Lock()
			order = append(order, i)
			running++
			if n.Lane != "" {
				inLane++
			}
			if n.Group != "" && n.Alone {
				aloneHolders++
			} else if n.Group != "" {
				sharing++
			}
			if running > 3 || inLane > 2 || aloneHolders > 1 || (aloneHolders > 0 && sharing > 0) {
				bad = append(bad, "over a limit")
			}
			smu.Unlock()
			time.Sleep(20 * time.Millisecond) // holding its turn
			smu.Lock()
			running--
			if n.Lane != "" {
				inLane--
			}
			if n.Group != "" && n.Alone {
				aloneHolders--
			} else if n.Group != "" {
				sharing--
			}
			smu.Unlock()
			release()
		}()
	}
	for { // every one asked: the gather is over
		mu.Lock()
		n := len(waiting)
		if n == len(needs) {
			open = true
			cond.Broadcast()
		}
		mu.Unlock()
		if n == len(needs) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	if len(order) != len(needs) {
		t.Fatalf("%d of %d had their turn", len(order), len(needs))
	}
	// the 3 s and 2 s agents went first
	if order[0] != 1 && order[1] != 1 || order[0] != 2 && order[1] != 2 {
		t.Errorf("the longest did not go first: %v", order)
	}
}

// The line LogWait writes is the line Waited reads.
func TestWaitedReadsLogWait(t *testing.T) {
	var l logLine
	LogWait(&l, 12300*time.Millisecond)
	if got, ok := Waited("    x_test.go:9: " + string(l) + "\n"); !ok || got != 12300*time.Millisecond {
		t.Errorf("Waited(%q) = %v, %v", l, got, ok)
	}
	if _, ok := Waited("--- PASS: TestX (1.00s)"); ok {
		t.Error("Waited read a line LogWait did not write")
	}
}

type logLine string

func (l *logLine) Log(args ...any) { *l = logLine(fmt.Sprint(args...)) }
