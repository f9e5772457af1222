package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// The asking side of the control plane alone (control_request.go): no
// socket, no broker. What it sends to another host is answered by the
// test, through Take, as the intake would hand the answer over.

type requestsRig struct {
	t       *testing.T
	c       *controlRequests
	sent    []*envelope.Envelope
	respond func(req *envelope.Envelope) // the other host, answering (nil: silent)
	heard   int
	linked  bool
	closing chan struct{}
}

var (
	ralice = store.Entity{Gid: "h1.0190aaaa-0000-7000-8000-0000000000a1", Name: "alice", Host: "h1", Mode: "pull"}
	rcarl  = api.EntityRow{Gid: "h2.0190aaaa-0000-7000-8000-0000000000c1", Name: "carl", Host: "h2", Mode: "pull", Groups: []string{}}
)

func trustAll(string) bool { return true }

func newRequestsRig(t *testing.T) *requestsRig {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &requestsRig{t: t, linked: true, closing: make(chan struct{})}
	peers := newPeerView(time.Minute, log)
	r.c = &controlRequests{host: "h1", log: log, peers: peers, interval: time.Minute,
		caller: func(string) (*mailbox, error) { return &mailbox{ent: ralice}, nil },
		resolve: func(to string) (target, error) {
			for _, row := range peers.ByName("carl", "", trustAll) {
				if to == "carl" || to == "carl@h2" || to == row.Gid {
					return target{gid: row.Gid, name: row.Name, host: row.Host}, nil
				}
			}
			return target{}, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no %s", to)
		},
		remote: func() []api.EntityRow { return peers.ByName("carl", "", trustAll) },
		linked: func() bool { return r.linked },
		send: func(_ context.Context, host string, env *envelope.Envelope) error {
			if host != env.Recipient.Host {
				t.Errorf("sent to %s, addressed to %s", host, env.Recipient.Host)
			}
			r.sent = append(r.sent, env)
			if r.respond != nil {
				r.respond(env)
			}
			return nil
		},
		heard:   func() { r.heard++ },
		ctx:     context.Background,
		closing: func() <-chan struct{} { return r.closing },
	}
	return r
}

// answer is host's answer to req, as it arrives on the requester's inbox.
func (r *requestsRig) answer(req *envelope.Envelope, host string, res controlResult) *envelope.Envelope {
	kind := envelope.SpawnResult
	if req.Kind == envelope.Stop {
		kind = envelope.StopResult
	}
	res.RequestID = req.MsgID
	data, err := json.Marshal(res)
	if err != nil {
		r.t.Fatal(err)
	}
	ans := envelope.New(kind, envelope.Party{Host: host}, req.Sender, string(data))
	ans.InReplyTo = req.MsgID
	return ans
}

// A spawn and a stop on another host: sent to its control queue, as the
// caller, expiring at the caller's deadline; the answer is the call's, and
// the roster view learns it at once.
func TestControlRequestsSpawnAndStopOnAnotherHost(t *testing.T) {
	r := newRequestsRig(t)
	r.respond = func(req *envelope.Envelope) {
		var b spawnBody
		if err := json.Unmarshal([]byte(req.Body), &b); err != nil {
			t.Error(err)
		}
		spawned := rcarl
		if err := r.c.Take(r.answer(req, "h2", controlResult{Spawned: &api.Spawned{
			Gid: spawned.Gid, Name: b.Name, Host: "h2", RequestID: req.MsgID, Profile: b.Profile, Mode: "pull"}})); err != nil {
			t.Error(err)
		}
	}
	resp, err := r.c.Spawn(&api.SpawnRequest{Name: "carl", Host: "h2", RequestID: "my-req", Groups: []string{"ops"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Spawned == nil || resp.Spawned.Gid != rcarl.Gid || resp.Spawned.Profile != "default" {
		t.Fatalf("spawned %+v", resp.Spawned)
	}
	req := r.sent[0]
	if req.Kind != envelope.Spawn || req.MsgID != "my-req" || req.Sender.Gid != ralice.Gid || req.Recipient.Host != "h2" ||
		req.Recipient.Group != "control" || !req.Expires.After(time.Now()) {
		t.Fatalf("request sent: %+v", req)
	}
	if got := r.c.peers.ByName("carl", "", trustAll); len(got) != 1 || got[0].Host != "h2" || r.heard != 1 {
		t.Fatalf("the view after the spawn: %+v (saved %d times)", got, r.heard)
	}

	r.respond = func(req *envelope.Envelope) {
		var b stopBody
		if err := json.Unmarshal([]byte(req.Body), &b); err != nil {
			t.Error(err)
		}
		if err := r.c.Take(r.answer(req, "h2", controlResult{Stopped: &api.Stopped{Gid: b.Gid, Name: b.Name, Host: "h2"}})); err != nil {
			t.Error(err)
		}
	}
	resp, err = r.c.Stop(&api.StopRequest{Target: "carl@h2"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Stopped == nil || resp.Stopped.Gid != rcarl.Gid || r.sent[1].Kind != envelope.Stop || r.sent[1].Recipient.Host != "h2" {
		t.Fatalf("stopped %+v, sent %+v", resp.Stopped, r.sent[1])
	}
	if got := r.c.peers.ByName("carl", "", trustAll); len(got) != 0 {
		t.Fatalf("carl is still in the view after the stop: %+v", got)
	}
	if len(r.c.waiters) != 0 {
		t.Fatalf("waiters left behind: %v", r.c.waiters)
	}
}

// What is refused before anything is sent, answers that are not the
// call's, and a call that gives up.
func TestControlRequestsRefusals(t *testing.T) {
	r := newRequestsRig(t)
	for _, req := range []api.SpawnRequest{
		{Name: "9lives", Host: "h2"},
		{Name: "carl", Host: "h 2"},
		{Name: "carl", Host: "h2", RequestID: "no spaces"},
		{Name: "carl", Host: "h2", Groups: []string{"bad group"}},
	} {
		if _, err := r.c.Spawn(&req); fault.KindOf(err) != fault.KindUsage {
			t.Errorf("spawn %+v: %v, want usage", req, err)
		}
	}
	if _, err := r.c.Stop(&api.StopRequest{Target: "nobody"}); fault.KindOf(err) != fault.KindUnknownEntity {
		t.Errorf("stop nobody: %v, want unknown entity", err)
	}
	if len(r.sent) != 0 {
		t.Fatalf("sent %d requests, want none", len(r.sent))
	}

	// answers not for this call: another host, a host lying about its
	// entity, an answer in reply to another id
	var refusal *broker.Refusal
	r.respond = func(req *envelope.Envelope) {
		ok := controlResult{Spawned: &api.Spawned{Gid: rcarl.Gid, Name: "carl", Host: "h2", Mode: "pull"}}
		if err := r.c.Take(r.answer(req, "h3", controlResult{Spawned: &api.Spawned{Gid: "h3.0190aaaa-0000-7000-8000-0000000000c1", Name: "carl", Host: "h3", Mode: "pull"}})); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonWrongHost {
			t.Errorf("an answer from h3 to a request sent to h2: %v, want wrong host", err)
		}
		if err := r.c.Take(r.answer(req, "h2", controlResult{Spawned: &api.Spawned{Gid: "h3.0190aaaa-0000-7000-8000-0000000000c1", Name: "carl", Host: "h2", Mode: "pull"}})); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonWrongHost {
			t.Errorf("h2 answering with a gid of h3: %v, want wrong host", err)
		}
		other := r.answer(req, "h2", ok)
		other.InReplyTo = "another"
		if err := r.c.Take(other); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonMalformed {
			t.Errorf("an answer in reply to another id than its own: %v, want malformed", err)
		}
	}
	_, err := r.c.Spawn(&api.SpawnRequest{Name: "carl", Host: "h2", TimeoutMS: 200})
	if fault.KindOf(err) != fault.KindTimeout {
		t.Fatalf("no answer of h2's own: %v, want a timeout", err)
	}
	if _, ok := r.c.waiters[r.sent[0].MsgID]; ok {
		t.Fatal("the call that gave up still waits")
	}
	// its answer comes late: nobody waits, it is dropped
	late := r.answer(r.sent[0], "h2", controlResult{Spawned: &api.Spawned{Gid: rcarl.Gid, Name: "carl", Host: "h2", Mode: "pull"}})
	if err := r.c.Take(late); err != nil {
		t.Fatalf("an answer nobody waits for: %v, want it dropped", err)
	}
	garbled := r.answer(r.sent[0], "h2", controlResult{})
	garbled.Body = "{"
	if err := r.c.Take(garbled); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonMalformed {
		t.Fatalf("an answer that is not JSON: %v, want malformed", err)
	}

	// shutting down: the call stops waiting
	r.respond = func(*envelope.Envelope) { close(r.closing) }
	if _, err := r.c.Spawn(&api.SpawnRequest{Name: "carl", Host: "h2"}); fault.KindOf(err) != fault.KindShuttingDown {
		t.Fatalf("the gateway stopping: %v, want shutting down", err)
	}
	// no broker: no other host
	r.linked = false
	if _, err := r.c.Spawn(&api.SpawnRequest{Name: "carl", Host: "h2"}); fault.KindOf(err) != fault.KindUnknownHost {
		t.Fatalf("no broker: %v, want unknown host", err)
	}
}

// A request for this host is carried out here, by the executor, broker or
// not: nothing is sent.
func TestControlRequestsThisHostCarriedOutHere(t *testing.T) {
	r := newRequestsRig(t)
	r.linked = false
	r.c.exec = newExecRig(t).x
	resp, err := r.c.Spawn(&api.SpawnRequest{Name: "dora", Profile: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Spawned == nil || resp.Spawned.Host != "h1" || len(r.sent) != 0 {
		t.Fatalf("spawned %+v, sent %d", resp.Spawned, len(r.sent))
	}
	if _, _, err := r.c.request(envelope.Stop, "h1", "s1", stopBody{Gid: resp.Spawned.Gid}, ralice, time.Minute); err != nil {
		t.Fatal(err)
	}
	res, _, err := r.c.request(envelope.Stop, "", "s1", stopBody{Gid: resp.Spawned.Gid}, ralice, time.Minute)
	if err != nil || res.Stopped == nil || res.Stopped.Gid != resp.Spawned.Gid {
		t.Fatalf("stop answered %+v, %v", res, err)
	}
	if _, err := r.c.Spawn(&api.SpawnRequest{Name: "dora", Profile: "nope"}); fault.KindOf(err) != fault.KindUnknownProfile {
		t.Fatalf("an unknown profile here: %v", err)
	}
}
