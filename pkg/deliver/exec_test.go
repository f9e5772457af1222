package deliver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// A command run for a message sees fleet's own variables, made inert, and
// none of the gateway's FLEET_* environment (the broker's password).
func TestRunEnvironment(t *testing.T) {
	t.Setenv("FLEET_BROKER", "amqp://fleet:s3cret@broker:5671/")
	t.Setenv("FLEET_TOKEN", "gateway-token")
	t.Setenv("FLEETING", "kept") // not FLEET_*
	out := filepath.Join(t.TempDir(), "env")
	err := Run(context.Background(), "env > "+out, 5*time.Second, bytes.NewReader(nil), []string{
		"FLEET_MSG_ID=m-1",
		"FLEET_KIND=send\nFLEET_BROKER=forged\r",
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	for _, want := range []string{"\nFLEET_MSG_ID=m-1\n", "\nFLEET_KIND=send␊FLEET_BROKER=forged␍\n", "\nFLEETING=kept\n"} {
		if !strings.Contains("\n"+got, want) {
			t.Errorf("child environment lacks %q:\n%s", want[1:], got)
		}
	}
	for _, bad := range []string{"s3cret", "\nFLEET_BROKER=", "\nFLEET_TOKEN=", "gateway-token"} {
		if strings.Contains("\n"+got, bad) {
			t.Errorf("child environment holds %q:\n%s", strings.TrimPrefix(bad, "\n"), got)
		}
	}
}

func TestRunRefusesBadEnvironment(t *testing.T) {
	for _, kv := range []string{"PATH=/tmp", "FLEET_X", "FLEET_a=1", "LD_PRELOAD=/x.so", "=FLEET_X"} {
		err := Run(context.Background(), "true", time.Second, nil, []string{kv})
		if err == nil || !strings.Contains(err.Error(), "bad environment entry") {
			t.Errorf("Run with %q: err = %v, want a bad environment entry", kv, err)
		}
	}
}

// The exec adapter exports the message's fields, one inert line each.
func TestExecDeliverEnvironment(t *testing.T) {
	t.Setenv("FLEET_BROKER", "amqp://fleet:s3cret@broker/")
	out := filepath.Join(t.TempDir(), "env")
	x := &Exec{Command: "cat >/dev/null; env > " + out, Entity: "worker", Timeout: 5 * time.Second}
	env := &envelope.Envelope{
		Kind: envelope.Send, MsgID: "m\n1", TraceID: "t\x1b1",
		Sender: envelope.Party{Name: "alice", Host: "h\r1"}, Recipient: envelope.Party{Gid: "g"},
		Created: time.Now(), Body: "hi",
	}
	if err := x.Deliver(context.Background(), env); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := "\n" + string(data)
	for _, want := range []string{"\nFLEET_ENTITY=worker\n", "\nFLEET_MSG_ID=m␊1\n", "\nFLEET_TRACE_ID=t␛1\n",
		"\nFLEET_KIND=SEND\n", "\nFLEET_SENDER=alice@h␍1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("child environment lacks %q:\n%s", want[1:], got)
		}
	}
	if strings.Contains(got, "s3cret") {
		t.Errorf("child environment holds the broker password:\n%s", got)
	}
}
