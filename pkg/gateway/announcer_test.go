package gateway

import (
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The announcer alone (announcer.go): its rows read from a real store in
// a temp folder, its messages caught where the broker would take them.

type announcerRig struct {
	t    *testing.T
	st   *store.Store
	a    *announcer
	mu   sync.Mutex
	sent []presenceBody
	kind []string
	gate chan struct{} // non-nil: each publish waits for a value
	in   chan struct{} // a publish began
	seen chan struct{} // a publish was made
	up   chan bool
	tick chan struct{}
}

func newAnnouncerRig(t *testing.T) *announcerRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &announcerRig{t: t, st: st, seen: make(chan struct{}, 1000), in: make(chan struct{}, 1000), up: make(chan bool), tick: make(chan struct{})}
	row := func(e *store.Entity) api.EntityRow {
		return api.EntityRow{Name: e.Name, Host: e.Host, Gid: e.Gid, Mode: e.Mode, Groups: append([]string{}, e.Groups...), Status: "idle"}
	}
	r.a = newAnnouncer("h1", time.Hour, time.Minute, slog.New(slog.NewTextHandler(io.Discard, nil)), announceHooks{
		row: func(gid string) (api.EntityRow, bool) {
			ents, _ := st.Entities()
			for _, e := range ents {
				if e.Gid == gid {
					return row(e), true
				}
			}
			return api.EntityRow{}, false
		},
		rows: func() ([]api.EntityRow, error) {
			ents, err := st.Entities()
			var out []api.EntityRow
			for _, e := range ents {
				out = append(out, row(e))
			}
			return out, err
		},
		cert:   func() string { return "" },
		extras: func() ([]string, []string, bool) { return nil, []string{}, false },
		publish: func(env *envelope.Envelope, what string, _ time.Duration) (func() error, error) {
			r.in <- struct{}{}
			if r.gate != nil {
				<-r.gate
			}
			var b presenceBody
			if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
				t.Error(err)
			}
			r.mu.Lock()
			r.sent, r.kind = append(r.sent, b), append(r.kind, what)
			r.mu.Unlock()
			r.seen <- struct{}{}
			return func() error { return nil }, nil
		},
		up:   func() bool { return false },
		told: func() {},
	})
	return r
}

func (r *announcerRig) join(name string) string {
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: name, Host: "h1", Mode: "pull"}
	if err := r.st.CreateEntity(e); err != nil {
		r.t.Fatal(err)
	}
	return e.Gid
}

// wait waits for n more publishes.
func (r *announcerRig) wait(n int) {
	r.t.Helper()
	for range n {
		select {
		case <-r.seen:
		case <-time.After(30 * time.Second):
			r.t.Fatalf("a presence message was not published (published: %v)", r.kind)
		}
	}
}

// chain checks what was published is one chain: seq increasing, each
// prev the seq before it.
func (r *announcerRig) chain() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var prev int64
	for i, b := range r.sent {
		if b.Host != "h1" || b.Seq <= prev || b.Prev != prev {
			r.t.Fatalf("message %d (%s): host %s seq %d prev %d, after seq %d", i, r.kind[i], b.Host, b.Seq, b.Prev, prev)
		}
		prev = b.Seq
	}
}

func TestAnnouncerChain(t *testing.T) {
	r := newAnnouncerRig(t)
	alice, bob := r.join("alice"), r.join("bob")
	r.a.Change(alice) // not started: nothing is said
	r.a.Start(r.tick, r.up)
	r.up <- true // the broker came back: a snapshot
	r.wait(1)
	if s := r.sent[0].Snapshot; s == nil || len(s.Rows) != 2 || s.ID != r.sent[0].Seq {
		t.Fatalf("first message %+v, want a one-page snapshot of both", r.sent[0])
	}
	r.a.Change(alice)
	r.wait(1)
	if _, err := r.st.DeleteEntity(bob, "left"); err != nil {
		t.Fatal(err)
	}
	r.a.Change(bob)
	r.wait(1)
	r.a.Leave(time.Minute)
	r.wait(1)
	r.a.Change(alice) // after the leaving notice: nothing
	r.chain()
	if len(r.sent) != 4 {
		t.Fatalf("%d messages (%v), want snapshot, change, gone, leaving", len(r.sent), r.kind)
	}
	if c := r.sent[1].Change; c == nil || c.Row == nil || c.Row.Gid != alice || c.Row.Host != "" {
		t.Fatalf("alice's notice %+v: want her row, without its host", r.sent[1].Change)
	}
	if c := r.sent[2].Change; c == nil || c.Gone != bob {
		t.Fatalf("bob's notice %+v: want gone", r.sent[2].Change)
	}
	if !r.sent[3].Leaving {
		t.Fatal("the last link is not the leaving notice")
	}
}

// The chain's lock is never held across the broker: while a publish
// hangs, an entity's change is queued (and said, in order, once it
// returns) without waiting for it.
func TestAnnouncerLockNotHeldAcrossPublish(t *testing.T) {
	r := newAnnouncerRig(t)
	alice := r.join("alice")
	r.gate = make(chan struct{})
	r.a.Start(r.tick, r.up)
	r.a.Change(alice) // its publish hangs on the gate
	<-r.in
	queued := make(chan struct{})
	go func() {
		r.a.Change(alice)
		r.a.Soon(alice)
		r.a.say("other", "busy")
		close(queued)
	}()
	select {
	case <-queued:
	case <-time.After(30 * time.Second):
		t.Fatal("queuing a notice waited for the broker")
	}
	close(r.gate) // the broker takes them
	r.wait(2)
	r.a.Stop()
	r.chain()
}

// A settled announcement says a status only if it differs, by then,
// from the one last said: one that flapped back costs nothing.
func TestAnnouncerSettledStatus(t *testing.T) {
	r := newAnnouncerRig(t)
	alice := r.join("alice")
	r.a.Start(r.tick, r.up)
	settle := func() {
		t.Helper()
		r.a.Soon(alice)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			r.a.mu.Lock()
			due := r.a.due[alice]
			r.a.mu.Unlock()
			if !due {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the settled announcement never came due")
			}
		}
	}
	r.a.say(alice, "idle") // as the last snapshot said it; the row reads idle
	settle()
	r.a.Change(alice) // a plain notice after it: the settled one went first
	r.wait(1)
	r.a.say(alice, "busy") // said busy; the row reads idle now
	settle()
	r.wait(1)
	r.a.Stop()
	r.chain()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) != 2 {
		t.Fatalf("sent %v, want the plain notice and the settled one that found a new status", r.kind)
	}
}
