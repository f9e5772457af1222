package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// The router alone (route.go), on the intake rig's store, without a broker
// (single-host mode): what is resolved, stored and told here. The caller
// is the entity named by the request's Token (the credential check is
// gateway.go's).

func newRouterRig(t *testing.T) (*intakeRig, *router) {
	r, rc := newReceiptsRig(t)
	cfg := &config.Config{Host: "h1", MaxBody: 1024, DedupWindow: time.Hour, StateDir: t.TempDir()}
	rt := &router{cfg: cfg, st: r.st, log: r.in.log, reg: r.in.reg, caps: r.in.caps, in: r.in,
		peers: newPeerView(time.Minute, r.in.log), names: newNameBook(r.in.log, time.Minute),
		br:    func() *broker.Broker { return nil },
		admit: func() *admission { return nil },
		caller: func(token string) (*mailbox, error) {
			if b := r.in.reg.ByName(token); b != nil {
				return b, nil
			}
			return nil, fault.New(fault.Refused, fault.KindBadCredential, "no such caller")
		},
		remote:  func() []api.EntityRow { return nil },
		heard:   func() {},
		rcpt:    rc,
		closing: func() <-chan struct{} { return nil },
	}
	return r, rt
}

// kindOfErr is err's fault kind ("" for none).
func kindOfErr(err error) fault.Kind {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe.Kind
	}
	return ""
}

func TestRouterResolve(t *testing.T) {
	r, rt := newRouterRig(t)
	alice := r.entity("alice")
	for _, to := range []string{"alice", "alice@h1", alice.Gid} {
		got, err := rt.Resolve(to)
		if err != nil || got.box == nil || got.box.snapshot().Gid != alice.Gid {
			t.Fatalf("Resolve(%q) = %+v, %v; want alice's mailbox", to, got, err)
		}
	}
	_, err := rt.Resolve("alcie")
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Kind != fault.KindUnknownRecipient || !strings.Contains(fe.Hint, "did you mean alice?") {
		t.Fatalf("a mistyped name: %v (hint %q), want unknown recipient, did you mean alice", err, fe.Hint)
	}
	for _, to := range []string{"alice@h2", "h2.0190aaaa-0000-7000-8000-00000000000b"} {
		if _, err := rt.Resolve(to); kindOfErr(err) != fault.KindUnknownRecipient || !strings.Contains(err.Error(), "no broker is configured") {
			t.Fatalf("Resolve(%q) without a broker: %v, want unknown recipient, no broker", to, err)
		}
	}
}

// A local send is in the recipient's inbox before it is accepted, with the
// hook called first; its record is told to its sender and its recipient,
// and to nobody else.
func TestRouterSendLocalAndLookup(t *testing.T) {
	r, rt := newRouterRig(t)
	alice, bob := r.entity("alice"), r.entity("bob")
	r.entity("carol")
	var before *envelope.Envelope
	resp, err := rt.SendWith(&api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: "hi"}, func(env *envelope.Envelope) {
		if got := r.inbox(bob); len(got) != 0 {
			t.Errorf("bob's inbox %q before the hook, want empty", got)
		}
		before = env
	})
	if err != nil {
		t.Fatal(err)
	}
	s := resp.Sent
	if before == nil || before.MsgID != s.MsgID || s.State != store.Accepted || s.Recipient != "bob@h1" || s.Gid != bob.Gid {
		t.Fatalf("sent %+v (hook saw %v), want accepted to bob@h1", s, before)
	}
	if got := r.inbox(bob); len(got) != 1 || got[0] != "hi" {
		t.Fatalf("bob's inbox %q, want hi", got)
	}
	for _, who := range []string{"alice", "bob"} {
		resp, err := rt.Lookup(&api.LookupRequest{Head: api.Head{Token: who}, MsgID: s.MsgID})
		if err != nil || resp.Record.Recipient != "bob@h1" || resp.Record.Gid != bob.Gid || resp.Record.State != store.Accepted {
			t.Fatalf("%s's lookup: %+v, %v; want the record, accepted, to bob@h1", who, resp, err)
		}
	}
	if _, err := rt.Lookup(&api.LookupRequest{Head: api.Head{Token: "carol"}, MsgID: s.MsgID}); kindOfErr(err) != fault.KindUnknownMessage {
		t.Fatalf("carol's lookup of a message not hers: %v, want unknown message", err)
	}
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: strings.Repeat("x", 2048)}); err == nil {
		t.Fatal("a body past max-body was sent")
	}
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "alice"}, Body: "to nobody"}); kindOfErr(err) != fault.KindUsage {
		t.Fatalf("a send without a recipient: %v, want usage", err)
	}
	_ = alice
}

// A reply goes to the original sender, in its trace, and only from the
// entity the message was delivered to.
func TestRouterReply(t *testing.T) {
	r, rt := newRouterRig(t)
	alice, bob := r.entity("alice"), r.entity("bob")
	r.entity("carol")
	sent, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: "question"})
	if err != nil {
		t.Fatal(err)
	}
	id := sent.Sent.MsgID
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "carol"}, ReplyTo: id, Body: "not mine"}); kindOfErr(err) != fault.KindUnknownMessage {
		t.Fatalf("a reply from carol to bob's message: %v, want unknown message", err)
	}
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "bob"}, ReplyTo: id, To: "carol", Body: "both"}); kindOfErr(err) != fault.KindUsage {
		t.Fatalf("a reply with a recipient too: %v, want usage", err)
	}
	rep, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "bob"}, ReplyTo: id, Body: "answer"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent.Gid != alice.Gid || rep.Sent.TraceID != sent.Sent.TraceID {
		t.Fatalf("reply %+v, want to alice in trace %s", rep.Sent, sent.Sent.TraceID)
	}
	items, err := r.st.Head(alice.Gid, 0, 10)
	if err != nil || len(items) != 1 || items[0].Env.Kind != envelope.Reply || items[0].Env.InReplyTo != id || items[0].Env.Sender.Gid != bob.Gid {
		t.Fatalf("alice's inbox %+v, %v; want bob's reply to %s", items, err, id)
	}
}

// A send under a client-minted id is one message: a retry while it is
// accepted keeps one copy; once settled it is told, not sent again; the
// id of another message is refused.
func TestRouterSendSameID(t *testing.T) {
	r, rt := newRouterRig(t)
	r.entity("alice")
	bob := r.entity("bob")
	id := envelope.NewID()
	req := &api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: "once", MsgID: id}
	for range 2 {
		resp, err := rt.Send(req)
		if err != nil || resp.Sent.MsgID != id || resp.Sent.Warning != "" {
			t.Fatalf("send under a minted id: %+v, %v", resp, err)
		}
	}
	if got := r.inbox(bob); len(got) != 1 {
		t.Fatalf("bob's inbox %q after a retry, want one copy", got)
	}
	if err := r.st.Delivered(id, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	resp, err := rt.Send(req)
	if err != nil || resp.Sent.State != store.Delivered || !strings.Contains(resp.Sent.Warning, "not sent again") {
		t.Fatalf("a retry of a delivered message: %+v, %v; want delivered, not sent again", resp, err)
	}
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "bob"}, To: "alice", Body: "other", MsgID: id}); kindOfErr(err) != fault.KindUsage {
		t.Fatalf("another message under the same id: %v, want usage", err)
	}
	if _, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: "x", MsgID: "not-an-id"}); kindOfErr(err) != fault.KindUsage {
		t.Fatalf("a malformed id: %v, want usage", err)
	}
}

// WaitState returns once the record reaches the state asked for (woken
// by the receipts' change signal), says a dead one is not what was asked,
// and names the state reached when the wait ends first.
func TestRouterWaitState(t *testing.T) {
	r, rt := newRouterRig(t)
	r.entity("alice")
	r.entity("bob")
	r.entity("carol")
	send := func(body string) string {
		resp, err := rt.Send(&api.SendRequest{Head: api.Head{Token: "alice"}, To: "bob", Body: body})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Sent.MsgID
	}
	id := send("one")
	got := make(chan error, 1)
	go func() {
		resp, err := rt.WaitState(&api.WaitRequest{Head: api.Head{Token: "alice"}, MsgID: id, Until: store.Delivered, TimeoutMS: 60_000})
		if err == nil && resp.Record.State != store.Delivered {
			err = errors.New("returned " + resp.Record.State)
		}
		got <- err
	}()
	if err := r.st.Delivered(id, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	rt.rcpt.Notify()
	if err := <-got; err != nil {
		t.Fatalf("waiting for delivered: %v", err)
	}

	dead := send("two")
	if err := r.st.Kill(dead, "why", 1); err != nil {
		t.Fatal(err)
	}
	resp, err := rt.WaitState(&api.WaitRequest{Head: api.Head{Token: "alice"}, MsgID: dead, Until: store.Delivered, TimeoutMS: 60_000})
	if kindOfErr(err) != fault.KindTimeout || resp.Record.State != store.Dead || !strings.Contains(err.Error(), "is dead") {
		t.Fatalf("waiting on a dead message: %+v, %v; want its record and 'is dead'", resp, err)
	}
	held := send("three")
	resp, err = rt.WaitState(&api.WaitRequest{Head: api.Head{Token: "alice"}, MsgID: held, Until: store.Delivered, TimeoutMS: 1})
	if kindOfErr(err) != fault.KindTimeout || resp.Record.State != store.Accepted {
		t.Fatalf("a wait that ends first: %+v, %v; want the record, still accepted", resp, err)
	}
	if _, err := rt.WaitState(&api.WaitRequest{Head: api.Head{Token: "carol"}, MsgID: held, Until: store.Delivered, TimeoutMS: 1}); kindOfErr(err) != fault.KindUnknownMessage {
		t.Fatalf("carol waiting on a message not hers: %v, want unknown message", err)
	}
}
