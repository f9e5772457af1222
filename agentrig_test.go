package fleet_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
	"github.com/fleetd/fleet/internal/testsched"
	"github.com/fleetd/fleet/pkg/api"
)

// The agent CLI rig: the real Claude Code, Codex CLI and Gemini CLI
// (installed pinned from the npm registry by scripts/test-deps.sh into
// npmBin's folder), each in a real tmux pane of a tmux server of the
// test's own, talking to the stub model on loopback (internal/stubmodel),
// with a real gateway. The stub's request log is the proof of what the
// model was shown.
type agentRig struct {
	t    *testing.T
	dir  string // the test's folder: tmux's socket folder, the gateway's
	home string // HOME of the CLIs (their settings live under it)
	work string // the project folder the CLIs run in
	stub *stubmodel.Server
	gw   *testGW
}

// agentTest makes t an agent CLI test: in parallel with the scripts, one
// agent CLI at a time (each is a node program that takes most of a core
// as it starts and answers — two at once beside the broker scripts
// starved the node past its 2 s heartbeats in clean-clone runs; the rest of each test waits for
// the model stub, tmux and the gateway). Each test has its own tmux
// server, stub (its own port), HOME, project folder, gateway and socket
// (newAgentRig). Call it first.
func agentTest(t *testing.T) {
	t.Helper()
	testsched.Take(t, testsched.Need{Lane: "agent", LaneCap: 1, Long: agentLong[t.Name()]})
}

// agentBrokerTest is agentTest for a test with a second host across the
// broker node (twoHostRig): it shares the node, which an outage script
// has alone.
func agentBrokerTest(t *testing.T) {
	t.Helper()
	testsched.Take(t, testsched.Need{Lane: "agent", LaneCap: 1, Group: "node", Long: agentLong[t.Name()]})
}

// agentLong is about how long each agent CLI test takes (one run of make
// test, 2 cores): the longest start first. Only the order depends on it.
var agentLong = map[string]time.Duration{
	"TestGeminiCLI": 80 * time.Second, "TestCodex": 45 * time.Second,
	"TestGeminiHookMode": 40 * time.Second, "TestClaudeCode": 35 * time.Second,
	"TestCodexHookMode": 33 * time.Second, "TestMCPGemini": 26 * time.Second,
	"TestClaudeCodeHookAskAcrossHosts": 25 * time.Second, "TestCodexAPIError": 24 * time.Second,
	"TestGeminiHookWake": 22 * time.Second, "TestClaudeCodeHookMode": 20 * time.Second,
	"TestClaudeCodeJoinedAfterStart": 18 * time.Second, "TestClaudeCodeLoopCut": 16 * time.Second, "TestCodexHookWake": 17 * time.Second,
	"TestMCPCodex": 12 * time.Second, "TestClaudeCodeReplyAcrossHosts": 10 * time.Second,
	"TestMCPClaudeCode": 6 * time.Second, "TestOpenCode": 60 * time.Second, "TestOpenCodeReplyAcrossHosts": 20 * time.Second, "TestOpenCodeHookMode": 30 * time.Second, "TestMCPOpenCode": 20 * time.Second, "TestCopilot": 45 * time.Second, "TestAgentStartWays": 70 * time.Second,
	"TestCopilotHookMode": 25 * time.Second, "TestCopilotReplyAcrossHosts": 20 * time.Second, "TestCopilotHookWake": 30 * time.Second,
}

// agentBin is an agent CLI's executable; the test fails if it is missing
// (make test installs it).
func agentBin(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(npmBin, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is required (make test installs it: scripts/test-deps.sh): %v", name, err)
	}
	return p
}

func newAgentRig(t *testing.T, gwEnv ...string) *agentRig {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (make test installs it): ", err)
	}
	dir := t.TempDir()
	r := &agentRig{t: t, dir: dir, home: filepath.Join(dir, "home"), work: filepath.Join(dir, "project")}
	for _, d := range []string{r.home, r.work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	stub, err := stubmodel.Start("127.0.0.1:0", filepath.Join(dir, "stub.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stub.Close() })
	r.stub = stub
	// a paste's proof (the agent's busy hook) within 30s, not 15s: two
	// CLIs start and answer at once here beside the scripts, and on a
	// 2-core machine at load 25 Claude Code, just past its trust dialog,
	// showed no busy hook within 15s of a paste (a test may set its own)
	env := append([]string{"TMUX_TMPDIR=" + dir, "TMUX=", "FLEET_RETRY_BASE=100ms", "FLEET_RETRY_MAX=500ms",
		"FLEET_CONFIRM_WITHIN=30s"}, gwEnv...)
	r.gw = newTestGW(t, dir, "h1", env...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(r.gw.log())
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("the gateway's log (its end):\n%s", b)
		}
	})
	t.Cleanup(func() {
		// the panes' processes, to wait for: a CLI that writes under HOME
		// as it exits would race the removal of the test's folder
		list := exec.Command("tmux", "list-panes", "-a", "-F", "#{pane_pid}")
		list.Env = r.env()
		out, _ := list.Output()
		var pids []int
		started := map[int]string{} // each one's start time: a pid can be reused
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				for _, p := range descendants(pid) {
					pids = append(pids, p)
					started[p] = procStart(p)
				}
			}
		}
		cmd := exec.Command("tmux", "kill-server")
		cmd.Env = r.env()
		cmd.Run()
		// the hang-up ends them, most at once; one still there after 3s
		// (Gemini CLI kept running 10s after it) is killed: nothing it
		// would write as it exits can then race the removal either
		alive := func(pid int) bool { st := procStart(pid); return st != "" && st == started[pid] }
		wait := func(within time.Duration) (left []int) {
			deadline := time.Now().Add(within)
			for _, pid := range pids {
				for time.Now().Before(deadline) && alive(pid) {
					time.Sleep(50 * time.Millisecond)
				}
				if alive(pid) {
					left = append(left, pid)
				}
			}
			return left
		}
		if left := wait(3 * time.Second); len(left) > 0 {
			t.Logf("killing what the hang-up left running: %v", left)
			for _, pid := range left {
				if alive(pid) {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			wait(10 * time.Second)
		}
	})
	return r
}

// procStart is pid's start time (/proc/PID/stat), "" once it is gone.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// descendants is pid and every process below it, from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		p, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// env is the environment of the fleet commands, tmux and the CLIs: the
// built binaries and the npm tools on PATH (fleet-turn from
// scripts/hooks too), the rig's HOME, gateway and tmux server.
func (r *agentRig) env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		// nor CI's own variables: CI=true makes Gemini CLI start headless
		// (a test that wants them says so)
		if !strings.HasPrefix(kv, "FLEET_") && !strings.HasPrefix(kv, "XDG_") && !strings.HasPrefix(kv, "TMUX") &&
			!strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "PATH=") &&
			!strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "GITHUB_") {
			env = append(env, kv)
		}
	}
	wd, _ := os.Getwd()
	path := binDir + ":" + filepath.Join(wd, "scripts", "hooks") + ":" + npmBin + ":" + os.Getenv("PATH")
	env = append(env, "PATH="+path, "HOME="+r.home, "TMUX_TMPDIR="+r.dir,
		"FLEET_SOCKET="+r.gw.sock, "FLEET_HOST=h1", "FLEET_STATE_DIR="+filepath.Join(r.dir, "h1"))
	return append(env, extra...)
}

// tmux runs a tmux command on the rig's server and returns its output.
func (r *agentRig) tmux(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("tmux", args...)
	cmd.Env = r.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimRight(string(out), "\n")
}

// pane starts a tmux session named name running the shell command line
// in the project folder, with env added to its environment, and returns
// its pane id (%N).
func (r *agentRig) pane(name, line string, env ...string) string {
	r.t.Helper()
	args := []string{"new-session", "-d", "-s", name, "-x", "200", "-y", "50", "-c", r.work, "-P", "-F", "#{pane_id}"}
	for _, kv := range env {
		args = append(args, "-e", kv)
	}
	return r.tmux(append(args, line)...)
}

// screen is what pane shows now, with its history.
func (r *agentRig) screen(pane string) string {
	r.t.Helper()
	return r.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", pane)
}

// waitScreen waits until pane's screen matches re, and returns it.
func (r *agentRig) waitScreen(pane, re string, within time.Duration) string {
	r.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for {
		s := r.screen(pane)
		if rx.MatchString(s) {
			return s
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("pane %s never showed %q within %v; it shows:\n%s", pane, re, within, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logMark is where the gateway's log ends now: waitLog after it sees only
// what the gateway logs from now on.
func (r *agentRig) logMark() int {
	b, _ := os.ReadFile(r.gw.log())
	return len(b)
}

// waitLog waits until a line the gateway logged after mark matches re:
// the gateway's sentinels (a message held, a screen not read as idle,
// nothing waiting for a notice) say that it saw a state and chose not to
// act, so a check that nothing happened may follow at once.
func (r *agentRig) waitLog(mark int, re string, within time.Duration) {
	r.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for {
		b, _ := os.ReadFile(r.gw.log())
		if len(b) > mark && rx.Match(b[mark:]) {
			return
		}
		if time.Now().After(deadline) {
			tail := b[min(mark, len(b)):]
			if len(tail) > 4000 {
				tail = tail[len(tail)-4000:]
			}
			r.t.Fatalf("the gateway never logged %q within %v; its log since:\n%s", re, within, tail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fleet runs a fleet command (fleet-send, fleet-roster, ...) and returns
// its stdout; a non-zero exit fails the test with its stderr.
func (r *agentRig) fleet(name string, args ...string) string {
	r.t.Helper()
	out, errOut, err := r.fleetTry(name, args...)
	if err != nil {
		r.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, errOut)
	}
	return out
}

// fleetTry runs a fleet command and returns stdout, stderr and its error.
func (r *agentRig) fleetTry(name string, args ...string) (string, string, error) {
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = r.env()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// waitTurns waits until the stub has seen n turns of the agent and returns
// them.
func (r *agentRig) waitTurns(n int, within time.Duration) []stubmodel.Request {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		turns := r.stub.Turns()
		if len(turns) >= n {
			return turns
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the model saw %d turn(s), want %d, within %v; all requests: %+v", len(turns), n, within, r.stub.Requests())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStatus waits until the roster reads entity name in status.
func (r *agentRig) waitStatus(name, status string, within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	// the roster asked over one connection of its own, not by a
	// fleet-roster process every 100 ms: the agent tests wait here for
	// minutes in all, and a process per look was CPU the CLIs need
	var c *api.Client
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	var last string
	for {
		if c == nil {
			c, _ = api.Dial(r.gw.sock)
		}
		if c != nil {
			resp, err := c.Call(&api.RosterRequest{})
			if err != nil {
				c.Close()
				c, last = nil, err.Error()
			} else {
				var rows []string
				for _, e := range resp.Entities {
					if e.Name == name && e.Status == status {
						return
					}
					rows = append(rows, fmt.Sprintf("%s@%s %s %s", e.Name, e.Host, e.Status, e.StatusReason))
				}
				last = strings.Join(rows, "\n")
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s never read %s within %v; roster:\n%s", name, status, within, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gatedPane starts a pane whose shell waits for a go signal before it
// runs line (exec'd, so the agent is the pane's first process): the test
// joins the pane first, as a user who joins and then starts the agent
// does. It returns the pane id and the function that gives the signal.
func (r *agentRig) gatedPane(name, line string, env ...string) (pane string, start func()) {
	r.t.Helper()
	gate := filepath.Join(r.dir, name+".go")
	pane = r.pane(name, "while [ ! -e "+gate+" ]; do sleep 0.05; done; "+line, env...)
	return pane, func() {
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			r.t.Fatal(err)
		}
	}
}
