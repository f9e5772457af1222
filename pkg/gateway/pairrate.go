package gateway

// pairrate.go — pair-rate (issue 37.2): how many messages one entity may
// send one recipient a minute. Each sender→recipient pair has a token
// bucket that holds up to pair-rate tokens and refills at pair-rate a
// minute: a burst of pair-rate sends goes at once, then one every
// minute/pair-rate. A send with no token is refused on the sending side
// before anything is stored or published (exit 75, rate_limited, with the
// time until the next token); nothing is queued, in memory or anywhere.
// pair-rate 0 turns it off.
//
// Memory: one bucket per pair that sent in the last minute or so; a
// bucket that has refilled is the same as none, so once the map holds
// maxPairs the full ones are dropped, and past that (maxPairs pairs all
// sending within a minute) the oldest-touched half is, which can only
// let a pair send sooner, never later.

import (
	"sort"
	"sync"
	"time"
)

// maxPairs bounds the buckets kept before the full ones are dropped.
const maxPairs = 4096

// pairRates owns the buckets of every sender→recipient pair.
type pairRates struct {
	rate int           // tokens a minute, and the bucket's size; 0: off
	per  time.Duration // the refill period of rate tokens (a minute)

	mu      sync.Mutex
	buckets map[pairKey]*bucket
}

type pairKey struct{ from, to string } // gids

// newPairRates returns the pair-rate part for rate messages a minute (0:
// off).
func newPairRates(rate int) *pairRates {
	return &pairRates{rate: rate, per: time.Minute, buckets: map[pairKey]*bucket{}}
}

// Take spends one of the pair's tokens: ok, or how long until there is
// one (nothing spent). A nil part, or rate 0, always allows.
func (p *pairRates) Take(from, to string) (wait time.Duration, ok bool) {
	return p.take(from, to, time.Now())
}

// take is Take at now.
func (p *pairRates) take(from, to string, now time.Time) (wait time.Duration, ok bool) {
	if p == nil || p.rate <= 0 {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pairKey{from, to}
	b := p.buckets[k]
	if b == nil {
		if len(p.buckets) >= maxPairs {
			p.prune(now)
		}
		b = &bucket{tokens: float64(p.rate), at: now}
		p.buckets[k] = b
	}
	return b.take(now, p.rate, p.per)
}

// Give hands back the token a Take spent for a message that was refused
// after it all the same (urgent-rate, urgent.go): never past the
// bucket's size.
func (p *pairRates) Give(from, to string) {
	if p == nil || p.rate <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.buckets[pairKey{from, to}]; b != nil {
		b.tokens = min(b.tokens+1, float64(p.rate))
	}
}

// Rate is the pair-rate (messages a minute; 0: off).
func (p *pairRates) Rate() int {
	if p == nil {
		return 0
	}
	return p.rate
}

// prune drops the buckets that have refilled, and if that frees less
// than a quarter of maxPairs, the oldest-touched half. Call with mu held.
func (p *pairRates) prune(now time.Time) {
	for k, b := range p.buckets {
		if b.full(now, p.rate, p.per) {
			delete(p.buckets, k)
		}
	}
	if len(p.buckets) < maxPairs-maxPairs/4 {
		return
	}
	keys := make([]pairKey, 0, len(p.buckets))
	for k := range p.buckets {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return p.buckets[keys[i]].at.Before(p.buckets[keys[j]].at) })
	for _, k := range keys[:len(keys)/2] {
		delete(p.buckets, k)
	}
}

// bucket is one pair's tokens as of at. Its logic is pure: the time and
// the rate are given.
type bucket struct {
	tokens float64
	at     time.Time
}

// refill brings the bucket to now: rate tokens per period, never past
// rate. A clock that went back adds nothing.
func (b *bucket) refill(now time.Time, rate int, per time.Duration) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens += float64(rate) * float64(d) / float64(per)
		b.at = now
	}
	if b.tokens > float64(rate) {
		b.tokens = float64(rate)
	}
}

// take spends a token at now, or says how long until one is there
// (rounded up to the millisecond, never 0).
func (b *bucket) take(now time.Time, rate int, per time.Duration) (time.Duration, bool) {
	b.refill(now, rate, per)
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	wait := time.Duration((1 - b.tokens) * float64(per) / float64(rate))
	return max((wait + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond), false
}

// full reports whether the bucket has refilled by now (the same as none).
func (b *bucket) full(now time.Time, rate int, per time.Duration) bool {
	return float64(rate)-b.tokens <= float64(rate)*float64(now.Sub(b.at))/float64(per)
}
