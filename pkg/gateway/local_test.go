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
	resp, err := g.call(alice.Token, &api.Request{Op: api.OpLookup, MsgID: ids[0]})
	if err != nil || resp.Record.State != "delivered" {
		t.Fatalf("lookup by the sender: %+v %v", resp, err)
	}
	carol := g.join("carol")
	_, err = g.call(carol.Token, &api.Request{Op: api.OpLookup, MsgID: ids[0]})
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
		{"no credential", api.Request{Op: api.OpSend, To: "bob", Body: "x"}, "", fault.Refused},
		{"bad credential", api.Request{Op: api.OpSend, To: "bob", Body: "x"}, "nope", fault.Refused},
		{"unknown recipient", api.Request{Op: api.OpSend, To: "nobody", Body: "x"}, alice.Token, fault.NoRecipient},
		{"empty body", api.Request{Op: api.OpSend, To: "bob", Body: "  "}, alice.Token, fault.Data},
		{"oversized body", api.Request{Op: api.OpSend, To: "bob", Body: string(make([]byte, 65))}, alice.Token, fault.Data},
		{"no recipient", api.Request{Op: api.OpSend, Body: "x"}, alice.Token, fault.Usage},
		{"name taken", api.Request{Op: api.OpJoin, Name: "bob", Mode: "pull"}, "", fault.Usage},
		{"bad name", api.Request{Op: api.OpJoin, Name: "../x", Mode: "pull"}, "", fault.Usage},
		{"unknown op", api.Request{Op: "frobnicate"}, "", fault.Data},
		{"reply to an unknown message", api.Request{Op: api.OpSend, ReplyTo: "01a22a93-8b62-7719-997e-dae6eae12382", Body: "x"}, alice.Token, fault.NoRecipient},
	} {
		_, err := g.call(c.tok, &c.req)
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
