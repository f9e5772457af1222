package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/launch"
	"github.com/fleetd/fleet/pkg/store"
)

// followRig runs the followers part alone, on the real store in a temp
// folder, with a fake process table (up) and a short grace and look.
type followRig struct {
	t   *testing.T
	st  *store.Store
	f   *followers
	mu  sync.Mutex
	up  map[int]bool // pid: alive
	ann map[string]int
}

func newFollowRig(t *testing.T) *followRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &followRig{t: t, st: st, up: map[int]bool{}, ann: map[string]int{}}
	r.f = newFollowers(st, slog.New(slog.NewTextHandler(followLogWriter{t}, nil)), func(gid string) {
		r.mu.Lock()
		r.ann[gid]++
		r.mu.Unlock()
	})
	r.f.grace, r.f.look = 150*time.Millisecond, 20*time.Millisecond
	r.f.alive = func(_ context.Context, info launch.Info) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.up[info.Pid]
	}
	return r
}

type followLogWriter struct{ t *testing.T }

func (w followLogWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// run starts the part's loop until the test ends.
func (r *followRig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.f.Run(ctx) }()
	r.t.Cleanup(func() { cancel(); <-done })
}

// entity makes a pull entity in the store, follows as given.
func (r *followRig) entity(name string, follows bool) *mailbox {
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: name, Host: "h1", Mode: "pull", Follows: follows,
		Status: stIdle, StatusAt: time.Now().UTC(), Created: time.Now().UTC()}
	if err := r.st.CreateEntity(e); err != nil {
		r.t.Fatal(err)
	}
	return &mailbox{ent: *e}
}

// stored is the entity as the store has it (what a restart finds).
func (r *followRig) stored(b *mailbox) store.Entity {
	es, err := r.st.Entities()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range es {
		if e.Gid == b.snapshot().Gid {
			return *e
		}
	}
	r.t.Fatalf("%s not stored", b.snapshot().Name)
	return store.Entity{}
}

func (r *followRig) want(b *mailbox, status, reason string) {
	r.t.Helper()
	wakeEventually(r.t, b.snapshot().Name+" reads "+status, func() error {
		e := b.snapshot()
		if e.Status != status || e.StatusReason != reason {
			return fmt.Errorf("reads %s (%s), want %s (%s)", e.Status, e.StatusReason, status, reason)
		}
		if s := r.stored(b); s.Status != status || s.StatusReason != reason {
			return fmt.Errorf("stored as %s (%s)", s.Status, s.StatusReason)
		}
		return nil
	})
}

// A follower that ends while the gateway runs leaves its entity
// detached; one that opens makes it idle; the gateway's own stop changes
// nothing. The mark that a follower reads it is durable, and a plain
// drain clears it (and the detached of an ended follower).
func TestFollowersFollowerEnds(t *testing.T) {
	r := newFollowRig(t)
	b := r.entity("w", false)
	r.f.Opened(b)
	if !r.stored(b).Follows || !b.snapshot().Follows {
		t.Fatal("an opened follower is not remembered")
	}
	r.want(b, stIdle, "")
	r.f.Closed(b, false)
	r.want(b, stDetached, reasonFollowEnded)
	r.mu.Lock()
	said := r.ann[b.snapshot().Gid]
	r.mu.Unlock()
	if said == 0 {
		t.Error("the change was not announced")
	}
	r.f.Opened(b)
	r.want(b, stIdle, "")
	r.f.Closed(b, true) // the gateway stops
	r.want(b, stIdle, "")
	r.f.Closed(b, false)
	r.want(b, stDetached, reasonFollowEnded)
	r.f.Drained(b)
	r.want(b, stIdle, "")
	if r.stored(b).Follows || b.snapshot().Follows {
		t.Fatal("a plain drain left the follower mark")
	}
	// a hook's own status is never overwritten by idle
	if _, err := b.putStatus(r.st, stBusy, "", true, ""); err != nil {
		t.Fatal(err)
	}
	r.f.Opened(b)
	r.want(b, stBusy, "")
}

// After a start, an entity that had a follower reads detached unless one
// comes back within the grace; one that comes back in time stays idle.
func TestFollowersDueAfterStart(t *testing.T) {
	r := newFollowRig(t)
	away, back, plain := r.entity("away", true), r.entity("back", true), r.entity("plain", false)
	for _, b := range []*mailbox{away, back, plain} {
		r.f.Load(b, nil)
	}
	r.run()
	r.f.Opened(back)
	r.want(away, stDetached, reasonFollowAbsent)
	r.want(back, stIdle, "")
	r.want(plain, stIdle, "") // never followed: nobody is expected
	// and the one that came back ends after the grace: detached at once
	time.Sleep(2 * r.f.grace)
	r.want(back, stIdle, "")
	r.f.Closed(back, false)
	r.want(back, stDetached, reasonFollowEnded)
}

// A spawned pull entity reads detached once its process is gone, whether
// the process was started by this run of the gateway or recorded before
// its start; a follower that opens after makes it idle.
func TestFollowersProcessGone(t *testing.T) {
	r := newFollowRig(t)
	spawned, loaded := r.entity("spawned", false), r.entity("loaded", false)
	r.mu.Lock()
	r.up[101], r.up[102] = true, true
	r.mu.Unlock()
	r.run()
	r.f.Spawned(spawned, launch.Info{Launcher: launch.Exec, Pid: 101})
	r.f.Load(loaded, []byte(`{"launcher":"exec","pid":102,"started":7}`))
	time.Sleep(5 * r.f.look)
	r.want(spawned, stIdle, "")
	r.want(loaded, stIdle, "")
	r.mu.Lock()
	r.up[101], r.up[102] = false, false
	r.mu.Unlock()
	r.want(spawned, stDetached, "its process (process group 101, started by fleet-spawn) exited")
	r.want(loaded, stDetached, "its process (process group 102, started by fleet-spawn) exited")
	r.f.Opened(spawned)
	r.want(spawned, stIdle, "")
	// an entity that left is not looked at any more
	r.mu.Lock()
	r.up[103] = true
	r.mu.Unlock()
	gone := r.entity("gone", false)
	r.f.Spawned(gone, launch.Info{Launcher: launch.Exec, Pid: 103})
	r.f.Forget(gone.snapshot().Gid)
	r.f.mu.Lock()
	n := len(r.f.procs)
	r.f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d processes watched after the entity left", n)
	}
}

// Only pull entities are the part's.
func TestFollowersOnlyPull(t *testing.T) {
	r := newFollowRig(t)
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: "inj", Host: "h1", Mode: "inject", Exec: "cat", Follows: true,
		Status: stIdle, StatusAt: time.Now().UTC(), Created: time.Now().UTC()}
	if err := r.st.CreateEntity(e); err != nil {
		t.Fatal(err)
	}
	b := &mailbox{ent: *e}
	r.f.Load(b, []byte(`{"launcher":"exec","pid":104}`))
	r.f.Spawned(b, launch.Info{Launcher: launch.Exec, Pid: 104})
	r.f.mu.Lock()
	n := len(r.f.procs) + len(r.f.due)
	r.f.mu.Unlock()
	if n != 0 {
		t.Fatal("an inject entity is watched")
	}
}

// A follower that ends after the process is found gone leaves the more
// telling reason in place.
func TestFollowersProcessReasonStays(t *testing.T) {
	r := newFollowRig(t)
	b := r.entity("w", false)
	r.run()
	r.f.Opened(b)
	r.f.Spawned(b, launch.Info{Launcher: launch.Exec, Pid: 105}) // not up
	reason := "its process (process group 105, started by fleet-spawn) exited"
	r.want(b, stDetached, reason)
	r.f.Closed(b, false)
	r.want(b, stDetached, reason)
}
