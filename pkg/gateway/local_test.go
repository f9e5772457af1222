package gateway_test

import (
	"slices"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// A message on one host: accepted durably, delivered to a pull entity in
// order, once; its state moves forward for its sender only.
func TestLocalSendRecv(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	var ids []string
	for _, b := range []string{"one", "two", "three"} {
		s := alice.mustSend("bob", b)
		if s.State != "accepted" || s.Recipient != "bob@h1" || s.Gid != bob.Gid {
			t.Fatalf("sent: %+v", s)
		}
		ids = append(ids, s.MsgID)
	}
	if got := bodies(bob.recv()); !slices.Equal(got, []string{"one", "two", "three"}) {
		t.Fatalf("bob got %v", got)
	}
	if got := bob.recv(); len(got) != 0 {
		t.Fatalf("bob got %d messages again", len(got))
	}
	resp, err := g.call(alice.Token, &api.LookupRequest{MsgID: ids[0]})
	if err != nil || resp.Record.State != "delivered" {
		t.Fatalf("lookup by the sender: %+v %v", resp, err)
	}
	carol := g.join("carol")
	_, err = g.call(carol.Token, &api.LookupRequest{MsgID: ids[0]})
	faultOf(t, err, fault.NoRecipient) // to anyone else the message does not exist
}

// Survives a restart: what was accepted is still there, once.
func TestLocalRestartKeepsMail(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	alice.mustSend("bob", "before")
	g.restart()
	if got := bodies(bob.recv()); !slices.Equal(got, []string{"before"}) {
		t.Fatalf("after restart bob got %v", got)
	}
}

// Bad input: one clear fault with its exit code, nothing accepted.
func TestLocalRefusals(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"max-body": "64"})
	alice := g.join("alice")
	g.join("bob")
	for _, c := range []struct {
		name string
		req  api.Request
		tok  string
		exit fault.Code
	}{
		{"no credential", &api.SendRequest{To: "bob", Body: "x"}, "", fault.Refused},
		{"bad credential", &api.SendRequest{To: "bob", Body: "x"}, "nope", fault.Refused},
		{"unknown recipient", &api.SendRequest{To: "nobody", Body: "x"}, alice.Token, fault.NoRecipient},
		{"empty body", &api.SendRequest{To: "bob", Body: "  "}, alice.Token, fault.Data},
		{"oversized body", &api.SendRequest{To: "bob", Body: string(make([]byte, 65))}, alice.Token, fault.Data},
		{"no recipient", &api.SendRequest{Body: "x"}, alice.Token, fault.Usage},
		{"name taken", &api.JoinRequest{Name: "bob", Mode: "pull"}, "", fault.Usage},
		{"bad name", &api.JoinRequest{Name: "../x", Mode: "pull"}, "", fault.Usage},
		{"unknown op", &api.UnknownRequest{Head: api.Head{Op: "frobnicate"}}, "", fault.Data},
		{"reply to an unknown message", &api.SendRequest{ReplyTo: "01a22a93-8b62-7719-997e-dae6eae12382", Body: "x"}, alice.Token, fault.NoRecipient},
	} {
		_, err := g.call(c.tok, c.req)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		var fe *fault.Error
		if !asFault(err, &fe) || fe.Code != c.exit {
			t.Errorf("%s: %v, want exit %d", c.name, err, c.exit)
		}
	}
}

// A client-minted msg id (fleet-send mints one; --id gives it again): a
// retry under it is the same message — stored once, and once settled told
// as it is, never sent again. An id that is not a message id, or is
// another message's, is refused before anything is stored.
func TestLocalClientMintedID(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob, carol := g.join("alice"), g.join("bob"), g.join("carol")
	const id = "01a233c2-8281-7d59-8312-3450637c4641"
	send := func(e entity, to, body, id string) (*api.Sent, error) {
		resp, err := g.call(e.Token, &api.SendRequest{To: to, Body: body, MsgID: id})
		if err != nil {
			return nil, err
		}
		return resp.Sent, nil
	}
	first, err := send(alice, "bob", "once", id)
	if err != nil || first.MsgID != id || first.State != "accepted" {
		t.Fatalf("first send: %+v %v", first, err)
	}
	again, err := send(alice, "bob", "once", id)
	if err != nil || again.MsgID != id || again.TraceID != first.TraceID {
		t.Fatalf("retry before delivery: %+v %v (first %+v)", again, err, first)
	}
	if got := bodies(bob.recv()); !slices.Equal(got, []string{"once"}) {
		t.Fatalf("bob got %v, want one copy", got)
	}
	settled, err := send(alice, "bob", "once", id)
	if err != nil || settled.State != "delivered" || settled.Warning == "" {
		t.Fatalf("retry after delivery: %+v %v", settled, err)
	}
	if got := bob.recv(); len(got) != 0 {
		t.Fatalf("bob got %d more after a retry", len(got))
	}
	for _, c := range []struct {
		name     string
		from     entity
		to, id   string
		wantCode fault.Code
	}{
		{"not a uuid", alice, "bob", "not-a-uuid", fault.Usage},
		{"upper case", alice, "bob", "01A233C2-8281-7D59-8312-3450637C4641", fault.Usage},
		{"another sender's", carol, "bob", id, fault.Usage},
		{"another recipient", alice, "carol", id, fault.Usage},
	} {
		_, err := send(c.from, c.to, "x", c.id)
		faultOf(t, err, c.wantCode)
	}
	if got := carol.recv(); len(got) != 0 {
		t.Fatalf("carol got %d messages from refused sends", len(got))
	}
}
