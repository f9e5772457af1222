package gateway

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The intake part alone (intake.go), against a real store in a temp
// folder: no socket, no broker, no delivery loops.

type intakeRig struct {
	t      *testing.T
	st     *store.Store
	in     *intake
	killed []string // msg ids dead-lettered, with their reason
	other  []envelope.Kind
}

func newIntakeRig(t *testing.T) *intakeRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &intakeRig{t: t, st: st}
	hand := func(env *envelope.Envelope) error { r.other = append(r.other, env.Kind); return nil }
	r.in = &intake{
		host: "h1", stateDir: t.TempDir(), st: st, log: log,
		reg: newRegistry(), rdv: newRendezvous(),
		caps: newInboxCaps(st, 0, 0, log, nil, nil, capHooks{}),
		kill: func(env *envelope.Envelope, reason string, _ int) {
			if err := st.Kill(store.Key(env), reason, 0); err != nil {
				t.Error(err)
			}
			r.killed = append(r.killed, env.MsgID+": "+reason)
		},
		receipt: hand, answer: hand, tooLate: hand, controlResult: hand, traceResult: hand,
		ask: func(_ *mailbox, env *envelope.Envelope) { r.other = append(r.other, env.Kind) },
	}
	return r
}

// entity makes a live entity of h1 in groups.
func (r *intakeRig) entity(name string, groups ...string) envelope.Party {
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: name, Host: "h1", Mode: "pull", Groups: groups}
	if err := r.st.CreateEntity(e); err != nil {
		r.t.Fatal(err)
	}
	r.in.reg.Add(&mailbox{ent: *e, done: make(chan struct{})})
	return envelope.Party{Gid: e.Gid, Name: e.Name, Host: "h1"}
}

// inbox is the bodies waiting in p's inbox, in order.
func (r *intakeRig) inbox(p envelope.Party) []string {
	items, err := r.st.Head(p.Gid, 0, 100)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, it := range items {
		out = append(out, it.Env.Body)
	}
	return out
}

var ibob = envelope.Party{Gid: "h2.0190aaaa-0000-7000-8000-000000000001", Name: "bob", Host: "h2"}

func TestIntakeTakeStoresOnceAndNamesTheRecipient(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice")
	env := envelope.New(envelope.Send, ibob, envelope.Party{Gid: alice.Gid}, "hi")
	for range 2 { // the broker redelivers: one copy is kept
		if err := r.in.Take(env); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.inbox(alice); len(got) != 1 || got[0] != "hi" {
		t.Fatalf("inbox %q, want one hi", got)
	}
	if env.Recipient.Name != "alice" || env.Recipient.Host != "h1" {
		t.Fatalf("recipient named %s@%s, want alice@h1", env.Recipient.Name, env.Recipient.Host)
	}
}

func TestIntakeRefusesWhatIsNotForAnInbox(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice", "ops")
	var refusal *broker.Refusal
	cp := envelope.New(envelope.Broadcast, ibob, envelope.Party{Gid: alice.Gid, Group: "dev"}, "not a member")
	if err := r.in.Take(cp); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonNotMember {
		t.Fatalf("a broadcast to a group alice is not in: %v, want a not-member refusal", err)
	}
	bounce := envelope.New(envelope.Bounce, ibob, envelope.Party{Gid: alice.Gid}, "x")
	if err := r.in.Take(bounce); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonMisrouted {
		t.Fatalf("a BOUNCE from the broker: %v, want a misrouted refusal", err)
	}
	if err := r.in.Take(envelope.New(envelope.Send, ibob, envelope.Party{Gid: "h1.0190aaaa-0000-7000-8000-00000000ffff"}, "x")); err == nil || errors.As(err, &refusal) {
		t.Fatalf("a message for no entity here: %v, want an error the broker redelivers", err)
	}
	if got := r.inbox(alice); len(got) != 0 {
		t.Fatalf("inbox %q, want nothing", got)
	}
}

func TestIntakeHandsOtherKindsToTheirParts(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice")
	for _, k := range []envelope.Kind{envelope.Receipt, envelope.Answer, envelope.Ask, envelope.TooLate, envelope.SpawnResult, envelope.TraceResult} {
		if err := r.in.Take(envelope.New(k, ibob, envelope.Party{Gid: alice.Gid}, "{}")); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	if len(r.other) != 6 {
		t.Fatalf("handed on: %v, want all six", r.other)
	}
	if got := r.inbox(alice); len(got) != 0 {
		t.Fatalf("inbox %q: nothing of these is inbox mail", got)
	}
}

func TestIntakeBatchKeepsOrderAroundARefusal(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice", "ops")
	to := envelope.Party{Gid: alice.Gid}
	envs := []*envelope.Envelope{
		envelope.New(envelope.Send, ibob, to, "1"),
		envelope.New(envelope.Broadcast, ibob, envelope.Party{Gid: alice.Gid, Group: "dev"}, "refused"),
		envelope.New(envelope.Send, ibob, to, "2"),
		envelope.New(envelope.Receipt, ibob, to, "{}"), // handed on in its place
		envelope.New(envelope.Send, ibob, to, "3"),
		envelope.New(envelope.Send, ibob, envelope.Party{Gid: "h1.0190aaaa-0000-7000-8000-00000000ffff"}, "nobody"),
		envelope.New(envelope.Send, ibob, to, "not tried"),
	}
	errs := r.in.TakeBatch(envs)
	var refusal *broker.Refusal
	if errs[0] != nil || !errors.As(errs[1], &refusal) || errs[2] != nil || errs[3] != nil || errs[4] != nil {
		t.Fatalf("results %v", errs)
	}
	if errs[5] == nil || !errors.Is(errs[6], broker.ErrNotTried) {
		t.Fatalf("after a message not taken in: %v, %v, want an error then not tried", errs[5], errs[6])
	}
	if got := r.inbox(alice); len(got) != 3 || got[0] != "1" || got[1] != "2" || got[2] != "3" {
		t.Fatalf("inbox %q, want 1 2 3", got)
	}
}

func TestIntakeExpiredIsDeadLettered(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice")
	env := envelope.New(envelope.Send, ibob, envelope.Party{Gid: alice.Gid}, "late")
	env.Expires = time.Now().Add(-time.Second)
	if err := r.in.Take(env); err != nil {
		t.Fatal(err)
	}
	if len(r.killed) != 1 {
		t.Fatalf("dead-lettered %v, want the expired message", r.killed)
	}
}

func TestIntakeHandsAReplyToItsOpenSend(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice")
	w := &replyWaiter{gid: alice.Gid, ch: make(chan *envelope.Envelope, 1)}
	r.in.rdv.Open("m1", w)
	reply := envelope.New(envelope.Reply, ibob, envelope.Party{Gid: alice.Gid}, "answer")
	reply.InReplyTo = "m1"
	if err := r.in.Take(reply); err != nil {
		t.Fatal(err)
	}
	if got := <-w.ch; got == nil || got.Body != "answer" {
		t.Fatalf("the open send got %v, want the reply", got)
	}
	if !r.in.rdv.Claimed(store.Key(reply)) {
		t.Fatal("the reply handed to the open send is not claimed: another delivery path could take it too")
	}
}
