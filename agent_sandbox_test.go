package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A fleet command run inside Codex's own sandbox (codex sandbox, as its
// tool calls run under sandbox_mode = "workspace-write") cannot connect to
// the gateway's socket: it says a sandbox refused it, with a hint — not
// that the gateway belongs to another user, which would send the user the
// wrong way.
func TestCodexSandboxRefusesSocket(t *testing.T) {
	agentTest(t)
	codex := agentBin(t, "codex")
	r := newAgentRig(t)
	home := filepath.Join(r.dir, "codex-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"workspace-write", "read-only"} {
		cmd := exec.Command(codex, "sandbox", "-c", `sandbox_mode="`+mode+`"`, filepath.Join(binDir, "fleet-roster"), "--json")
		cmd.Dir = r.work
		cmd.Env = r.env("CODEX_HOME=" + home)
		out, err := cmd.CombinedOutput()
		if code := exitCode(err); code != 77 || !strings.Contains(string(out), `"kind":"sandboxed"`) ||
			!strings.Contains(string(out), "a sandbox refused it") || strings.Contains(string(out), "another user") {
			t.Errorf("%s: fleet-roster in Codex's sandbox: exit %d\n%s", mode, code, out)
		}
	}
	// and outside it, the same command reaches the gateway
	if _, errOut, err := r.fleetTry("fleet-roster", "--json"); err != nil {
		t.Fatalf("fleet-roster outside the sandbox: %v %s", err, errOut)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
