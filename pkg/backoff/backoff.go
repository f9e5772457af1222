// Package backoff computes retry delays: exponential from a base, capped,
// with full jitter on the upper half so retrying clients do not march in
// step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff.
type Policy struct {
	Base time.Duration // delay before the second attempt
	Max  time.Duration // cap
	// Jitter, if true, picks the delay uniformly in [d/2, d].
	Jitter bool
}

// Delay returns the wait after the n-th failed attempt (n >= 1).
func (p Policy) Delay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := p.Base
	for i := 1; i < n && d < p.Max; i++ {
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	if p.Jitter && d > 1 {
		half := d / 2
		d = half + time.Duration(rand.Int64N(int64(d-half)+1))
	}
	return d
}

// Sleep waits d, or less if ctx ends first.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Wait waits d, or less if one of the stop channels closes first (a nil
// one never does). It says whether the whole d passed.
func Wait(d time.Duration, stop1, stop2 <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop1:
		return false
	case <-stop2:
		return false
	case <-t.C:
		return true
	}
}

// Poll asks ready every interval, the first time after one interval,
// until it says true (true), deadline passes (zero: never), or one of the
// stop channels closes (false; a nil one never does). The deadline is
// looked at before ready: past it, the answer is false.
func Poll(every time.Duration, deadline time.Time, ready func() bool, stop1, stop2 <-chan struct{}) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop1:
			return false
		case <-stop2:
			return false
		case <-t.C:
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return false
		}
		if ready() {
			return true
		}
	}
}
