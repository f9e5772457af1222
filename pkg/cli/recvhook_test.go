package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
)

func hookBatchOf(bodies ...string) []api.Delivery {
	var out []api.Delivery
	for i, b := range bodies {
		out = append(out, api.Delivery{Envelope: &envelope.Envelope{Kind: envelope.Send, MsgID: fmt.Sprintf("m%d", i),
			Sender: envelope.Party{Name: "alice", Host: "h1"}, Body: b}})
	}
	return out
}

// One hook's output stays under the limit, whatever waits: the messages
// that do not fit wait, in order, for the next hook and are not
// acknowledged; a long body is a pointer; a message already handed into
// this conversation is acknowledged and not shown again.
func TestPickHookBudget(t *testing.T) {
	dir := t.TempDir()
	frame := func(env *envelope.Envelope) (string, error) { return hookFrame(dir, env) }
	none := func(string) bool { return false }
	for _, cliName := range []string{"claude", "codex", "gemini"} {
		for ev, shape := range hookShapes[cliName] {
			// 1.5 KB bodies: five fit in 9,000 characters, not sixteen
			bodies := make([]string, 16)
			for i := range bodies {
				bodies[i] = strings.Repeat(fmt.Sprintf("%x", i), 1500)
			}
			d := pickHook(shape, hookBatchOf(bodies...), none, frame, io.Discard)
			if len(d.out) > hookLimit || len(d.out) > 10000 {
				t.Errorf("%s %s: %d bytes out", cliName, ev, len(d.out))
			}
			if len(d.handed) == 0 || len(d.handed) == 16 || d.left != 16-len(d.handed) {
				t.Errorf("%s %s: handed %d, left %d", cliName, ev, len(d.handed), d.left)
			}
			for i, id := range d.acks {
				if id != fmt.Sprintf("m%d", i) {
					t.Errorf("%s %s: acks %v are not the oldest in order", cliName, ev, d.acks)
				}
			}
			if shape.wake { // plain text on stderr
				if !strings.HasPrefix(string(d.out), hookIntro) || !strings.Contains(string(d.out), "more fleet message(s) wait") {
					t.Errorf("%s %s: %s", cliName, ev, d.out)
				}
				continue
			}
			var v map[string]any
			if err := json.Unmarshal(d.out, &v); err != nil {
				t.Fatalf("%s %s: not JSON: %v", cliName, ev, err)
			}
			text := fmt.Sprint(v["reason"])
			if !shape.stop {
				text = v["hookSpecificOutput"].(map[string]any)["additionalContext"].(string)
				if v["hookSpecificOutput"].(map[string]any)["hookEventName"] != shape.event {
					t.Errorf("%s %s: %s", cliName, ev, d.out)
				}
			} else if v["decision"] != shape.block {
				t.Errorf("%s %s: %s", cliName, ev, d.out)
			}
			if !strings.Contains(text, fmt.Sprintf("(%d more fleet message(s) wait", d.left)) {
				t.Errorf("%s %s: no line for the %d waiting: %s", cliName, ev, d.left, text)
			}
		}
	}

	// a 50 KiB body: a pointer to a private file holding it whole
	big := strings.Repeat("y", 50<<10)
	d := pickHook(hookShapes["claude"]["tool"], hookBatchOf(big), none, frame, io.Discard)
	if len(d.handed) != 1 || len(d.out) > 1000 || !strings.Contains(string(d.out), "a body of 51200 bytes") {
		t.Fatalf("50 KiB: handed %v, %d bytes: %s", d.handed, len(d.out), d.out)
	}
	path := filepath.Join(dir, "hook-bodies", hookFileName("m0")+".txt")
	if b, err := os.ReadFile(path); err != nil || string(b) != big || !strings.Contains(string(d.out), path) {
		t.Fatalf("the pointer's file %s: %v (%d bytes); out %s", path, err, len(b), d.out)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s is %v", path, fi.Mode())
	}

	// seen in this conversation: acknowledged, not shown
	d = pickHook(hookShapes["claude"]["prompt"], hookBatchOf("old", "new"), func(id string) bool { return id == "m0" }, frame, io.Discard)
	if strings.Join(d.acks, ",") != "m0,m1" || strings.Join(d.handed, ",") != "m1" || strings.Contains(string(d.out), "old") {
		t.Fatalf("seen m0: acks %v handed %v out %s", d.acks, d.handed, d.out)
	}
	if !strings.Contains(string(d.out), deliver.FrameOpen+"alice@h1 · msg m1 · send]") {
		t.Errorf("out %s", d.out)
	}
}

// The seen file of a session survives the hook process.
func TestSeenFile(t *testing.T) {
	dir := t.TempDir()
	s := openSeen(dir, "sess-1")
	if err := s.add([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	s2 := openSeen(dir, "sess-1")
	if !s2.has("a") || !s2.has("b") || s2.has("c") || openSeen(dir, "sess-2").has("a") {
		t.Fatal("seen file not per session")
	}
}
