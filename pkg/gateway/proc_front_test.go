package gateway

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/deliver"
)

// A pane's program reads "tmux" for a moment after new-window (the
// server's forked child before its exec): never an agent to bind, even
// with a program that is one in front. Real tmux, a private server.
func TestAgentInFrontNotTmuxChild(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux not found: scripts/test-deps.sh installs it")
	}
	t.Setenv("TMUX_TMPDIR", t.TempDir())
	t.Setenv("TMUX", "")
	if out, err := exec.Command("tmux", "new-session", "-d", "-x", "80", "-y", "24", "exec sleep 60").CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("tmux", "kill-server").Run() })
	ctx := context.Background()
	var p deliver.PaneInfo
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		p, err = deliver.Probe(ctx, "%0")
		if err == nil && p.Command == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pane %%0 never ran sleep: %+v, %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !agentInFront(p) {
		t.Fatalf("sleep in front of %+v: not read as a program to bind", p)
	}
	p.Command = "tmux"
	if agentInFront(p) {
		t.Fatalf("a pane reading %q taken as an agent in front", p.Command)
	}
}
