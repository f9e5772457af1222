package gateway

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/store"
)

// mailbox is the live side of one local entity: its registry entry, a
// change signal, the pull lease and the delivery worker.
type mailbox struct {
	writing  sync.Mutex // one change of the entity at a time (update): store, then memory
	mu       sync.Mutex
	ent      store.Entity
	changed  signal               // new mail, a status change, a drained inbox
	draining bool                 // a fleet-recv holds the inbox
	drains   uint64               // fleet-recv streams that ended: the nudges start over
	live     []*envelope.Envelope // asks: in memory only, never stored
	busyHook time.Time            // the agent's last busy hook (a paste's proof: agent.go)
	stop     context.CancelFunc
	done     chan struct{}
}

func (b *mailbox) snapshot() store.Entity {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ent
}

// update changes the entity in the store and in memory together: fn
// changes the stored entity inside the store's transaction (so two
// changes at once are both kept, the second made on the first, never one
// computed from the state before the other), and what was stored becomes
// the mailbox's. Changes of one entity are made one at a time (writing),
// so memory moves in the store's order; a reader (snapshot) never waits
// for the store. It returns the entity before and after.
func (b *mailbox) update(st *store.Store, fn func(*store.Entity) error) (before store.Entity, after *store.Entity, err error) {
	b.writing.Lock()
	defer b.writing.Unlock()
	after, err = st.UpdateEntity(b.snapshot().Gid, func(e *store.Entity) error {
		before = *e
		before.Groups = slices.Clone(e.Groups)
		return fn(e)
	})
	if err != nil {
		return before, nil, err
	}
	b.mu.Lock()
	b.ent = *after
	b.ent.Groups = slices.Clone(after.Groups)
	b.mu.Unlock()
	return before, after, nil
}

// putStatus records the entity's status and why, durably, and wakes
// everyone waiting on the mailbox. hook: the agent's own hook said so — its
// time is kept, and program, if not empty, becomes the entity's program
// (learnt at the first hook of an agent started from a shell).
func (b *mailbox) putStatus(st *store.Store, status, reason string, hook bool, program string) (*store.Entity, error) {
	return b.putStatusFrom(st, nil, status, reason, hook, program)
}

// errStale: the status changed since it was read.
var errStale = errors.New("the status changed meanwhile")

// statusMoved says whether the status in now is not the one read in
// from: changed, or said again by a hook since.
func statusMoved(from, now store.Entity) bool {
	return now.Status != from.Status || now.StatusReason != from.StatusReason ||
		!now.StatusAt.Equal(from.StatusAt) || !now.HookAt.Equal(from.HookAt)
}

// putStatusFrom is putStatus only if the entity's status is still what
// from says it was (nil: whatever it is): the safety net and the paste
// decide from a snapshot, and a hook that came in between wins.
func (b *mailbox) putStatusFrom(st *store.Store, from *store.Entity, status, reason string, hook bool, program string) (*store.Entity, error) {
	now := time.Now().UTC()
	_, e, err := b.update(st, func(e *store.Entity) error {
		if from != nil && statusMoved(*from, *e) {
			return errStale
		}
		if e.Status != status || e.StatusReason != reason {
			e.Status, e.StatusReason, e.StatusAt = status, reason, now
		}
		if hook {
			e.HookAt = now
		}
		if program != "" && e.Program == "" {
			e.Program = program
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if hook && status == stBusy {
		b.mu.Lock()
		b.busyHook = now
		b.mu.Unlock()
	}
	b.notify()
	return e, nil
}

// putFollows records, durably, whether a follower reads the entity
// (store.Entity.Follows; follow.go), when that changes.
func (b *mailbox) putFollows(st *store.Store, on bool) error {
	e := b.snapshot()
	if e.Follows == on {
		return nil
	}
	_, _, err := b.update(st, func(x *store.Entity) error {
		x.Follows = on
		return nil
	})
	return err
}

// busySince says whether the agent's busy hook was heard after t.
func (b *mailbox) busySince(t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busyHook.After(t)
}

// confirmed waits up to within for the agent's busy hook after pasted: the
// proof that it took a paste.
func (b *mailbox) confirmed(ctx context.Context, pasted time.Time, within time.Duration) bool {
	t := time.NewTimer(within)
	defer t.Stop()
	for {
		changed := b.watch()
		if b.busySince(pasted) {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return b.busySince(pasted)
		case <-ctx.Done():
			return b.busySince(pasted)
		}
	}
}

// handing says whether a fleet-recv holds the inbox: a batch it was
// handed may wait for its acknowledgement (inboxcap.go expires nothing
// under it).
func (b *mailbox) handing() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.draining
}

// handOver bounds how long a fleet-recv waits for the inbox's drain lease
// held by another: a client that was killed or closed its connection
// gives it back as soon as the gateway reads the end of its connection
// (milliseconds), and the next one, started at once, must not be told
// "busy" for that. A lease still held after it is a real second reader.
const handOver = time.Second

// takeDrain takes the inbox's drain lease, waiting up to within for the
// holder to give it back; false if it was not given back in time.
func (b *mailbox) takeDrain(ctx context.Context, within time.Duration) bool {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		w := b.watch() // before the check: a release after it wakes us
		b.mu.Lock()
		if !b.draining {
			b.draining = true
			b.mu.Unlock()
			return true
		}
		b.mu.Unlock()
		select {
		case <-w:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// watch returns a channel closed at the next change.
func (b *mailbox) watch() <-chan struct{} { return b.changed.wait() }

// notify wakes everyone waiting on the mailbox: new mail, a status change,
// a drained inbox.
func (b *mailbox) notify() { b.changed.notify() }
