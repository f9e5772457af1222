package gateway

// The followers: who reads a pull entity's mail, so that the roster never
// reads idle for an entity nobody reads.
//
// A pull entity is read by fleet-recv. A follower — fleet-recv --follow
// with no --max, a worker's loop — holds its inbox for as long as it runs,
// and rides out a restart of the gateway (it dials again and follows
// again). The part remembers, durably (store.Entity.Follows), that an
// entity has a follower; a plain drain (fleet-recv without --follow)
// forgets it. A spawned entity's process (fleet-spawn: launch.Info) is
// looked at every few seconds. The entity reads detached, with why, when
//
//   - its follower ended while the gateway ran (killed, or stopped);
//   - none came back within followGrace of the gateway's start, though
//     one followed before the restart;
//   - the process its launcher started is gone (never looked at again:
//     a process group does not come back).
//
// Its mail waits, and its nudge hook fires as for any unread mail (the
// nudge loop stands down only while a fleet-recv drains). A follower that
// opens, or a plain drain, makes it idle again.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/launch"
	"github.com/fleetd/fleet/pkg/store"
)

// followGrace is how long after the gateway's start a follower has to
// come back (fleet-recv waits at most 2s between tries).
const followGrace = 10 * time.Second

// procLook is how often a spawned pull entity's process is looked at.
const procLook = 3 * time.Second

// The reasons a pull entity reads detached.
const (
	reasonFollowEnded  = "its fleet-recv --follow ended"
	reasonFollowAbsent = "no fleet-recv --follow came back after the gateway started"
)

func reasonProcGone(info launch.Info) string {
	if info.Launcher == launch.Tmux {
		return "its tmux pane " + info.Pane + " is gone (the process fleet-spawn started)"
	}
	return "its process (process group " + strconv.Itoa(info.Pid) + ", started by fleet-spawn) exited"
}

func procReason(r string) bool {
	return strings.HasPrefix(r, "its process (") || strings.HasPrefix(r, "its tmux pane ")
}

// followers is the part. One lock; the mailboxes' status is changed only
// through their own API (putStatusFrom), the Follows mark only through
// the store.
type followers struct {
	st       *store.Store
	log      *slog.Logger
	announce func(gid string) // a status changed: tell the other hosts
	alive    func(context.Context, launch.Info) bool
	grace    time.Duration
	look     time.Duration

	mu    sync.Mutex
	open  map[string]int        // gid: followers holding the inbox now (2 while one ends as the next opens)
	due   map[string]followDue  // gid: followed before the start, none back yet
	procs map[string]followProc // gid: the spawned process, still believed up
	kick  chan struct{}         // something to watch was added
	now   func() time.Time
}

type followDue struct {
	b  *mailbox
	at time.Time // detached from then on, if still absent
}

type followProc struct {
	b    *mailbox
	info launch.Info
}

func newFollowers(st *store.Store, log *slog.Logger, announce func(string)) *followers {
	return &followers{
		st: st, log: log, announce: announce, alive: launch.Alive, grace: followGrace, look: procLook,
		open: map[string]int{}, due: map[string]followDue{}, procs: map[string]followProc{},
		kick: make(chan struct{}, 1), now: time.Now,
	}
}

// Load takes up a pull entity at the gateway's start: a follower is due
// back within the grace if it had one, and its spawned process (raw: the
// launch record, nil if none) is watched.
func (f *followers) Load(b *mailbox, raw []byte) {
	ent := b.snapshot()
	if ent.Mode != "pull" {
		return
	}
	f.mu.Lock()
	if ent.Follows && ent.Status != stDetached {
		f.due[ent.Gid] = followDue{b: b, at: f.now().Add(f.grace)}
	}
	if info, ok := launched(raw); ok {
		f.procs[ent.Gid] = followProc{b: b, info: info}
	}
	f.mu.Unlock()
	f.poke()
}

// Spawned watches the process fleet-spawn started for a pull entity.
func (f *followers) Spawned(b *mailbox, info launch.Info) {
	if b.snapshot().Mode != "pull" {
		return
	}
	f.mu.Lock()
	f.procs[b.snapshot().Gid] = followProc{b: b, info: info}
	f.mu.Unlock()
	f.poke()
}

// Forget drops an entity that left.
func (f *followers) Forget(gid string) {
	f.mu.Lock()
	delete(f.open, gid)
	delete(f.due, gid)
	delete(f.procs, gid)
	f.mu.Unlock()
}

// Opened: a follower took b's inbox. It is remembered (durably, the
// first time), and the entity reads idle again if it read detached.
func (f *followers) Opened(b *mailbox) {
	ent := b.snapshot()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open[ent.Gid]++
	delete(f.due, ent.Gid)
	if err := b.putFollows(f.st, true); err != nil {
		f.log.Error("recording that a follower reads the entity", "entity", ent.Name, "err", err)
	}
	f.setLocked(b, stIdle, "")
}

// Closed: b's follower ended. stopping: the gateway's stop ended it (it
// comes back after the restart); otherwise it went away, and the entity
// reads detached.
func (f *followers) Closed(b *mailbox, stopping bool) {
	ent := b.snapshot()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open[ent.Gid] > 1 { // the next follower opened as this one ended: it holds the inbox
		f.open[ent.Gid]--
		return
	}
	delete(f.open, ent.Gid)
	if stopping {
		return
	}
	f.setLocked(b, stDetached, reasonFollowEnded)
}

// Drained: a plain fleet-recv drained b's inbox to its end. Whoever reads
// it so needs no follower: none is expected back after a restart, and a
// detached entity whose follower ended reads idle again (one whose
// process is gone stays detached).
func (f *followers) Drained(b *mailbox) {
	ent := b.snapshot()
	if ent.Mode != "pull" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.due, ent.Gid)
	if err := b.putFollows(f.st, false); err != nil && !errors.Is(err, store.ErrNotFound) {
		f.log.Error("recording that no follower reads the entity", "entity", ent.Name, "err", err)
	}
	f.put(b, stIdle, "", func(e *store.Entity) bool {
		return e.Status == stDetached && (e.StatusReason == reasonFollowEnded || e.StatusReason == reasonFollowAbsent)
	})
}

// setLocked records b's status: idle only from detached (a status the
// entity's own hooks set stays), detached over anything but a detached
// whose process is gone (for good: the more telling reason).
func (f *followers) setLocked(b *mailbox, status, reason string) {
	f.put(b, status, reason, func(e *store.Entity) bool {
		switch {
		case status == stIdle && e.Status != stDetached,
			status == stDetached && e.Status == stDetached && (e.StatusReason == reason || procReason(e.StatusReason)):
			return false
		}
		return true
	})
}

// put records b's status if when says so of the entity as stored: the
// check and the change are one store operation (mailbox.update), so a
// status the store holds and memory does not show yet (a change being
// made) is the one decided on — never one from before it.
func (f *followers) put(b *mailbox, status, reason string, when func(*store.Entity) bool) {
	now := time.Now().UTC()
	_, ent, err := b.update(f.st, func(e *store.Entity) error {
		if !when(e) {
			return errStale
		}
		e.Status, e.StatusReason, e.StatusAt = status, reason, now
		return nil
	})
	if err != nil {
		if errors.Is(err, errStale) || errors.Is(err, store.ErrNotFound) {
			return // nothing to change, or it left
		}
		f.log.Error("recording the status", "entity", b.snapshot().Name, "status", status, "err", err)
		return
	}
	b.notify()
	if status == stDetached {
		f.log.Warn("pull entity detached: its mail waits", "entity", ent.Name, "reason", reason)
	} else {
		f.log.Info("pull entity read again", "entity", ent.Name)
	}
	f.announce(ent.Gid)
}

func (f *followers) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Run looks at what is due and at the spawned processes until ctx ends.
func (f *followers) Run(ctx context.Context) {
	for {
		wait, any := f.step(ctx)
		var tick <-chan time.Time
		var t *time.Timer
		if any {
			t = time.NewTimer(wait)
			tick = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-f.kick:
		case <-tick:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// step detaches what is due or gone, and says how long until the next
// look (any: there is something left to watch).
func (f *followers) step(ctx context.Context) (wait time.Duration, any bool) {
	f.mu.Lock()
	procs := make(map[string]followProc, len(f.procs))
	for gid, p := range f.procs {
		procs[gid] = p
	}
	f.mu.Unlock()
	// looked at without the lock: a tmux call may take a while
	gone := map[string]bool{}
	for gid, p := range procs {
		if !f.alive(ctx, p.info) {
			gone[gid] = true
		}
	}
	if ctx.Err() != nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	wait = f.look
	for gid := range gone {
		p, ok := f.procs[gid]
		if !ok {
			continue // left meanwhile
		}
		delete(f.procs, gid)
		f.setLocked(p.b, stDetached, reasonProcGone(p.info))
	}
	for gid, d := range f.due {
		if f.open[gid] > 0 {
			delete(f.due, gid)
			continue
		}
		if left := d.at.Sub(now); left > 0 {
			wait = min(wait, left)
			continue
		}
		delete(f.due, gid)
		f.setLocked(d.b, stDetached, reasonFollowAbsent)
	}
	return wait, len(f.procs) > 0 || len(f.due) > 0
}

// launched reads a launch record: a process to watch, if it names one.
func launched(raw []byte) (launch.Info, bool) {
	if len(raw) == 0 {
		return launch.Info{}, false
	}
	var info launch.Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return launch.Info{}, false
	}
	switch {
	case info.Launcher == launch.Exec && info.Pid > 1, info.Launcher == launch.Tmux && info.Pane != "":
		return info, true
	}
	return launch.Info{}, false
}
