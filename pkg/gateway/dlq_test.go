package gateway_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// A rerun of fleet-dlq replay MSG_ID, once the dead letter is gone: the
// Known request says what it was replayed as, in its state now, and sends
// nothing; a msg id never replayed is 67 and leaves the dead letter as it
// is.
func TestLocalReplayKnown(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", settings{"delivery-attempts": "1"})
	alice := g.join("alice")
	g.join("broken", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out + "; exit 1"})
	sd := alice.mustSend("broken", "dies")
	alice.waitState(sd.MsgID, "dead")

	_, err := g.call("", &api.ReplayRequest{MsgID: sd.MsgID, Known: true})
	if fe := faultOf(t, err, fault.NoRecipient); fe.Kind != fault.KindUnknownMessage {
		t.Fatalf("known before a replay: %v (%s)", fe, fe.Kind)
	}
	if d := g.must("", &api.DeadRequest{}).Dead; len(d) != 1 || d[0].Record.MsgID != sd.MsgID {
		t.Fatalf("dead letters after asking: %+v", d)
	}

	r := g.must("", &api.ReplayRequest{MsgID: sd.MsgID})
	if r.Sent.ReplayOf != sd.MsgID || r.Sent.Again {
		t.Fatalf("replay: %+v", r.Sent)
	}
	alice.waitState(r.Sent.MsgID, "dead") // the command still fails: the replay dies too

	k := g.must("", &api.ReplayRequest{MsgID: sd.MsgID, Known: true})
	if k.Sent.MsgID != r.Sent.MsgID || k.Sent.ReplayOf != sd.MsgID || k.Sent.State != "dead" || !k.Sent.Again ||
		k.Sent.SenderGid != alice.Gid || k.Sent.Gid != r.Sent.Gid {
		t.Fatalf("known after the replay: %+v, replay %+v", k.Sent, r.Sent)
	}
	// nothing was sent: a message after it comes next (FIFO per recipient)
	s := alice.mustSend("broken", "sentinel")
	alice.waitState(s.MsgID, "dead")
	if b := envBodies(waitLines(t, out, 3)); !slices.Equal(b, []string{"dies", "dies", "sentinel"}) {
		t.Fatalf("the command got %q", b)
	}
}
