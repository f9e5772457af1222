package gateway

import (
	"testing"
	"time"
)

// The bucket alone: a burst of rate, then one every per/rate; the wait
// it names is until the next token, and a refusal spends nothing.
func TestBucketTakes(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	b := &bucket{tokens: 5, at: t0}
	for i := range 5 {
		if _, ok := b.take(t0, 5, time.Minute); !ok {
			t.Fatalf("send %d of the burst refused", i+1)
		}
	}
	wait, ok := b.take(t0, 5, time.Minute)
	if ok || !about(wait, 12*time.Second) {
		t.Fatalf("the 6th: ok %v, wait %v; want refused, 12s", ok, wait)
	}
	// refused again later: the wait shrinks, nothing was spent
	if wait, ok := b.take(t0.Add(10*time.Second), 5, time.Minute); ok || !about(wait, 2*time.Second) {
		t.Fatalf("10s later: ok %v, wait %v; want refused, 2s", ok, wait)
	}
	// one token a 12 s
	if _, ok := b.take(t0.Add(12*time.Second), 5, time.Minute); !ok {
		t.Fatal("refused 12s after the burst")
	}
	if _, ok := b.take(t0.Add(12*time.Second), 5, time.Minute); ok {
		t.Fatal("two tokens 12s after the burst")
	}
	// never more than rate, however long it was idle
	t1 := t0.Add(time.Hour)
	for i := range 5 {
		if _, ok := b.take(t1, 5, time.Minute); !ok {
			t.Fatalf("after an hour, send %d refused", i+1)
		}
	}
	if _, ok := b.take(t1, 5, time.Minute); ok {
		t.Fatal("after an hour, more than a burst of 5")
	}
	// a clock that goes back adds nothing
	if _, ok := b.take(t1.Add(-time.Minute), 5, time.Minute); ok {
		t.Fatal("a clock gone back refilled the bucket")
	}
}

func TestBucketFull(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	b := &bucket{tokens: 3, at: t0}
	if b.full(t0, 6, time.Minute) {
		t.Error("half empty read full")
	}
	if b.full(t0.Add(29*time.Second), 6, time.Minute) {
		t.Error("29s later (2.9 of 3 tokens back) read full")
	}
	if !b.full(t0.Add(30*time.Second), 6, time.Minute) {
		t.Error("30s later (3 tokens back) not full")
	}
}

// The part: one bucket per sender→recipient pair, off at rate 0, and a
// bounded map.
func TestPairRatesPerPair(t *testing.T) {
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	p := newPairRates(2)
	for range 2 {
		if _, ok := p.take("a", "b", now); !ok {
			t.Fatal("a→b refused within its rate")
		}
	}
	if wait, ok := p.take("a", "b", now); ok || !about(wait, 30*time.Second) {
		t.Fatalf("a→b over its rate: ok %v, wait %v; want refused, 30s", ok, wait)
	}
	for _, k := range []pairKey{{"a", "c"}, {"b", "a"}, {"c", "b"}} {
		if _, ok := p.take(k.from, k.to, now); !ok {
			t.Errorf("%s→%s held up by a→b", k.from, k.to)
		}
	}

	off := newPairRates(0)
	for range 1000 {
		if _, ok := off.Take("a", "b"); !ok {
			t.Fatal("pair-rate 0 refused a send")
		}
	}
	if len(off.buckets) != 0 {
		t.Errorf("pair-rate 0 kept %d buckets", len(off.buckets))
	}
	var none *pairRates
	if _, ok := none.Take("a", "b"); !ok {
		t.Error("no part refused a send")
	}

	// past maxPairs the full buckets go (the same as none), and a pair
	// that used its burst keeps its bucket while it is not full
	t0 := now
	p = newPairRates(2)
	p.take("x", "y", now)
	p.take("x", "y", now)
	for i := range maxPairs - 1 {
		p.take("s", time.Duration(i).String(), now)
	}
	if len(p.buckets) != maxPairs {
		t.Fatalf("%d buckets, want %d", len(p.buckets), maxPairs)
	}
	now = t0.Add(30 * time.Second) // the s pairs are full again, x→y has one token of two
	p.take("new", "pair", now)
	if len(p.buckets) != 2 {
		t.Fatalf("after pruning %d buckets, want x→y and the new pair", len(p.buckets))
	}
	if _, ok := p.take("x", "y", now); !ok {
		t.Error("x→y refused with a token back")
	}
	if _, ok := p.take("x", "y", now); ok {
		t.Error("x→y got a fresh bucket from the pruning")
	}
}

// about: d is want, rounded up to the millisecond (float arithmetic
// may make it a millisecond more).
func about(d, want time.Duration) bool { return d >= want && d <= want+time.Millisecond }

// Give hands back a token Take spent, never past the bucket's size.
func TestPairRateGiveBack(t *testing.T) {
	p := newPairRates(2)
	now := time.Now()
	for range 2 {
		if _, ok := p.take("a", "b", now); !ok {
			t.Fatal("a token of the burst refused")
		}
	}
	if _, ok := p.take("a", "b", now); ok {
		t.Fatal("a third token within the minute")
	}
	p.Give("a", "b")
	if _, ok := p.take("a", "b", now); !ok {
		t.Fatal("the token given back is not there")
	}
	p.Give("a", "b")
	p.Give("a", "b")
	p.Give("a", "b")
	for range 2 {
		if _, ok := p.take("a", "b", now); !ok {
			t.Fatal("a token given back is not there")
		}
	}
	if _, ok := p.take("a", "b", now); ok {
		t.Fatal("Give filled the bucket past its size")
	}
	p.Give("x", "y") // no bucket: nothing
	var none *pairRates
	none.Give("a", "b")
}
