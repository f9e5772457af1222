package gateway

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/store"
)

// TestPolicyReplyExemption: a REPLY is taken past an entity's policy only
// when this host's record of the original says the entity sent it to the
// replier — another host's entity that merely knows the msg id (a trace
// answer, a broadcast) meets the policy as any sender; a duplicate of a
// message taken before is never refused.
func TestPolicyReplyExemption(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	bob := envelope.Party{Gid: "h1.0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a81", Name: "bob", Host: "h1"}
	alice := envelope.Party{Gid: "h2.0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a82", Name: "alice", Host: "h2"}
	mallory := envelope.Party{Gid: "h3.0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a83", Name: "mallory", Host: "h3"}
	orig := envelope.New(envelope.Send, bob, alice, "a question")
	if err := st.RecordOutbound(orig, time.Now()); err != nil {
		t.Fatal(err)
	}
	only, _ := accept.ParseAll([]string{"carol@h1"})
	p := newPolicy("h1", only, st, newRegistry(), newPeerView(time.Second, nil), nil, nil)
	e := store.Entity{Gid: bob.Gid, Name: "bob", Host: "h1", Accept: []string{"carol@h1"}, OwnAccept: true}

	reply := envelope.New(envelope.Reply, alice, bob, "the answer")
	reply.InReplyTo = orig.MsgID
	if !p.Allows(e, reply) {
		t.Fatal("the reply of the entity bob wrote to was refused")
	}
	forged := envelope.New(envelope.Reply, mallory, bob, "not an answer")
	forged.InReplyTo = orig.MsgID
	if p.Allows(e, forged) {
		t.Fatal("a reply from an entity the original did not go to was taken past the policy")
	}
	if err := p.Arrival(e, forged); err == nil {
		t.Fatal("Arrival took a forged reply")
	}
	plain := envelope.New(envelope.Send, mallory, bob, "hello")
	if p.Allows(e, plain) {
		t.Fatal("a sender the policy does not name was accepted")
	}
	// taken before (its record is here): the dedup's, not a refusal
	if err := st.RecordOutbound(plain, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Arrival(e, plain); err != nil {
		t.Fatalf("a message whose record exists was refused: %v", err)
	}
}
