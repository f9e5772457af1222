package gateway_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
)

// A gateway stopped while a delivery is in flight finishes it and tells the
// sender's host: the receipt is published (and confirmed) before the broker
// connection closes, so the sender's record on h1 reads delivered, not
// accepted for ever.
func TestShutdownDrainSendsReceipt(t *testing.T) {
	h1, h2 := twoHostsWith(t, settings{"drain-timeout": "30s"})
	dir := t.TempDir()
	started, out := filepath.Join(dir, "started"), filepath.Join(dir, "got")
	alice := h1.join("alice")
	h2.join("hook", api.JoinRequest{Mode: "inject", Exec: "touch " + started + "; sleep 2; cat > " + out})
	h1.resolves("hook@h2")
	s := alice.mustSend("hook", "delivered while h2 stops")
	eventually(t, "the delivery on h2 to begin", func() error {
		_, err := os.Stat(started)
		return err
	})
	h2.stop() // as SIGTERM: the delivery in flight finishes within the drain bound
	if b, err := os.ReadFile(out); err != nil || len(b) == 0 {
		t.Fatalf("the in-flight delivery did not finish before h2 stopped: %q %v", b, err)
	}
	rec, err := alice.waitFor(s.MsgID, "delivered", 15_000)
	if err != nil {
		t.Fatalf("waiting on h1 for the record to settle: %v\n--- h2's log:\n%s", err, h2.logs)
	}
	if rec.State != "delivered" {
		t.Fatalf("record on h1 after h2 stopped: %+v (the receipt was lost in the shutdown)\n--- h2's log:\n%s", rec, h2.logs)
	}
}
