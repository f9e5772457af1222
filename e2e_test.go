package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// A real fleet-gw for the Go end-to-end tests (the scripts have their own
// "gw" command): its own host id, state folder and socket under dir.
type testGW struct {
	t      *testing.T
	dir    string
	sock   string
	env    []string
	cmd    *exec.Cmd
	waited bool
}

func newTestGW(t *testing.T, dir, host string, extra ...string) *testGW {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLEET_") && !strings.HasPrefix(kv, "XDG_") {
			env = append(env, kv)
		}
	}
	sock := filepath.Join(dir, host+".sock")
	env = append(env, "FLEET_HOST="+host, "FLEET_STATE_DIR="+filepath.Join(dir, host),
		"FLEET_SOCKET="+sock, "XDG_CONFIG_HOME="+dir,
		// these tests send one recipient hundreds a minute; pair-rate
		// has its own (pair_rate.txtar): off unless a test sets it
		"FLEET_PAIR_RATE=0")
	g := &testGW{t: t, dir: dir, sock: sock, env: append(env, extra...)}
	g.start()
	t.Cleanup(g.kill)
	t.Cleanup(func() { // runs first: the gateway still up
		if t.Failed() {
			b, _ := os.ReadFile(g.log())
			t.Logf("%s's log, its last lines:\n%s", host, lastLines(b, 80))
		}
	})
	return g
}

func (g *testGW) log() string { return filepath.Join(g.dir, filepath.Base(g.sock)+".log") }

// start runs the gateway and waits until its socket answers.
func (g *testGW) start() {
	g.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "fleet-gw"), "run")
	cmd.Env = g.env
	logf, err := os.OpenFile(g.log(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	g.cmd, g.waited = cmd, false
	for i := 0; ; i++ {
		if c, err := api.Dial(g.sock); err == nil {
			c.Close()
			return
		}
		if i == 400 {
			g.kill()
			b, _ := os.ReadFile(g.log())
			g.t.Fatalf("the gateway did not answer; log:\n%s", b)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// kill stops the gateway with SIGKILL (nothing flushed, nothing drained).
func (g *testGW) kill() {
	if g.cmd == nil || g.waited {
		return
	}
	g.cmd.Process.Kill()
	g.cmd.Wait()
	g.waited = true
}

func (g *testGW) dial(token string) *api.Client {
	g.t.Helper()
	c, err := api.Dial(g.sock)
	if err != nil {
		g.t.Fatal(err)
	}
	c.Token = token
	return c
}

func (g *testGW) join(name string) string {
	g.t.Helper()
	c := g.dial("")
	defer c.Close()
	resp, err := c.Call(&api.JoinRequest{Name: name, Mode: "pull"})
	if err != nil {
		g.t.Fatalf("join %s: %v", name, err)
	}
	return resp.Token
}

// enrolGWs enrols the gateways with each other the way the README tells an
// operator: `fleet-gw key` on each, `fleet-gw trust add` of that line on
// every other (the running gateways reread their trust files).
func enrolGWs(t *testing.T, gws ...*testGW) {
	t.Helper()
	run := func(g *testGW, args ...string) string {
		cmd := exec.Command(filepath.Join(binDir, "fleet-gw"), args...)
		cmd.Env = g.env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("fleet-gw %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	for _, g := range gws {
		line := run(g, "key")
		for _, o := range gws {
			if o != g {
				run(o, "trust", "add", line)
			}
		}
	}
}
