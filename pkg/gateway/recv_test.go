package gateway_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// startRecv opens a fleet-recv stream for e.
func startRecv(t testing.TB, e entity, req api.RecvRequest) *api.Client {
	t.Helper()
	c := e.gw.dial(e.Token)
	if err := c.Send(&req); err != nil {
		t.Fatal(err)
	}
	return c
}

// batch reads the next batch of a recv stream; with ack, acknowledges
// all of it.
func batch(t testing.TB, c *api.Client, ack bool) []api.Delivery {
	t.Helper()
	resp, err := c.Read()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	if resp.End {
		t.Fatal("recv ended, want a batch")
	}
	if ack {
		ackAll(t, c, resp.Batch)
	}
	return resp.Batch
}

func ackAll(t testing.TB, c *api.Client, ds []api.Delivery) {
	t.Helper()
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Envelope.MsgID
	}
	if err := c.Send(&api.AckRequest{Acks: ids}); err != nil {
		t.Fatal(err)
	}
}

func wantEnd(t testing.TB, c *api.Client) {
	t.Helper()
	resp, err := c.Read()
	if err != nil || !resp.End {
		t.Fatalf("want the end of the stream, got %+v %v", resp, err)
	}
}

func sendAll(e entity, to string, bs ...string) {
	for _, b := range bs {
		e.mustSend(to, b)
	}
}

// --max takes only that many, oldest first; the rest stay.
func TestLocalRecvMax(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	sendAll(alice, "bob", "m0", "m1", "m2", "m3", "m4")
	if got := bodies(bob.take(2)); !slices.Equal(got, []string{"m0", "m1"}) {
		t.Fatalf("--max 2: %q", got)
	}
	if got := bodies(bob.take(1)); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("--max 1: %q", got)
	}
	bob.collect("m3", "m4")
}

// Batches are at most the window; each is acknowledged before the next.
func TestLocalRecvWindow(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	sendAll(alice, "bob", "a", "b", "c", "d", "e")
	c := startRecv(t, bob, api.RecvRequest{Window: 2})
	var got []string
	for _, n := range []int{2, 2, 1} {
		b := batch(t, c, true)
		if len(b) != n {
			t.Fatalf("batch of %d, want %d", len(b), n)
		}
		got = append(got, bodies(b)...)
	}
	wantEnd(t, c)
	if !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("got %q", got)
	}
}

// A batch not acknowledged stays: the next fleet-recv gets it again.
func TestLocalRecvUnackedComesBack(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	s := alice.mustSend("bob", "one")
	alice.mustSend("bob", "two")
	c := startRecv(t, bob, api.RecvRequest{})
	if got := bodies(batch(t, c, false)); !slices.Equal(got, []string{"one", "two"}) {
		t.Fatalf("first recv %q", got)
	}
	c.Close() // killed between writing and acknowledging
	bob.collect("one", "two")
	if rec := alice.record(s.MsgID); rec.State != "delivered" || rec.Attempts != 1 {
		t.Fatalf("record %+v", rec)
	}
	bob.empty(alice)
}

// Acknowledging part of a batch: the rest comes again in the next batch
// of the same stream, in order.
func TestLocalRecvPartialAck(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	sendAll(alice, "bob", "a", "b", "c")
	c := startRecv(t, bob, api.RecvRequest{})
	b := batch(t, c, false)
	if got := bodies(b); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("batch %q", got)
	}
	ackAll(t, c, b[:1])
	if got := bodies(batch(t, c, true)); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("after acking a: %q", got)
	}
	wantEnd(t, c)
	for _, d := range b {
		alice.waitState(d.Envelope.MsgID, "delivered")
	}
	bob.empty(alice)
}

// One fleet-recv drains an inbox at a time; --follow streams what arrives
// later, and ends with 69 when the gateway stops.
func TestLocalRecvFollow(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c := holds(t, bob, api.RecvRequest{Follow: true})
	alice.mustSend("bob", "later")
	if got := bodies(batch(t, c, true)); !slices.Equal(got, []string{"later"}) {
		t.Fatalf("follow got %q", got)
	}
	sendAll(alice, "bob", "again", "and again")
	var got []string
	for len(got) < 2 {
		got = append(got, bodies(batch(t, c, true))...)
	}
	if !slices.Equal(got, []string{"again", "and again"}) {
		t.Fatalf("follow got %q", got)
	}
	c.Close()
	bob.take(0) // the closed stream let go of the inbox
	// a stream that waits for mail when the gateway stops
	c = holds(t, bob, api.RecvRequest{Follow: true})
	g.stop()
	_, err := c.Read()
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != fault.KindShuttingDown {
		t.Fatalf("follow at shutdown: %v", fe)
	}
	g.start()
	bob.empty(alice) // all three were acknowledged for good
}

// holds waits until a fleet-recv of e holds its inbox: another one is
// refused with 75.
// holds starts a fleet-recv stream of e's empty inbox and returns it once
// the gateway has it draining: a second fleet-recv is refused. A second
// one that got there first (the stream's request was still on its way)
// drained nothing and made the stream's own request be refused, so the
// stream is started again.
func holds(t testing.TB, e entity, req api.RecvRequest) *api.Client {
	t.Helper()
	c := startRecv(t, e, req)
	eventually(t, "a second fleet-recv of "+e.Name+" is refused", func() error {
		got, err := e.tryTake(0)
		if fault.KindOf(err) == fault.KindInboxBusy {
			if codeOf(err) != fault.TempFail {
				t.Fatalf("busy inbox: %v", err)
			}
			return nil
		}
		if err != nil || len(got) > 0 {
			t.Fatalf("second recv of an empty inbox: %v %v", got, err)
		}
		c.Close()
		c = startRecv(t, e, req)
		return errors.New("the stream did not hold the inbox yet")
	})
	return c
}

// --follow with --max ends once that many were taken.
func TestLocalRecvFollowMax(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	alice.mustSend("bob", "first")
	c := startRecv(t, bob, api.RecvRequest{Follow: true, Max: 2})
	if got := bodies(batch(t, c, true)); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("got %q", got)
	}
	sendAll(alice, "bob", "second", "third")
	if got := bodies(batch(t, c, true)); !slices.Equal(got, []string{"second"}) {
		t.Fatalf("got %q", got)
	}
	wantEnd(t, c)
	bob.collect("third")
}

// A recv stream takes only acknowledgements: anything else ends it with
// 65, and what was not acknowledged stays.
func TestLocalRecvProtocolErrors(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")

	c := startRecv(t, bob, api.RecvRequest{Follow: true})
	if err := c.Send(&api.WhoamiRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read()
	if fe := faultOf(t, err, fault.Data); !strings.Contains(fe.Msg, "unexpected request while waiting for mail") {
		t.Fatalf("a request on a waiting stream: %v", fe)
	}

	alice.mustSend("bob", "kept")
	c = startRecv(t, bob, api.RecvRequest{})
	eventually(t, "the previous stream let go", func() error {
		_, err := c.Read()
		if fault.KindOf(err) == fault.KindInboxBusy {
			c = startRecv(t, bob, api.RecvRequest{})
			return err
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
	if err := c.Send(&api.RosterRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Read()
	if fe := faultOf(t, err, fault.Data); !strings.Contains(fe.Msg, `want ack, got "roster"`) {
		t.Fatalf("a request in place of an ack: %v", fe)
	}
	bob.collect("kept")

	_, err = g.call("", &api.RecvRequest{})
	faultOf(t, err, fault.Refused)
}

// Two fleet-recv runs one after the other (the second starts once the
// first was told End) must both succeed: the gateway releases the inbox
// before it sends End. (It once released it after, so the second was
// refused with 75 now and then.)
func TestLocalRecvBackToBack(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	for i := range 300 {
		alice.mustSend("bob", "x")
		for k := range 2 {
			if _, err := bob.tryTake(0); err != nil {
				t.Fatalf("round %d, fleet-recv %d right after the previous one ended: %v", i, k+1, err)
			}
		}
	}
}

// A follower (--follow, no --max) that ends while the gateway runs leaves
// its entity detached; one that opens makes it idle; the gateway's stop
// does not, and a plain drain makes it idle. A bounded follow (--max) is
// no follower.
func TestLocalFollowerDetached(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	bob := g.join("bob")
	status := func(want, reason string) {
		t.Helper()
		eventually(t, "bob reads "+want, func() error {
			r, _ := g.rosterRow("bob")
			if r.Status != want || r.StatusReason != reason {
				return fmt.Errorf("bob reads %s (%s)", r.Status, r.StatusReason)
			}
			return nil
		})
	}
	c := holds(t, bob, api.RecvRequest{Follow: true, Max: 1})
	c.Close()
	bob.take(0)
	status("idle", "")
	c = holds(t, bob, api.RecvRequest{Follow: true})
	status("idle", "")
	c.Close()
	status("detached", "its fleet-recv --follow ended")
	c = holds(t, bob, api.RecvRequest{Follow: true})
	status("idle", "")
	g.stop()
	if _, err := c.Read(); fault.KindOf(err) != fault.KindShuttingDown {
		t.Fatalf("follower at the stop: %v", err)
	}
	g.start()
	status("idle", "") // due back within the grace
	c = holds(t, bob, api.RecvRequest{Follow: true})
	c.Close()
	status("detached", "its fleet-recv --follow ended")
	bob.take(0)
	status("idle", "")
}
