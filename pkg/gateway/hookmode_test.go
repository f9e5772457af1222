package gateway_test

import (
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// A hook entity's mail is held, as a pull entity's, for its agent's hooks
// (a recv with Hook): taken and acknowledged, it reads delivered; a hook
// that went away before acknowledging leaves it pending. A hook recv on a
// pull or inject entity is refused: its mail is not the hook's to take.
func TestHookModeEntity(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice := g.join("alice")
	ag := g.join("ag", api.JoinRequest{Mode: "hook"})
	if _, err := g.call("", &api.JoinRequest{Name: "bad", Mode: "hook", Exec: "cat"}); codeOf(err) != fault.Usage {
		t.Fatalf("a hook entity with --exec: %v", err)
	}
	s := alice.mustSend("ag", "hello")
	if rec := alice.record(s.MsgID); rec.State != "accepted" {
		t.Fatalf("held: %s", rec.State)
	}

	// the hook dies before acknowledging: still pending
	c := startRecv(t, ag, api.RecvRequest{Hook: true, Max: 16, Window: 16})
	if b := batch(t, c, false); len(b) != 1 || b[0].Envelope.Body != "hello" {
		t.Fatalf("hook batch %+v", b)
	}
	c.Close()
	if rec := alice.record(s.MsgID); rec.State != "accepted" {
		t.Fatalf("after a hook that did not acknowledge: %s", rec.State)
	}

	// the next one writes it out and acknowledges: delivered
	c = startRecv(t, ag, api.RecvRequest{Hook: true, Max: 16, Window: 16})
	batch(t, c, true)
	wantEnd(t, c)
	c.Close()
	alice.waitState(s.MsgID, "delivered")

	// a recipe's hook in a pull entity's agent takes nothing
	alice.mustSend("alice", "for fleet-recv")
	c = startRecv(t, alice, api.RecvRequest{Hook: true})
	if _, err := c.Read(); fault.KindOf(err) != fault.KindNotAgent {
		t.Fatalf("hook recv on a pull entity: %v", err)
	}
	c.Close()
	alice.collect("for fleet-recv")
}
