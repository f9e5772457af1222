package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// forge writes n keys with put, a few thousand per store operation (far
// quicker than n real sends; the prune does not care how they came).
func forge(t *testing.T, s *Store, n int, put func(tx *wtx, i int) error) {
	t.Helper()
	for i := 0; i < n; {
		from, to := i, min(n, i+5000)
		err := s.update(func(tx *wtx) error {
			for j := from; j < to; j++ {
				if err := put(tx, j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("forging keys %d..%d: %v", from, to, err)
		}
		i = to
	}
}

// countKeys counts the keys of a bucket (nil: a top-level one), from inside
// an operation.
func countKeys(b *wbucket) int {
	if b == nil {
		return 0
	}
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

func numKeys(t *testing.T, s *Store, bucket []byte) int {
	t.Helper()
	n := 0
	if err := s.view(func(tx *wtx) error { n = countKeys(tx.Bucket(bucket)); return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// groups records the groups the committer hands to the syncer.
type groups struct {
	mu       sync.Mutex
	n        int // groups that changed something
	maxMuts  int
	maxBytes int
}

func (g *groups) hook(muts, bytes int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n++
	g.maxMuts, g.maxBytes = max(g.maxMuts, muts), max(g.maxBytes, bytes)
}

func (g *groups) get() (n, maxMuts, maxBytes int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n, g.maxMuts, g.maxBytes
}

// seedExpired forges n delivery records finished at done, and returns
// their keys.
func seedExpired(t *testing.T, s *Store, n int, done time.Time) []string {
	t.Helper()
	keys := make([]string, n)
	forge(t, s, n, func(tx *wtx, i int) error {
		keys[i] = envelope.NewID()
		return save(tx.Bucket(bRecords), keys[i], &Record{
			MsgID: keys[i], Kind: envelope.Send, Sender: "gid-alice", Recipient: "gid-bob",
			Seq: uint64(i + 1), State: Delivered, Attempts: 1, Accepted: done.Add(-time.Minute), Done: done,
		})
	})
	return keys
}

func TestPruneRunsInBoundedChunks(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	now := time.Now().UTC()
	cutoff := now.Add(-168 * time.Hour)
	old, young := cutoff.Add(-time.Hour), cutoff.Add(time.Hour)

	// 20,000 records past the window (19,000 delivered, 1,000 outbound),
	// with a younger or kept record after every 40th, in key order
	const expired = 20000
	var keep []string
	forge(t, s, expired, func(tx *wtx, i int) error {
		recs := tx.Bucket(bRecords)
		id := envelope.NewID()
		r := &Record{MsgID: id, Kind: envelope.Send, Sender: a.Gid, Recipient: b.Gid, Seq: uint64(i + 1),
			State: Delivered, Attempts: 1, Accepted: old.Add(-time.Minute), Done: old}
		if i%20 == 0 {
			r.Seq, r.State, r.Attempts, r.Done = 0, Accepted, 0, time.Time{} // outbound, accepted before the cutoff
		}
		if err := save(recs, id, r); err != nil {
			return err
		}
		if i%40 != 0 {
			return nil
		}
		yid := envelope.NewID()
		keep = append(keep, yid)
		y := &Record{MsgID: yid, Kind: envelope.Send, Sender: a.Gid, Recipient: b.Gid, State: Delivered, Accepted: young, Done: young}
		switch i % 120 {
		case 40: // delivered long ago but dead-lettered: kept while its dead letter is
			y.State, y.Done = Dead, old
			if err := save(tx.Bucket(bDead), yid, &DeadLetter{Record: *y, Envelope: json.RawMessage(`{}`)}); err != nil {
				return err
			}
		case 80: // accepted long ago, still queued (in an inbox)
			y.Seq, y.State, y.Accepted, y.Done = uint64(1e6+i), Accepted, old, time.Time{}
		}
		return save(recs, yid, y)
	})
	if n := numKeys(t, s, bRecords); n != expired+len(keep) {
		t.Fatalf("seeded %d records, want %d", n, expired+len(keep))
	}
	s = reopen(t, s, path) // checkpointed into bbolt, as records an hour old are

	var g groups
	var starts []time.Time // of each chunk, in the committer
	s.groupHook = g.hook
	s.chunkHook = func(*wtx, int) { starts = append(starts, time.Now()) }
	n, err := s.Prune(cutoff)
	end := time.Now()
	if err != nil || n != expired {
		t.Fatalf("Prune = %d, %v; want %d", n, err, expired)
	}

	// bounded: no group of the log holds more than one chunk's deletes,
	// and the prune took as many operations as that bound needs
	groupsN, maxMuts, maxBytes := g.get()
	if maxMuts > min(pruneChunk, expired/10) {
		t.Errorf("a group of the prune holds %d changes, want at most %d", maxMuts, min(pruneChunk, expired/10))
	}
	if want := max(expired/pruneChunk, 10); groupsN < want || len(starts) < want {
		t.Errorf("the prune ran as %d operations (%d log groups), want at least %d", len(starts), groupsN, want)
	}
	t.Logf("prune of %d records: %d operations, %d log groups, largest group %d changes / %d bytes (a single operation would have been %d changes)",
		expired, len(starts), groupsN, maxMuts, maxBytes, expired)

	left := numKeys(t, s, bRecords)
	if left != len(keep) {
		t.Errorf("%d records left, want the %d younger or kept ones", left, len(keep))
	}
	for _, id := range keep {
		record(t, s, id)
	}
	if n, err := s.Prune(cutoff); err != nil || n != 0 {
		t.Errorf("second Prune = %d, %v; want 0", n, err)
	}

	// every chunk is an ordinary operation: durable like any other
	s.groupHook, s.chunkHook = nil, nil
	s = reopen(t, s, path)
	if n := numKeys(t, s, bRecords); n != len(keep) {
		t.Errorf("after reopen: %d records, want %d", n, len(keep))
	}

	// for information only: the longest prune operation beside one Accept
	var longest time.Duration
	for i, st := range starts {
		next := end
		if i+1 < len(starts) {
			next = starts[i+1]
		}
		longest = max(longest, next.Sub(st))
	}
	var accepts []time.Duration
	for range 21 {
		t1 := time.Now()
		accept(t, s, msg(a.Gid, b.Gid, "x"))
		accepts = append(accepts, time.Since(t1))
	}
	slices.Sort(accepts)
	t.Logf("longest prune operation (one chunk, with its fdatasync): %v; one Accept (median of %d): %v; the whole prune: %v",
		longest, len(accepts), accepts[len(accepts)/2], end.Sub(starts[0]))
}

func TestPruneLetsSendersInBetweenChunks(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	now := time.Now().UTC()
	cutoff := now.Add(-168 * time.Hour)
	const expired = 20000
	seedExpired(t, s, expired, cutoff.Add(-time.Hour))

	// Hold the committer inside chunk 3; queue senders meanwhile; each
	// chunk notes how many of them are in bob's inbox as it starts.
	const hold, senders = 3, 10
	entered, gate := make(chan struct{}), make(chan struct{})
	var seen []int // per chunk, as it starts: messages in bob's inbox
	s.chunkHook = func(tx *wtx, chunk int) {
		seen = append(seen, countKeys(tx.Bucket(bInbox).Bucket([]byte(b.Gid))))
		if chunk == hold {
			close(entered)
			<-gate
		}
	}
	type result struct {
		n   int
		err error
	}
	pruned := make(chan result, 1)
	go func() {
		n, err := s.Prune(cutoff)
		pruned <- result{n, err}
	}()
	select {
	case <-entered:
	case r := <-pruned:
		t.Fatalf("Prune = %d, %v: done before its chunk %d began", r.n, r.err, hold)
	}
	results := make(chan error, senders)
	for i := range senders {
		go func() {
			_, _, err := s.Accept(msg(a.Gid, b.Gid, fmt.Sprint(i)), now)
			results <- err
		}()
	}
	waitQueued(s, senders)
	close(gate)
	for range senders {
		if err := <-results; err != nil {
			t.Errorf("Accept during the prune: %v", err)
		}
	}
	r := <-pruned
	if r.err != nil || r.n != expired {
		t.Fatalf("Prune = %d, %v; want %d", r.n, r.err, expired)
	}
	if len(seen) <= hold+2 {
		t.Fatalf("the prune ran as %d chunks: too few to tell", len(seen))
	}
	// the senders queued while chunk 3 ran; they were all in before
	// chunk 4 began: each waited behind one chunk, not the whole prune
	if seen[hold] != 0 || seen[hold+1] != senders {
		t.Errorf("messages in the inbox as chunks %d and %d began: %d, %d; want 0, %d (the senders waited behind exactly one chunk)",
			hold, hold+1, seen[hold], seen[hold+1], senders)
	}
	if got := inbox(t, s, b.Gid); len(got) != senders {
		t.Errorf("inbox holds %d messages, want %d", len(got), senders)
	}
}

func TestPruneDeadKeepsTheDedupWindow(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	now := time.Now().UTC()
	dedupCutoff := now.Add(-168 * time.Hour) // dedup-window 7 days
	deadCutoff := now.Add(-24 * time.Hour)   // dead-retention 1 day: shorter than the window

	dieAt := func(body string, at time.Time) *envelope.Envelope {
		e := msg(a.Gid, b.Gid, body)
		if err := s.DeadOutbound(e, "inbox full", at); err != nil {
			t.Fatal(err)
		}
		return e
	}
	ancient := dieAt("ancient", now.Add(-10*24*time.Hour)) // past both
	old := dieAt("old", now.Add(-3*24*time.Hour))          // past retention, inside the dedup window
	recent := dieAt("recent", now.Add(-time.Hour))         // inside both
	killed := msg(a.Gid, b.Gid, "killed")                  // dies now
	accept(t, s, killed)
	if err := s.Kill(killed.MsgID, "gave up", 5); err != nil {
		t.Fatal(err)
	}

	n, err := s.PruneDead(deadCutoff)
	if err != nil || n != 2 {
		t.Fatalf("PruneDead = %d, %v; want 2 (ancient, old)", n, err)
	}
	listed := func(s *Store) []string {
		dl, err := s.DeadLetters("")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range dl {
			ids = append(ids, d.Record.MsgID)
		}
		return ids
	}
	if got, want := listed(s), []string{recent.MsgID, killed.MsgID}; !slices.Equal(got, want) {
		t.Errorf("dead letters after PruneDead = %v, want recent, killed %v", got, want)
	}
	if c := s.DeadCounts(); c[b.Gid] != 2 {
		t.Errorf("DeadCounts = %v, want 2 for bob", c)
	}

	// the records stay for the dedup window: old is still a dup, and still
	// says it died and why; ancient's record is past the window too
	if r := record(t, s, old.MsgID); r.State != Dead || r.Reason != "inbox full" {
		t.Errorf("old's record after PruneDead = %+v, want dead, inbox full", r)
	}
	if n, err := s.Prune(dedupCutoff); err != nil || n != 1 {
		t.Errorf("Prune = %d, %v; want 1 (ancient's record)", n, err)
	}
	if _, err := s.Record(ancient.MsgID); !errors.Is(err, ErrNotFound) {
		t.Errorf("ancient's record after Prune: %v, want gone", err)
	}
	for _, e := range []*envelope.Envelope{old, recent, killed} {
		if _, dup, err := s.Accept(e, now); err != nil || !dup {
			t.Errorf("Accept(%s) again: dup=%v err=%v; want a dup (inside the dedup window)", e.Body, dup, err)
		}
	}
	if _, dup, err := s.Accept(ancient, now); err != nil || dup {
		t.Errorf("Accept(ancient) again: dup=%v err=%v; want it new (past the dedup window)", dup, err)
	}
	if n, err := s.PruneDead(deadCutoff); err != nil || n != 0 {
		t.Errorf("second PruneDead = %d, %v; want 0", n, err)
	}

	s = reopen(t, s, path)
	if got := listed(s); len(got) != 2 {
		t.Errorf("dead letters after reopen = %v, want recent and killed", got)
	}
	// once old's record is past the dedup window, Prune forgets it too
	if n, err := s.Prune(now.Add(-2 * 24 * time.Hour)); err != nil || n != 1 {
		t.Errorf("Prune past old's death = %d, %v; want 1", n, err)
	}
}

func TestPruneDeadRunsInChunksByBytes(t *testing.T) {
	s, _ := newStore(t)
	now := time.Now().UTC()
	cutoff := now.Add(-720 * time.Hour)
	body := strings.Repeat("x", 64<<10)
	const letters = 200 // 12.5 MiB of envelopes, in under pruneChunk letters
	var keep []string
	forge(t, s, letters, func(tx *wtx, i int) error {
		e := msg("gid-alice", "gid-bob", body)
		raw, err := envelope.Encode(e)
		if err != nil {
			return err
		}
		at := cutoff.Add(-time.Hour)
		if i%50 == 0 {
			at = cutoff.Add(time.Hour)
			keep = append(keep, e.MsgID)
		}
		r := Record{MsgID: e.MsgID, Kind: e.Kind, Sender: "gid-alice", Recipient: "gid-bob", State: Dead, Reason: "r", Accepted: at, Done: at}
		if err := save(tx.Bucket(bDead), e.MsgID, &DeadLetter{Record: r, Envelope: raw}); err != nil {
			return err
		}
		return save(tx.Bucket(bRecords), e.MsgID, &r)
	})
	chunks := 0
	s.chunkHook = func(*wtx, int) { chunks++ }
	n, err := s.PruneDead(cutoff)
	if err != nil || n != letters-len(keep) {
		t.Fatalf("PruneDead = %d, %v; want %d", n, err, letters-len(keep))
	}
	// each chunk deletes at most pruneChunkBytes (and one letter more)
	if want := max((letters-len(keep))*len(body)/(pruneChunkBytes+len(body)), 2); chunks < want {
		t.Errorf("PruneDead ran as %d operations, want at least %d for %d MiB", chunks, want, letters*len(body)>>20)
	}
	t.Logf("PruneDead of %d letters of %d KiB: %d operations", n, len(body)>>10, chunks)
	dl, err := s.DeadLetters("")
	if err != nil || len(dl) != len(keep) {
		t.Fatalf("dead letters left: %d, %v; want %d", len(dl), err, len(keep))
	}
	for _, d := range dl {
		if !slices.Contains(keep, d.Record.MsgID) {
			t.Errorf("dead letter %s left, not a younger one", d.Record.MsgID)
		}
	}
	if n := numKeys(t, s, bRecords); n != letters {
		t.Errorf("records after PruneDead: %d, want all %d (Prune's business)", n, letters)
	}
}

func TestPruneControlRunsInChunks(t *testing.T) {
	s, _ := newStore(t)
	const answered, running = 2500, 10
	forge(t, s, answered+running, func(tx *wtx, i int) error {
		b, err := tx.CreateBucketIfNotExists(bControl)
		if err != nil {
			return err
		}
		c := &Control{RequestID: envelope.NewID(), Kind: envelope.Spawn, Subject: "x", State: ControlDone, Started: t0, Done: t0}
		if i%(answered/running+1) == 0 {
			c.State, c.Done = ControlRunning, time.Time{}
		}
		return save(b, c.RequestID, c)
	})
	var g groups
	s.groupHook = g.hook
	n, err := s.PruneControl(t0.Add(time.Hour))
	if err != nil || n != answered {
		t.Fatalf("PruneControl = %d, %v; want %d", n, err, answered)
	}
	if groupsN, maxMuts, _ := g.get(); maxMuts > pruneChunk || groupsN < answered/pruneChunk {
		t.Errorf("PruneControl: %d log groups of up to %d changes; want at least %d of at most %d", groupsN, maxMuts, answered/pruneChunk, pruneChunk)
	}
	if left := numKeys(t, s, bControl); left != running {
		t.Errorf("%d control requests left, want the %d running", left, running)
	}
}

func TestDeadAt(t *testing.T) {
	at := t0.Add(time.Minute)
	for _, tc := range []struct {
		v    string
		want time.Time
		ok   bool
	}{
		{`{"record":{"msg_id":"m","state":"dead","accepted":"2025-06-01T12:00:00Z","done":"2025-06-01T12:01:00Z"},"envelope":{"body":"x"}}`, at, true},
		{`{"envelope":{"body":"x"},"record":{"done":"2025-06-01T12:01:00Z"}}`, at, true},
		{`{"record":{"accepted":"2025-06-01T12:01:00Z"}}`, at, true}, // no death time: when it came
		{`{"record":{}}`, time.Time{}, false},
		{`{"envelope":{}}`, time.Time{}, false},
		{`not json`, time.Time{}, false},
		{`[]`, time.Time{}, false},
	} {
		got, ok := deadAt([]byte(tc.v))
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("deadAt(%s) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}
