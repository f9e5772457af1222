package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// The tracer part alone (trace.go): the intake rig's store and entities,
// a real audit log in a temp folder, no broker.

func newTracerRig(t *testing.T) (*intakeRig, *tracer, *audit.Log, *sync.WaitGroup) {
	r := newIntakeRig(t)
	a, err := audit.Open(filepath.Join(t.TempDir(), "audit.log"), "h1", audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	var workers sync.WaitGroup
	tr := newTracer("h1", r.in.log, a, r.in.reg, newPeerView(time.Second, r.in.log), &workers)
	tr.br = func() *broker.Broker { return nil }
	tr.trusted = func() []string { return []string{"h2"} }
	tr.ctx = context.Background
	tr.done = func() <-chan struct{} { return nil }
	return r, tr, a, &workers
}

// Without a broker, a trace is this host's hops alone, in flow order,
// with the names this host knows.
func TestTracerOwnHops(t *testing.T) {
	r, tr, a, _ := newTracerRig(t)
	alice, carol := r.entity("alice"), r.entity("carol")
	env := envelope.New(envelope.Send, alice, carol, "hi")
	a.Message("accepted", env, 0, "")
	a.Message("taken", env, 1, "")
	a.Message("accepted", envelope.New(envelope.Send, alice, carol, "another flow"), 0, "")
	var caller store.Entity
	tr.caller = func(string) (store.Entity, error) { return caller, nil }
	if e := r.in.reg.Get(alice.Gid); e != nil {
		caller = e.snapshot()
	}

	res, err := tr.Trace(&api.TraceRequest{TraceID: env.TraceID})
	if err != nil {
		t.Fatal(err)
	}
	out := res.Trace
	if len(out.Hosts) != 1 || out.Hosts[0].Host != "h1" || out.Hosts[0].State != api.TraceAnswered || out.Hosts[0].Hops != 2 {
		t.Fatalf("hosts %+v, want h1 answered with 2 hops", out.Hosts)
	}
	if len(out.Hops) != 2 || out.Hops[0].Event != "accepted" || out.Hops[1].Event != "taken" {
		t.Fatalf("hops %+v, want accepted then taken", out.Hops)
	}
	if out.Names[alice.Gid] != "alice" || out.Names[carol.Gid] != "carol" {
		t.Fatalf("names %v", out.Names)
	}

	_, err = tr.Trace(&api.TraceRequest{TraceID: "not an id"})
	faultKind(t, err, fault.KindUsage)
	_, err = tr.Trace(&api.TraceRequest{TraceID: env.TraceID, TimeoutMS: (controlWindow + time.Second).Milliseconds()})
	faultKind(t, err, fault.KindUsage)
	nobody := errors.New("no credential")
	tr.caller = func(string) (store.Entity, error) { return store.Entity{}, nobody }
	if _, err := tr.Trace(&api.TraceRequest{TraceID: env.TraceID}); err != nobody {
		t.Fatalf("a caller refused: %v", err)
	}
}

// An answer is handed to its query's run once, from a host asked, checked
// whole; with nobody waiting it is dropped.
func TestTracerResult(t *testing.T) {
	r, tr, _, _ := newTracerRig(t)
	alice := r.entity("alice")
	run := tr.waits.Open("q1", traceA, alice.Gid, []string{"h2", "h3"})
	defer tr.waits.Close("q1")
	answer := func(host string, ans traceAnswer, inReplyTo string) *envelope.Envelope {
		body, _ := json.Marshal(ans)
		env := envelope.New(envelope.TraceResult, envelope.Party{Host: host}, alice, string(body))
		env.InReplyTo = inReplyTo
		return env
	}
	hop := api.Hop{Time: time.Now().Add(-time.Minute), Host: "h2", Event: "taken", Sender: gidH2}
	if err := tr.Result(answer("h9", traceAnswer{TraceID: traceA}, "q1")); !isRefusal(err, broker.ReasonWrongHost) {
		t.Fatalf("an answer from h9, not asked: %v", err)
	}
	bad := hop
	bad.Host = "h3"
	if err := tr.Result(answer("h2", traceAnswer{TraceID: traceA, Hops: []api.Hop{bad}}, "q1")); !isRefusal(err, broker.ReasonWrongHost) {
		t.Fatalf("h2 speaking for h3's hops: %v", err)
	}
	if err := tr.Result(answer("h2", traceAnswer{TraceID: traceA, Hops: []api.Hop{hop}}, "q1")); err != nil {
		t.Fatal(err)
	}
	if got := <-run.ch; got.host != "h2" || len(got.ans.Hops) != 1 {
		t.Fatalf("handed %+v", got)
	}
	// repeated, or to a query nobody waits for: dropped, not refused
	for _, env := range []*envelope.Envelope{
		answer("h2", traceAnswer{TraceID: traceA, Hops: []api.Hop{hop}}, "q1"),
		answer("h2", traceAnswer{TraceID: traceA}, "q-gone"),
	} {
		if err := tr.Result(env); err != nil {
			t.Fatalf("an answer nobody waits for: %v", err)
		}
	}
	select {
	case got := <-run.ch:
		t.Fatalf("a repeated answer handed on: %+v", got)
	default:
	}
}

// A query from another host is refused when it names no requester or no
// trace, and not answered (no search started) when expired or when
// traceSearches searches run already.
func TestTracerQuery(t *testing.T) {
	_, tr, _, workers := newTracerRig(t)
	query := func(from envelope.Party, body string, expires time.Time) *envelope.Envelope {
		env := envelope.New(envelope.Trace, from, envelope.Party{Host: "h1", Group: "control"}, body)
		env.Expires = expires
		return env
	}
	bob := envelope.Party{Gid: gidH2, Name: "bob", Host: "h2"}
	good, _ := json.Marshal(traceQuery{TraceID: traceA})
	soon := time.Now().Add(time.Minute)
	if err := tr.Query(query(envelope.Party{Host: "h2"}, string(good), soon)); !isRefusal(err, broker.ReasonMalformed) {
		t.Fatalf("a query naming no requester: %v", err)
	}
	if err := tr.Query(query(bob, `{"trace_id":"a b"}`, soon)); !isRefusal(err, broker.ReasonMalformed) {
		t.Fatalf("a query without a trace id: %v", err)
	}
	// no broker here: a search started would publish its answer to a nil
	// broker, and panic
	if err := tr.Query(query(bob, string(good), time.Now().Add(-time.Second))); err != nil {
		t.Fatalf("an expired query: %v", err)
	}
	for range traceSearches {
		tr.sem <- struct{}{}
	}
	if err := tr.Query(query(bob, string(good), soon)); err != nil {
		t.Fatalf("a query over the bound: %v", err)
	}
	workers.Wait()
	if len(tr.sem) != traceSearches {
		t.Fatalf("%d searches running, want the %d of the test", len(tr.sem), traceSearches)
	}
}
