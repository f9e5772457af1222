package gateway_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// sendWait opens fleet-send --wait from e to "to".
func (e entity) sendWait(to, body string, timeoutMS int64) (*api.Client, *api.Sent) {
	e.gw.t.Helper()
	c, sent, err := e.gw.open(e.Token, &api.SendRequest{To: to, Body: body, Wait: true, TimeoutMS: timeoutMS})
	if err != nil {
		e.gw.t.Fatalf("send --wait from %s to %s: %v", e.Name, to, err)
	}
	return c, sent
}

// reply replies to msgID as e.
func (e entity) reply(msgID, body string) *api.Sent {
	e.gw.t.Helper()
	resp, err := e.gw.call(e.Token, &api.SendRequest{ReplyTo: msgID, Body: body})
	if err != nil {
		e.gw.t.Fatalf("reply from %s to %s: %v", e.Name, msgID, err)
	}
	return resp.Sent
}

// The reply is handed to the open send, in the send's trace, counts as
// delivered, and is not left in the sender's inbox; a later reply, with
// nobody waiting, is.
func TestLocalRendezvousReply(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.sendWait("bob", "fix the flaky test", 10_000)
	if sent.State != "accepted" || sent.Recipient != "bob@h1" {
		t.Fatalf("sent: %+v", sent)
	}
	bob.collect("fix the flaky test")
	r := bob.reply(sent.MsgID, "fixed")
	if r.Recipient != "alice@h1" || r.Gid != alice.Gid || r.TraceID != sent.TraceID {
		t.Fatalf("reply sent: %+v", r)
	}
	got, err := second(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if got.Kind != envelope.Reply || got.Body != "fixed" || got.InReplyTo != sent.MsgID || got.TraceID != sent.TraceID || got.MsgID != r.MsgID {
		t.Fatalf("the waiting send got %+v", got)
	}
	if rec := bob.waitState(r.MsgID, "delivered"); rec.Attempts != 1 {
		t.Errorf("reply record: %+v", rec)
	}
	alice.empty(bob)
	bob.reply(sent.MsgID, "and one more thing")
	alice.collect("and one more thing")
}

// No reply in time: 75, and the late reply waits in the sender's inbox.
func TestLocalRendezvousTimeout(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.sendWait("bob", "quick one", 50)
	_, err := second(t, c)
	fe := faultOf(t, err, fault.TempFail)
	if fe.Kind != fault.KindTimeout || !strings.Contains(fe.Hint, "fleet-recv") {
		t.Fatalf("timeout: %v (%s; hint %q)", fe, fe.Kind, fe.Hint)
	}
	bob.collect("quick one")
	bob.reply(sent.MsgID, "late")
	got := alice.collect("late")
	if got[0].Envelope.Kind != envelope.Reply || got[0].Envelope.InReplyTo != sent.MsgID {
		t.Fatalf("late reply: %+v", got[0].Envelope)
	}
}

// The waiting send goes away: the reply lands in the sender's inbox.
func TestLocalRendezvousSenderGone(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.sendWait("bob", "wait for me", 10_000)
	c.Close()
	bob.collect("wait for me")
	bob.reply(sent.MsgID, "you left")
	alice.collect("you left")
}

// A waiting send that cannot be sent fails on its first frame.
func TestLocalRendezvousRefused(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	for _, c := range []struct {
		name string
		tok  string
		req  api.Request
		exit fault.Code
	}{
		{"no credential", "", &api.SendRequest{To: "bob", Body: "x", Wait: true, TimeoutMS: 1000}, fault.Refused},
		{"unknown recipient", alice.Token, &api.SendRequest{To: "nobody", Body: "x", Wait: true, TimeoutMS: 1000}, fault.NoRecipient},
		{"empty body", alice.Token, &api.SendRequest{To: "bob", Body: "", Wait: true, TimeoutMS: 1000}, fault.Data},
	} {
		_, _, err := g.open(c.tok, c.req)
		if codeOf(err) != c.exit {
			t.Errorf("%s: %v, want exit %d", c.name, err, c.exit)
		}
	}
	s := alice.mustSend("bob", "plain")
	bob.collect("plain")
	_, err := g.call(bob.Token, &api.SendRequest{ReplyTo: s.MsgID, To: "alice", Body: "both"})
	faultOf(t, err, fault.Usage) // a reply goes to the original sender only
	bob.empty(alice)             // no failed send left anything behind
	alice.empty(bob)
}

// An inject entity waiting on its send gets the reply on the send, not
// injected as well.
func TestLocalRendezvousInjectSender(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", nil)
	bob := g.join("bob")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out})
	c, sent := hook.sendWait("bob", "from a hook", 10_000)
	bob.collect("from a hook")
	bob.reply(sent.MsgID, "to the hook's send")
	if got, err := second(t, c); err != nil || got.Body != "to the hook's send" {
		t.Fatalf("hook's send got %+v %v", got, err)
	}
	bob.mustSend("hook", "sentinel")
	if b := envBodies(waitLines(t, out, 1)); !slices.Equal(b, []string{"sentinel"}) {
		t.Fatalf("injected %q", b)
	}
}

// A gateway that stops ends a waiting send with 69; the reply to it, sent
// after the restart, waits in the sender's inbox.
func TestLocalRendezvousGatewayStops(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.sendWait("bob", "across a restart", 10_000)
	g.stop()
	_, err := second(t, c)
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != fault.KindShuttingDown {
		t.Fatalf("waiting send at shutdown: %v (%s)", fe, fe.Kind)
	}
	g.start()
	bob.collect("across a restart")
	bob.reply(sent.MsgID, "after the restart")
	alice.collect("after the restart")
}
