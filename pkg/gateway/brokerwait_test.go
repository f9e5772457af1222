package gateway

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// upAfter reads connected from the n-th look on.
type upAfter struct{ n, looks atomic.Int32 }

func (u *upAfter) Connected() bool { return u.looks.Add(1) >= u.n.Load() }

func newWait(b brokerState) (*brokerWait, chan struct{}) {
	stop := make(chan struct{})
	return &brokerWait{broker: b, ctx: context.Background(), stop: stop, poll: time.Millisecond}, stop
}

var (
	errDown    = fault.New(fault.Unavailable, fault.KindBrokerDown, "broker unreachable")
	errUnknown = fault.New(fault.OutcomeUnknown, fault.KindOutcomeUnknown, "the broker did not confirm it")
	errFull    = fault.New(fault.TempFail, fault.KindInboxFull, "inbox full")
)

func TestBrokerWaitSendsOnceBack(t *testing.T) {
	b := &upAfter{}
	b.n.Store(5)
	w, _ := newWait(b)
	var agains []bool
	err := w.Do(time.Minute, func(again bool) error {
		agains = append(agains, again)
		if !b.Connected() {
			return errDown
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Do: %v, want nil once the broker is back", err)
	}
	if len(agains) < 2 || agains[0] || !agains[len(agains)-1] {
		t.Fatalf("attempts %v: want a first one (again=false), then retries (again=true)", agains)
	}
}

func TestBrokerWaitNoBoundFailsAtOnce(t *testing.T) {
	w, _ := newWait(&upAfter{})
	n := 0
	err := w.Do(0, func(bool) error { n++; return errDown })
	if err != errDown || n != 1 {
		t.Fatalf("Do(0): %v after %d attempts, want the first error after one", err, n)
	}
}

func TestBrokerWaitOtherErrorsAreNotRetried(t *testing.T) {
	w, _ := newWait(&upAfter{})
	n := 0
	err := w.Do(time.Minute, func(bool) error { n++; return errFull })
	if fault.KindOf(err) != fault.KindInboxFull || n != 1 {
		t.Fatalf("Do: %v after %d attempts, want inbox_full after one", err, n)
	}
}

func TestBrokerWaitRunsOut(t *testing.T) {
	b := &upAfter{}
	b.n.Store(1 << 30) // never back
	w, _ := newWait(b)
	err := w.Do(30*time.Millisecond, func(bool) error { return errDown })
	if fault.CodeOf(err) != fault.Unavailable || !strings.Contains(err.Error(), "for the broker)") {
		t.Fatalf("Do: %v, want 69 saying how long it waited", err)
	}
	if errDown.Msg != "broker unreachable" {
		t.Fatalf("Do changed the attempt's own error: %q", errDown.Msg)
	}
}

// An attempt that may have reached the broker makes the outcome unknown
// (74), though the later ones were plainly not sent.
func TestBrokerWaitUnknownWins(t *testing.T) {
	w, _ := newWait(&upAfter{}) // reads connected: every step retries
	n := 0
	err := w.Do(30*time.Millisecond, func(bool) error {
		n++
		if n == 2 {
			return errUnknown
		}
		return errDown
	})
	if fault.CodeOf(err) != fault.OutcomeUnknown || n < 3 {
		t.Fatalf("Do: %v after %d attempts, want 74 after at least 3", err, n)
	}
}

func TestBrokerWaitEndsAtShutdown(t *testing.T) {
	b := &upAfter{}
	b.n.Store(1 << 30)
	w, stop := newWait(b)
	close(stop)
	err := w.Do(time.Hour, func(bool) error { return errDown }) // would hang
	if fault.KindOf(err) != fault.KindBrokerDown {
		t.Fatalf("Do at shutdown: %v, want broker_down", err)
	}
}
