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
