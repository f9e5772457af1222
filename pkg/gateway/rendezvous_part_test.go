package gateway

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The rendezvous alone (rendezvous.go), against a real store in a temp
// folder; the client is caught where a socket would be.

type caughtConn struct {
	mu      sync.Mutex
	replies []*api.Response
	fails   []error
	gone    chan error // what the client's next read returns (blocks until sent)
}

func (c *caughtConn) reply(r *api.Response) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replies = append(c.replies, r)
	return nil
}

func (c *caughtConn) fail(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fails = append(c.fails, err)
	return nil
}

func (c *caughtConn) read() (api.Request, error) { return nil, <-c.gone }

type rdvRig struct {
	t       *testing.T
	st      *store.Store
	r       *rendezvous
	alice   *mailbox
	settled []string
}

func newRdvRig(t *testing.T) *rdvRig {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	x := &rdvRig{t: t, st: st, r: newRendezvous()}
	reg := newRegistry()
	x.r.wire(st, reg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil,
		func(env *envelope.Envelope, state, _ string, _ int) {
			x.settled = append(x.settled, env.MsgID+" "+state)
		})
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: "alice", Host: "h1", Mode: "pull"}
	if err := st.CreateEntity(e); err != nil {
		t.Fatal(err)
	}
	x.alice = &mailbox{ent: *e, done: make(chan struct{})}
	reg.Add(x.alice)
	return x
}

// reply stores a reply to msgID in alice's inbox.
func (x *rdvRig) reply(msgID, body string) *envelope.Envelope {
	env := envelope.New(envelope.Reply, envelope.Party{Gid: "h2.0190aaaa-0000-7000-8000-000000000001", Host: "h2"}, envelope.Party{Gid: x.alice.snapshot().Gid, Name: "alice", Host: "h1"}, body)
	env.InReplyTo = msgID
	if _, _, err := x.st.AcceptBatch([]*envelope.Envelope{env}, time.Now()); err != nil {
		x.t.Fatal(err)
	}
	return env
}

func (x *rdvRig) inbox() []store.Item {
	items, err := x.st.Head(x.alice.snapshot().Gid, 0, 100)
	if err != nil {
		x.t.Fatal(err)
	}
	return items
}

// A reply that came while nobody waited is claimed by the resumed wait:
// no other path takes it meanwhile, and handed, it is delivered.
func TestRendezvousResumeClaimsAStoredReply(t *testing.T) {
	x := newRdvRig(t)
	x.reply("other", "not this one")
	env := x.reply("m1", "the reply")
	w := x.r.Resume(x.alice.snapshot().Gid, "m1")
	free, held := x.r.Free(x.inbox())
	if held != 1 || len(free) != 1 || free[0].Env.Body != "not this one" {
		t.Fatalf("free %d, held %d: the claimed reply must be left to the wait alone", len(free), held)
	}
	c := &caughtConn{gone: make(chan error)}
	x.r.Await(nil, c, x.alice, "m1", w, time.Minute)
	if len(c.replies) != 1 || c.replies[0].Batch[0].Envelope.Body != "the reply" {
		t.Fatalf("the wait got %+v, %v", c.replies, c.fails)
	}
	rec, err := x.st.Record(store.Key(env))
	if err != nil || rec.State != store.Delivered {
		t.Fatalf("its record: %+v, %v; want delivered", rec, err)
	}
	if len(x.settled) != 1 || x.settled[0] != env.MsgID+" "+store.Delivered {
		t.Fatalf("settled %v", x.settled)
	}
	if _, held := x.r.Free(x.inbox()); held != 0 || x.r.Claimed(store.Key(env)) {
		t.Fatal("the reply handed is still claimed")
	}
}

// A wait that ends (timeout, the client gone, shutdown) releases a reply
// that claimed it to the inbox, never left claimed.
func TestRendezvousAbandonReleases(t *testing.T) {
	x := newRdvRig(t)
	gid := x.alice.snapshot().Gid
	w := &replyWaiter{gid: gid, ch: make(chan *envelope.Envelope, 1)}
	x.r.Open("m1", w)
	env := x.reply("m1", "late")
	if got := x.r.Claim(env); got != w {
		t.Fatal("the reply did not claim its open send")
	}
	w.ch <- env
	x.r.Abandon("m1", w)
	if x.r.Claimed(store.Key(env)) {
		t.Fatal("an abandoned wait left its reply claimed")
	}
	if free, _ := x.r.Free(x.inbox()); len(free) != 1 {
		t.Fatalf("inbox free %d, want the late reply", len(free))
	}

	// shutdown and timeout end a wait with their errors
	stop := make(chan struct{})
	close(stop)
	c := &caughtConn{gone: make(chan error)}
	x.r.Await(stop, c, x.alice, "m2", x.r.Resume(gid, "m2"), time.Minute)
	x.r.Await(nil, c, x.alice, "m3", x.r.Resume(gid, "m3"), time.Millisecond)
	if len(c.fails) != 2 || fault.KindOf(c.fails[0]) != fault.KindShuttingDown || fault.KindOf(c.fails[1]) != fault.KindTimeout {
		t.Fatalf("fails %v, want shutting down, then timeout", c.fails)
	}
	// the client going away ends it without a word
	c2 := &caughtConn{gone: make(chan error, 1)}
	c2.gone <- errors.New("closed")
	x.r.Await(nil, c2, x.alice, "m4", x.r.Resume(gid, "m4"), time.Hour)
	if len(c2.fails)+len(c2.replies) != 0 {
		t.Fatalf("a wait whose client went: %v %v", c2.fails, c2.replies)
	}
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	if len(x.r.waiters) != 0 || len(x.r.claimed) != 0 {
		t.Fatalf("left behind: %d waiters, %d claims", len(x.r.waiters), len(x.r.claimed))
	}
}
