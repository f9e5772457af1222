package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// capRig is the caps part alone against a real store in a temp folder:
// one entity, bob, and what the part's hooks were asked to do.
type capRig struct {
	t    *testing.T
	st   *store.Store
	c    *inboxCaps
	bob  envelope.Party
	logs bytes.Buffer

	mu      sync.Mutex
	bounced []string          // msg ids whose senders were bounced
	dead    map[string]string // msg id -> reason, as told to the dead hook
	held    map[string]bool   // record keys being handed over
}

// capFault is err as the 75 inbox_full fault it must be.
func capFault(t *testing.T, err error) *fault.Error {
	t.Helper()
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Code != fault.TempFail || fe.Kind != fault.KindInboxFull {
		t.Fatalf("want 75 inbox_full, got %v", err)
	}
	return fe
}

func newCapRig(t *testing.T, max int, ttl time.Duration) *capRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	bob := &store.Entity{Gid: ident.NewGid("h1"), Name: "bob", Host: "h1", Mode: "pull", Created: time.Now().UTC()}
	if err := st.CreateEntity(bob); err != nil {
		t.Fatal(err)
	}
	r := &capRig{t: t, st: st, bob: envelope.Party{Gid: bob.Gid, Name: "bob", Host: "h1"},
		dead: map[string]string{}, held: map[string]bool{}}
	r.c = newInboxCaps(st, max, ttl, slog.New(slog.NewTextHandler(&r.logs, nil)), nil, nil, capHooks{
		held: func(gid, key string) bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return gid != bob.Gid || r.held[key]
		},
		bounce: func(env *envelope.Envelope, reason string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.bounced = append(r.bounced, env.MsgID)
		},
		dead: func(env *envelope.Envelope, reason string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.dead[env.MsgID] = reason
		},
	})
	return r
}

// msg is a message of kind to bob, made at created.
func (r *capRig) msg(kind envelope.Kind, body string, created time.Time) *envelope.Envelope {
	env := envelope.New(kind, envelope.Party{Gid: ident.NewGid("h1"), Name: "alice", Host: "h1"}, r.bob, body)
	env.Created = created.UTC()
	return env
}

// store puts env in bob's inbox, accepted at, as routing does.
func (r *capRig) store(env *envelope.Envelope, at time.Time) {
	r.t.Helper()
	if _, dup, err := r.st.Accept(env, at.UTC()); err != nil || dup {
		r.t.Fatalf("accept: dup %v, %v", dup, err)
	}
}

func (r *capRig) record(env *envelope.Envelope) *store.Record {
	r.t.Helper()
	rec, err := r.st.Record(store.Key(env))
	if err != nil {
		r.t.Fatal(err)
	}
	return rec
}

// A full local inbox refuses a new message as reject-publish does: 75
// inbox_full for the call, the message dead here with the reason (a dead
// letter fleet-dlq can replay), its sender bounced; what waits stays.
func TestInboxCapRefusesOverTheCap(t *testing.T) {
	r := newCapRig(t, 2, 0)
	now := time.Now()
	for _, b := range []string{"one", "two"} {
		env := r.msg(envelope.Send, b, now)
		if err := r.c.Refuse(env); err != nil {
			t.Fatalf("room for %s: %v", b, err)
		}
		r.store(env, now)
	}
	three := r.msg(envelope.Send, "three", now)
	fe := capFault(t, r.c.Refuse(three))
	if !strings.Contains(fe.Msg, "the inbox of bob@h1 is full") {
		t.Fatalf("want inbox_full naming bob, got %v", fe)
	}
	rec := r.record(three)
	if rec.State != store.Dead || rec.Reason != "inbox full: the recipient's inbox holds inbox-max-length (2) messages" {
		t.Fatalf("record %+v", rec)
	}
	d, err := r.st.DeadLetter(three.MsgID)
	if err != nil || !bytes.Contains(d.Envelope, []byte(`"body":"three"`)) {
		t.Fatalf("dead letter %v, %v", d, err)
	}
	if len(r.bounced) != 1 || r.bounced[0] != three.MsgID {
		t.Fatalf("bounced %v, want %s once", r.bounced, three.MsgID)
	}
	if n := r.st.Pending(r.bob.Gid); n != 2 {
		t.Fatalf("pending %d, want 2: nothing older dropped", n)
	}
	// a second refusal in the same episode is not said again
	capFault(t, r.c.Refuse(r.msg(envelope.Reply, "four", now)))
	if n := strings.Count(r.logs.String(), "local inbox full"); n != 1 {
		t.Fatalf("said %d times, want once:\n%s", n, r.logs.String())
	}
	// a broadcast copy is refused for this member, dead, and tells nobody
	cp := r.msg(envelope.Broadcast, "everyone", now)
	cp.Recipient.Group = "all"
	capFault(t, r.c.Refuse(cp))
	if rec := r.record(cp); rec.State != store.Dead {
		t.Fatalf("broadcast copy %+v", rec)
	}
	if len(r.bounced) != 2 {
		t.Fatalf("bounced %v: a broadcast copy bounces nobody", r.bounced)
	}
	// the gateway's notices are never refused
	if err := r.c.Refuse(r.msg(envelope.Bounce, "notice", now)); err != nil {
		t.Fatalf("a BOUNCE refused: %v", err)
	}
	// Room checks only: no record
	five := r.msg(envelope.Send, "five", now)
	capFault(t, r.c.Room(five))
	if _, err := r.st.Record(five.MsgID); err == nil {
		t.Fatal("Room recorded a message")
	}
	// read mail makes room
	items, err := r.st.Head(r.bob.Gid, 0, 1)
	if err != nil || len(items) != 1 {
		t.Fatal(items, err)
	}
	if err := r.st.Delivered(store.Key(items[0].Env), time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Refuse(five); err != nil {
		t.Fatalf("room after a read: %v", err)
	}
}

// No cap configured (0): nothing is refused.
func TestInboxCapOff(t *testing.T) {
	r := newCapRig(t, 0, 0)
	for i := 0; i < 5; i++ {
		env := r.msg(envelope.Send, "x", time.Now())
		if err := r.c.Refuse(env); err != nil {
			t.Fatal(err)
		}
		r.store(env, time.Now())
	}
	if n := r.c.Sweep(time.Now().Add(1000 * time.Hour)); n != 0 {
		t.Fatalf("swept %d with no inbox-ttl", n)
	}
}

// Mail from another host is never taken past the cap (back-pressure):
// Fits stores what the inbox has room for, in order, and says where the
// broker must hold the rest, with a room check that reads true only once
// the inbox has drained to resumeAt. A redelivery of a message the inbox
// has takes no room; an entity that is leaving takes in everything.
func TestInboxCapHoldsMailOnTheBroker(t *testing.T) {
	r := newCapRig(t, 4, 0)
	now := time.Now()
	var envs []*envelope.Envelope
	for i := range 6 {
		envs = append(envs, r.msg(envelope.Send, fmt.Sprint("m", i), now))
	}
	r.store(envs[0], now)
	r.store(envs[1], now)
	// room for two more; envs[1] again is a redelivery
	batch := []*envelope.Envelope{envs[1], envs[2], envs[3], envs[4], envs[5]}
	n, err := r.c.Fits(batch)
	if n != 3 {
		t.Fatalf("fits %d, want 3 (a redelivery and two new ones)", n)
	}
	capFault(t, err)
	var bp interface{ Room() bool }
	if !errors.As(err, &bp) || !strings.Contains(err.Error(), "the inbox of bob@h1 is full") {
		t.Fatalf("not a back-pressure error: %v", err)
	}
	for _, env := range batch[1:n] {
		r.store(env, now)
	}
	if p := r.st.Pending(r.bob.Gid); p != 4 {
		t.Fatalf("pending %d, want 4", p)
	}
	if _, again := r.c.Fits(batch[n:]); again == nil {
		t.Fatal("a full inbox fits more")
	}
	// room again once it has drained to a quarter under the cap (3)
	if bp.Room() {
		t.Fatal("room in a full inbox")
	}
	if err := r.st.Delivered(envs[0].MsgID, now); err != nil {
		t.Fatal(err)
	}
	if !bp.Room() {
		t.Fatalf("no room at %d pending", r.st.Pending(r.bob.Gid))
	}
	// nothing died for want of room
	for _, env := range envs[1:4] {
		if rec := r.record(env); rec.State != store.Accepted {
			t.Fatalf("%s: %+v", env.Body, rec)
		}
	}
	if len(r.dead) != 0 || len(r.bounced) != 0 {
		t.Fatalf("dead %v, bounced %v", r.dead, r.bounced)
	}
	// leaving: everything is taken in
	r.c.Leaving(r.bob.Gid, true)
	if n, err := r.c.Fits(batch[3:]); n != 2 || err != nil {
		t.Fatalf("leaving: fits %d, %v", n, err)
	}
	r.c.Leaving(r.bob.Gid, false)
	if _, err := r.c.Fits(batch[3:]); err == nil {
		t.Fatal("no longer leaving: the cap holds again")
	}
}

// Mail that waited in a local inbox longer than inbox-ttl dies at the
// sweep with reason expired, oldest first, up to the first one still in
// time (the head, as a queue's TTL acts); its sender is told through the
// dead hook. A message being handed over, or being injected, is never
// expired under its reader.
func TestInboxCapExpiresOldMail(t *testing.T) {
	r := newCapRig(t, 0, time.Hour)
	now := time.Now()
	old1 := r.msg(envelope.Send, "old1", now.Add(-3*time.Hour))
	old2 := r.msg(envelope.Reply, "old2", now.Add(-2*time.Hour))
	fresh := r.msg(envelope.Send, "fresh", now)
	late := r.msg(envelope.Send, "behind a fresh one", now.Add(-2*time.Hour))
	r.store(old1, now.Add(-3*time.Hour))
	r.store(old2, now.Add(-2*time.Hour))
	r.store(fresh, now.Add(-time.Minute))
	r.store(late, now.Add(-2*time.Hour)) // accepted out of order: behind the head in time

	// the head is held (a fleet-recv batch): nothing expires
	r.held[store.Key(old1)] = true
	if n := r.c.Sweep(now); n != 0 {
		t.Fatalf("swept %d under a reader", n)
	}
	r.held = map[string]bool{}
	// the head is being injected: nothing expires
	if _, err := r.st.BeginInject(store.Key(old1)); err != nil {
		t.Fatal(err)
	}
	if n := r.c.Sweep(now); n != 0 {
		t.Fatalf("swept %d under an injection", n)
	}
	if err := r.st.Failed(store.Key(old1), "test: the paste failed"); err != nil {
		t.Fatal(err)
	}

	if n := r.c.Sweep(now); n != 2 {
		t.Fatalf("swept %d, want 2 (old1, old2)", n)
	}
	for _, env := range []*envelope.Envelope{old1, old2} {
		rec := r.record(env)
		if rec.State != store.Dead || rec.Reason != "expired in the inbox: it waited longer than inbox-ttl (1h0m0s)" {
			t.Fatalf("%s: %+v", env.Body, rec)
		}
		if r.dead[env.MsgID] != rec.Reason {
			t.Fatalf("%s: dead hook %q", env.Body, r.dead[env.MsgID])
		}
		if _, err := r.st.DeadLetter(env.MsgID); err != nil {
			t.Fatalf("%s: no dead letter: %v", env.Body, err)
		}
	}
	for _, env := range []*envelope.Envelope{fresh, late} {
		if rec := r.record(env); rec.State != store.Accepted {
			t.Fatalf("%s: %+v", env.Body, rec)
		}
	}
	// later, the fresh one is due too, and what waited behind it
	if n := r.c.Sweep(now.Add(2 * time.Hour)); n != 2 {
		t.Fatalf("swept %d, want 2", n)
	}
	if n := r.st.Pending(r.bob.Gid); n != 0 {
		t.Fatalf("pending %d", n)
	}
}

// An inbox of no live entity (the held hook says so) is left alone.
func TestInboxCapSweepSkipsGone(t *testing.T) {
	r := newCapRig(t, 0, time.Hour)
	gone := &store.Entity{Gid: ident.NewGid("h1"), Name: "gone", Host: "h1", Mode: "pull", Created: time.Now().UTC()}
	if err := r.st.CreateEntity(gone); err != nil {
		t.Fatal(err)
	}
	env := envelope.New(envelope.Send, r.bob, envelope.Party{Gid: gone.Gid, Name: "gone", Host: "h1"}, "x")
	env.Created = time.Now().Add(-2 * time.Hour).UTC()
	r.store(env, time.Now().Add(-2*time.Hour))
	if n := r.c.Sweep(time.Now()); n != 0 {
		t.Fatalf("swept %d", n)
	}
}

func TestInboxCapInterval(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		2 * time.Second:        200 * time.Millisecond,
		100 * time.Millisecond: 100 * time.Millisecond,
		168 * time.Hour:        time.Minute,
	} {
		if got := (&inboxCaps{ttl: ttl}).interval(); got != want {
			t.Errorf("inbox-ttl %v: every %v, want %v", ttl, got, want)
		}
	}
}
