package deliver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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

// A failing command's error holds its exit status, the size and hash of its
// stderr, and nothing of the output or the command line: the text goes to
// the audit log, trace answers, dead letters and bounces.
func TestRunFailureHoldsNoText(t *testing.T) {
	const cmd = "cat >&2; echo SECRETMARK >&2; exit 3"
	body := "BODYMARK\n"
	err := Run(context.Background(), cmd, 5*time.Second, bytes.NewReader([]byte(body)), nil)
	var x *ExecError
	if !errors.As(err, &x) {
		t.Fatalf("err = %v (%T), want an *ExecError", err, err)
	}
	stderr := body + "SECRETMARK\n"
	sum := sha256.Sum256([]byte(stderr))
	want := fmt.Sprintf("exit status 3 (stderr %d bytes, sha256 %x)", len(stderr), sum[:8])
	if got := err.Error(); got != want {
		t.Errorf("err = %q, want %q", got, want)
	}
	for _, bad := range []string{"SECRETMARK", "BODYMARK", "cat", "echo"} {
		if strings.Contains(err.Error(), bad) {
			t.Errorf("err %q holds %q", err, bad)
		}
	}
	x2 := &Exec{Command: cmd, Entity: "w", Timeout: 5 * time.Second}
	err = x2.Deliver(context.Background(), &envelope.Envelope{Kind: envelope.Send, MsgID: "m", Body: "BODYMARK"})
	if err == nil || !strings.HasPrefix(err.Error(), "exec adapter: exit status 3 (stderr ") || strings.Contains(err.Error(), "MARK") {
		t.Errorf("Deliver: err = %v", err)
	}
	err = Run(context.Background(), "echo SECRETMARK >&2; sleep 5", 100*time.Millisecond, nil, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "timed out after 100ms (stderr 11 bytes, sha256 ") {
		t.Errorf("timeout: err = %v", err)
	}
	if err := Run(context.Background(), "exit 4", time.Second, nil, nil); err == nil || err.Error() != "exit status 4 (no stderr)" {
		t.Errorf("no stderr: err = %v", err)
	}
}
