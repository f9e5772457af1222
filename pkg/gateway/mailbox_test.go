package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/store"
)

// mailbox.update changes an entity in the store and in memory together:
// changes made at once are all kept, and memory ends as the store does.
func TestMailboxUpdateKeepsConcurrentChanges(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice", "ops")
	b := r.in.reg.Get(alice.Gid)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gr := fmt.Sprintf("g%02d", i)
			if _, _, err := b.update(r.st, func(e *store.Entity) error {
				e.Groups = append(e.Groups, gr)
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ents, err := r.st.Entities()
	if err != nil || len(ents) != 1 {
		t.Fatal(ents, err)
	}
	stored := slices.Sorted(slices.Values(ents[0].Groups))
	if len(stored) != n+1 {
		t.Fatalf("stored groups %v: %d of %d changes lost", stored, n+1-len(stored), n)
	}
	if mem := slices.Sorted(slices.Values(b.snapshot().Groups)); !slices.Equal(mem, stored) {
		t.Fatalf("in memory %v, stored %v", mem, stored)
	}
	// a change that fails changes neither
	before := b.snapshot()
	if _, _, err := b.update(r.st, func(e *store.Entity) error {
		e.Groups = nil
		return errStale
	}); err != errStale {
		t.Fatalf("err %v, want the change's own", err)
	}
	if !slices.Equal(b.snapshot().Groups, before.Groups) {
		t.Fatal("a failed change reached memory")
	}
}

// takeDrain waits for a lease given back, and refuses one still held.
func TestMailboxTakeDrain(t *testing.T) {
	r := newIntakeRig(t)
	b := r.in.reg.Get(r.entity("alice").Gid)
	ctx := context.Background()
	if !b.takeDrain(ctx, time.Millisecond) {
		t.Fatal("a free inbox: lease not taken")
	}
	// still held: a second reader is refused
	if b.takeDrain(ctx, 20*time.Millisecond) {
		t.Fatal("a held lease was taken twice")
	}
	// given back while the next one waits: it gets it
	got := make(chan bool)
	go func() { got <- b.takeDrain(ctx, time.Minute) }()
	b.mu.Lock()
	b.draining = false
	b.mu.Unlock()
	b.notify()
	if !<-got {
		t.Fatal("a lease given back was not handed over")
	}
	// a gateway stopping ends the wait
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if b.takeDrain(cctx, time.Minute) {
		t.Fatal("a stopping gateway handed a held lease")
	}
}
