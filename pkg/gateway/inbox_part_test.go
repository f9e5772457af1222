package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The inboxes part alone (inbox.go), on the intake rig's store and its
// receipts, without a broker: entities made live with their workers, a
// command delivered to, a nudge hook run, a message dead-lettered and its
// sender told. The workers stop when the test's run context is cancelled,
// and are waited for.

type inboxesRig struct {
	*intakeRig
	ib  *inboxes
	dir string
}

func newInboxesRig(t *testing.T) *inboxesRig {
	r, rc := newReceiptsRig(t)
	dir := t.TempDir()
	cfg := &config.Config{Host: "h1", StateDir: dir, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		DeliveryAttempts: 2, ExecTimeout: 10 * time.Second, NudgeAfter: 10 * time.Millisecond, NudgeMax: 50 * time.Millisecond}
	run, stop := context.WithCancel(context.Background())
	workers := &sync.WaitGroup{}
	t.Cleanup(func() { stop(); workers.Wait() })
	ib := &inboxes{cfg: cfg, st: r.st, log: r.in.log, reg: r.in.reg, rdv: r.in.rdv, rcpt: rc, workers: workers, caps: r.in.caps,
		change: func(string) {},
		br:     func() *broker.Broker { return nil },
		admit:  func() *admission { return nil },
		run:    func() context.Context { return run },
		ctx:    context.Background,
	}
	r.in.kill = ib.Kill
	return &inboxesRig{intakeRig: r, ib: ib, dir: dir}
}

// live makes e an entity of h1 through the part, as a join does.
func (r *inboxesRig) live(e *store.Entity) envelope.Party {
	e.Gid, e.Host, e.Status = ident.NewGid("h1"), "h1", stIdle
	if err := r.st.CreateEntity(e); err != nil {
		r.t.Fatal(err)
	}
	r.ib.Add(e)
	return envelope.Party{Gid: e.Gid, Name: e.Name, Host: "h1"}
}

// settles waits (generously) for msgID's record to reach state.
func (r *inboxesRig) settles(msgID, state string) *store.Record {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := r.st.Record(msgID)
		if err == nil && rec.State == state {
			return rec
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("message %s: %+v, %v; want %s", msgID, rec, err, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An inject entity's command gets each message, in order, and each is
// recorded delivered; a pull entity without a nudge gets no worker.
func TestInboxesExecDeliversInOrder(t *testing.T) {
	r := newInboxesRig(t)
	out := filepath.Join(r.dir, "got")
	alice := r.live(&store.Entity{Name: "alice", Mode: "pull"})
	if b := r.in.reg.Get(alice.Gid); b == nil {
		t.Fatal("a pull entity made live is not in the registry")
	} else {
		select {
		case <-b.done:
		default:
			t.Fatal("a pull entity without a nudge hook has a worker")
		}
	}
	svc := r.live(&store.Entity{Name: "svc", Mode: "inject", Exec: "cat >> " + out})
	var ids []string
	for _, body := range []string{"one", "two"} {
		env := envelope.New(envelope.Send, alice, svc, body)
		if _, err := r.in.Accept(env); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, env.MsgID)
	}
	for _, id := range ids {
		r.settles(id, store.Delivered)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if one, two := strings.Index(string(data), `"one"`), strings.Index(string(data), `"two"`); one < 0 || two < one {
		t.Fatalf("the command got %q, want one then two", data)
	}
	r.ib.Remove(svc.Gid)
	if r.in.reg.Get(svc.Gid) != nil {
		t.Fatal("a removed entity is still live")
	}
}

// A command that keeps failing dead-letters the message after the
// configured attempts; its sender here gets a bounce.
func TestInboxesFailingCommandDeadLetters(t *testing.T) {
	r := newInboxesRig(t)
	alice := r.live(&store.Entity{Name: "alice", Mode: "pull"})
	svc := r.live(&store.Entity{Name: "svc", Mode: "inject", Exec: "exit 3"})
	env := envelope.New(envelope.Send, alice, svc, "fails")
	if _, err := r.in.Accept(env); err != nil {
		t.Fatal(err)
	}
	rec := r.settles(env.MsgID, store.Dead)
	if !strings.HasPrefix(rec.Reason, "delivery failed 2 times") {
		t.Fatalf("dead with %q, want delivery failed 2 times", rec.Reason)
	}
	// the record is dead first, then the sender is told
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := r.inbox(alice)
		if len(got) == 1 && strings.Contains(got[0], "was dead-lettered: delivery failed 2 times") {
			break
		}
		if len(got) > 1 || time.Now().After(deadline) {
			t.Fatalf("alice's inbox %q, want the bounce", got)
		}
	}
}

// An expired message is dead-lettered, not delivered (a local send is
// stored as it is: its time is looked at by the worker).
func TestInboxesExpiredNotDelivered(t *testing.T) {
	r := newInboxesRig(t)
	out := filepath.Join(r.dir, "got")
	alice := r.live(&store.Entity{Name: "alice", Mode: "pull"})
	svc := r.live(&store.Entity{Name: "svc", Mode: "inject", Exec: "cat >> " + out})
	late := envelope.New(envelope.Send, alice, svc, "late")
	late.Expires = time.Now().Add(-time.Second)
	if _, err := r.in.Accept(late); err != nil {
		t.Fatal(err)
	}
	if rec := r.settles(late.MsgID, store.Dead); rec.Reason != "expired before delivery" {
		t.Fatalf("dead with %q, want expired before delivery", rec.Reason)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("an expired message was delivered")
	}
}

// A pull entity's nudge hook runs while mail waits, with the count.
func TestInboxesNudge(t *testing.T) {
	r := newInboxesRig(t)
	out := filepath.Join(r.dir, "nudged")
	alice := r.live(&store.Entity{Name: "alice", Mode: "pull"})
	bob := r.live(&store.Entity{Name: "bob", Mode: "pull", Nudge: "echo $FLEET_ENTITY $FLEET_PENDING >> " + out})
	if _, err := r.in.Accept(envelope.New(envelope.Send, alice, bob, "read me")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, _ := os.ReadFile(out)
		if strings.HasPrefix(string(data), "bob 1\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nudge hook wrote %q, want bob 1", data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Register is the one path of an entity into this host: checked, stored,
// live, its credential saved; Unregister the one path out: what waited
// dead-lettered (its senders told), the credential and the entity gone.
func TestInboxesRegisterUnregister(t *testing.T) {
	r := newInboxesRig(t)
	r.ib.follow = newFollowers(r.st, r.in.log, func(string) {})
	var changed []string
	r.ib.change = func(gid string) { changed = append(changed, gid) }
	alice := r.live(&store.Entity{Name: "alice", Mode: "pull"})

	e := &store.Entity{Name: "bob", Mode: "pull", Groups: []string{"ops"}}
	token, path, err := r.ib.Register(e)
	if err != nil {
		t.Fatal(err)
	}
	if e.Gid == "" || e.Host != "h1" || e.Status != stIdle || r.in.reg.Get(e.Gid) == nil {
		t.Fatalf("registered %+v, want a live idle entity of h1", e)
	}
	if saved, err := ident.Load(r.dir, "bob"); err != nil || saved != token || filepath.Dir(path) == "" {
		t.Fatalf("credential saved %q at %s (%v), want the token issued", saved, path, err)
	}
	if gid, secret, err := ident.Parse(token); err != nil || gid != e.Gid || !ident.Check(secret, e.TokenHash) {
		t.Fatalf("the token does not name and prove bob: %v", err)
	}
	if len(changed) != 1 || changed[0] != e.Gid {
		t.Fatalf("presence told of %v, want bob", changed)
	}
	if _, _, err := r.ib.Register(&store.Entity{Name: "bob", Mode: "pull"}); kindOfErr(err) != fault.KindNameTaken {
		t.Fatalf("bob again: %v, want name taken", err)
	}
	if _, _, err := r.ib.Register(&store.Entity{Name: "carl", Mode: "push"}); kindOfErr(err) != fault.KindUsage {
		t.Fatalf("an unknown mode: %v, want usage", err)
	}

	bob := envelope.Party{Gid: e.Gid, Name: "bob", Host: "h1"}
	for _, body := range []string{"1", "2"} {
		if _, err := r.in.Accept(envelope.New(envelope.Send, alice, bob, body)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := r.ib.Unregister(e.Gid, "bob")
	if err != nil || n != 2 {
		t.Fatalf("unregister: %d, %v; want 2 dead-lettered", n, err)
	}
	if r.in.reg.Get(e.Gid) != nil {
		t.Fatal("bob is still live")
	}
	ents, err := r.st.Entities()
	if err != nil || len(ents) != 1 || ents[0].Name != "alice" {
		t.Fatalf("stored entities %v (%v), want alice alone", ents, err)
	}
	if _, err := ident.Load(r.dir, "bob"); err == nil {
		t.Fatal("bob's credential outlived it")
	}
	if got := r.inbox(alice); len(got) != 2 || !strings.Contains(got[0], "recipient left the fleet") {
		t.Fatalf("alice's inbox %q, want two bounces: left the fleet", got)
	}
}
