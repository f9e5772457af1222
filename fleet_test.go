// End-to-end tests: the real binaries, built once, against real gateways
// in temporary folders (and a real tmux for the inject tests). The scripts
// are in testdata/script; the commands they use beyond testscript's own are
// defined below, in broker_test.go and inject_test.go, and (the waits and
// the helpers that replace shell plumbing) in scriptcmds_test.go.
package fleet_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/rogpeppe/go-internal/testscript"
)

var binDir string

func TestMain(m *testing.M) {
	// the scripts and the agent CLI tests run beside each other, -parallel
	// N at a time, two agent CLIs at most (agentTest); a test waiting for
	// its turn holds no place (internal/testsched)
	testsched.Main()
	dir, err := os.MkdirTemp("", "fleet-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// built as make build does; FLEET_TEST_RACE=1 builds them with the race
	// detector instead (reports go where GORACE=log_path=... says)
	args := []string{"build", "-trimpath", "-tags", "urfave_cli_no_docs", "-o", dir + "/", "./cmd/..."}
	args = append(args, "./scripts/internal/pasterec") // a pane program for inject_hostile
	args = append(args, "./scripts/internal/fakegw")   // another user's socket, for private_state
	cgo := "CGO_ENABLED=0"
	if os.Getenv("FLEET_TEST_RACE") == "1" {
		args = append(args[:1], append([]string{"-race"}, args[1:]...)...)
		cgo = "CGO_ENABLED=1"
	}
	build := exec.Command("go", args...)
	build.Env = append(os.Environ(), cgo)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	// the broker tests' vhosts are removed in the background, beside the
	// next tests, and waited for here
	waitDrops := testnode.DropLater()
	code := m.Run()
	waitDrops()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestScripts runs beside the agent CLI tests: each script waits for its
// place in setup.
func TestScripts(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (make test installs it): ", err)
	}
	if _, err := os.Stat(filepath.Join(npmBin, "mcp-inspector")); err != nil {
		t.Fatal("the MCP Inspector is required (make test installs it: scripts/test-deps.sh): ", err)
	}
	testscript.Run(t, testscript.Params{
		Dir:   "testdata/script",
		Setup: setup,
		Cmds: map[string]func(*testscript.TestScript, bool, []string){
			"gw":       cmdGateway,
			"waitfor":  cmdWaitFor,
			"rawframe": cmdRawFrame,
			"lines":    cmdLines,
			"host":     cmdHost,
			"enrol":    cmdEnrol,
			"broker":   cmdBroker,
			"amqp":     cmdAMQP,
			"proxy":    cmdProxy,
			"tmpfs":    cmdTmpfs,
			"pasted":   cmdPasted,
			// scriptcmds_test.go
			"eventually": cmdEventually,
			"recv":       cmdRecv,
			"exitcode":   cmdExitCode,
			"extract":    cmdExtract,
			"expand":     cmdExpand,
			"jsonlines":  cmdJSONLines,
			"metrics":    cmdMetrics, // metrics_script_test.go
			"mcp":        cmdMCP,     // mcp_test.go
			"mcptool":    cmdMCPTool, // mcp_test.go
		},
	})
}

// gateways started by a script, by name, so "gw stop NAME" finds them.
type gateways struct {
	mu    sync.Mutex
	procs map[string]*gwProc
}

type gwProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	from int64 // where this run's lines begin in its log
}

func setup(env *testscript.Env) error {
	work := env.WorkDir
	name := filepath.Base(work)[len("script-"):]
	// its place (given back last: the first deferred runs last); the
	// broker scripts share the node, an outage script has it alone
	need := testsched.Need{Long: scriptLong[name]}
	if strings.HasPrefix(name, "broker_") || strings.HasPrefix(name, "outage_") {
		need.Group, need.Alone = "node", strings.HasPrefix(name, "outage_")
	}
	start := time.Now()
	env.Defer(testsched.Acquire(need))
	testsched.LogWait(env.T(), time.Since(start))
	env.Setenv("PATH", binDir+string(os.PathListSeparator)+npmBin+string(os.PathListSeparator)+os.Getenv("PATH"))
	env.Setenv("HOME", work)
	env.Setenv("XDG_CONFIG_HOME", work+"/.config")
	env.Setenv("XDG_STATE_HOME", work+"/.state")
	env.Setenv("XDG_RUNTIME_DIR", "")
	env.Setenv("FLEET_HOST", "h1")
	env.Setenv("FLEET_STATE_DIR", work+"/state")
	if wd, err := os.Getwd(); err == nil {
		env.Setenv("REPO", wd) // the repository: scripts/ shipped with fleet
	}
	env.Setenv("FLEET_SOCKET", work+"/gw.sock")
	env.Setenv("FLEET_RETRY_BASE", "50ms")
	env.Setenv("FLEET_RETRY_MAX", "200ms")
	env.Setenv("FLEET_SETTLE_DELAY", "50ms")
	env.Setenv("FLEET_DRAIN_TIMEOUT", "3s")
	// each script gets its own tmux server
	env.Setenv("TMUX_TMPDIR", work)
	env.Setenv("TMUX", "")
	setupMCP(env)
	g := &gateways{procs: map[string]*gwProc{}}
	env.Values["gw"] = g
	env.Values["proxies"] = map[string]*proxy{}
	env.Defer(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, p := range g.procs {
			p.cmd.Process.Kill()
			<-p.done
		}
		tm := exec.Command("tmux", "kill-server")
		tm.Env = append(os.Environ(), "TMUX_TMPDIR="+work)
		tm.Run()
	})
	return setupBroker(env, name)
}

// scriptLong is about how long the longest scripts take (one run of make
// test, 2 cores): they start first. Only the order depends on it.
var scriptLong = map[string]time.Duration{
	"outage_broker": 50 * time.Second, "broker_setup": 45 * time.Second,
	"completion": 40 * time.Second, "broker_spawn": 40 * time.Second,
	"broker_opcert": 35 * time.Second, "broker_refusal_stale": 30 * time.Second,
	"broker_unknown": 30 * time.Second, "broker_dlq": 30 * time.Second,
	"broker_mcp_inspector": 25 * time.Second, "broker_trust": 25 * time.Second,
	"broker_exclusive": 25 * time.Second, "broker_diskfull": 25 * time.Second,
	"hook_wake": 25 * time.Second, "mcp_inspector": 20 * time.Second,
	"broker_backpressure_starved": 20 * time.Second,
	"inject_states":               20 * time.Second,
}

func scriptEnv(ts *testscript.TestScript) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FLEET_") {
			continue
		}
		env = append(env, kv)
	}
	// every configuration variable fleet knows (config.Keys), so a script
	// can set any of them, and the few the tests add
	keys := []string{"PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
		"TMUX_TMPDIR", "TMUX", "FLEET_CONFIG", "FLEET_CRASHPOINT", "FLEET_DLQ_BROKER"}
	for _, k := range config.Keys {
		keys = append(keys, k.Env)
	}
	for _, k := range keys {
		if v := ts.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// gw start [NAME] — start fleet-gw run in the background (log in
// $WORK/NAME.log) and wait until its socket answers hello.
// gw stop [NAME] — SIGTERM and wait for a clean exit.
// gw kill [NAME] — SIGKILL (kill -9) and wait.
// gw wait [NAME] — wait for the gateway to die on its own (a crash point,
// a refusal to serve); print "exit: CODE".
// gw abort [NAME] — SIGTERM twice; print how it ended.
// gw freeze [NAME] / gw thaw [NAME] — SIGSTOP / SIGCONT: a gateway
// starved of CPU (its sockets stay open, nothing it holds moves).
func cmdGateway(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: gw start|connected|stop|kill|wait|abort|freeze|thaw [NAME]")
	}
	name := "gw"
	if len(args) > 1 {
		name = args[1]
	}
	g := ts.Value("gw").(*gateways)
	g.mu.Lock()
	p := g.procs[name]
	g.mu.Unlock()
	switch args[0] {
	case "start":
		if p != nil {
			select {
			case <-p.done:
			default:
				ts.Fatalf("gateway %s is already running", name)
			}
		}
		logf, err := os.OpenFile(ts.MkAbs(name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		ts.Check(err)
		// a restart appends to the log of the run before: only what this
		// run writes, from here on, tells whether it tried the broker
		from, err := logf.Seek(0, io.SeekEnd)
		ts.Check(err)
		cmd := exec.Command(filepath.Join(binDir, "fleet-gw"), "run")
		cmd.Env = scriptEnv(ts)
		cmd.Dir = ts.Getenv("WORK")
		cmd.Stdout, cmd.Stderr = logf, logf
		ts.Check(cmd.Start())
		p = &gwProc{cmd: cmd, done: make(chan struct{}), from: from}
		go func() { p.err = cmd.Wait(); logf.Close(); close(p.done) }()
		g.mu.Lock()
		g.procs[name] = p
		g.mu.Unlock()
		sock := ts.Getenv("FLEET_SOCKET")
		deadline := time.Now().Add(15 * time.Second)
		for {
			select {
			case <-p.done:
				log, _ := os.ReadFile(ts.MkAbs(name + ".log"))
				if neg {
					return
				}
				ts.Fatalf("gateway %s exited at start: %v\n%s", name, p.err, log)
			default:
			}
			if c, err := api.Dial(sock); err == nil && c.Hello.Pid == cmd.Process.Pid {
				c.Close()
				if neg {
					// this run's log, and the others' ends: who held what
					others := ""
					logs, _ := filepath.Glob(ts.MkAbs("*.log"))
					for _, l := range logs {
						if filepath.Base(l) != name+".log" {
							b, _ := os.ReadFile(l)
							others += fmt.Sprintf("\n%s, its last lines:\n%s", filepath.Base(l), lastLines(b, 20))
						}
					}
					ts.Fatalf("gateway %s started, but should not have; its log:\n%s%s", name, runLog(ts, name, from), others)
				}
				// with a broker, also wait for the first attempt to reach it
				// (connected or not), so scripts start from a known state
				if ts.Getenv("FLEET_BROKER") == "" {
					return
				}
				for time.Now().Before(deadline) {
					log := runLog(ts, name, from)
					if bytes.Contains(log, []byte(`"broker connected"`)) || bytes.Contains(log, []byte(`"broker unreachable"`)) {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				ts.Fatalf("gateway %s never tried the broker", name)
			}
			if time.Now().After(deadline) {
				ts.Fatalf("gateway %s did not answer on %s within 15s", name, sock)
			}
			time.Sleep(20 * time.Millisecond)
		}
	case "abort":
		// two SIGTERMs: the first starts the drain, the second aborts it
		if p == nil {
			ts.Fatalf("no gateway %s", name)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
		time.Sleep(200 * time.Millisecond)
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			ts.Fatalf("gateway %s did not abort on the second signal", name)
		}
		fmt.Fprintln(ts.Stdout(), p.err)
	case "connected":
		// this run of the gateway holds its connection to the broker (a
		// first attempt that found it unreachable let gw start return)
		if p == nil {
			ts.Fatalf("no gateway %s", name)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			log := runLog(ts, name, p.from)
			if bytes.Contains(log, []byte(`"broker connected"`)) || bytes.Contains(log, []byte(`"broker connection restored"`)) {
				return
			}
			if time.Now().After(deadline) {
				ts.Fatalf("gateway %s did not connect to the broker within 30s; its log:\n%s", name, log)
			}
			time.Sleep(20 * time.Millisecond)
		}
	case "freeze", "thaw":
		if p == nil {
			ts.Fatalf("no gateway %s", name)
		}
		sig := syscall.SIGSTOP
		if args[0] == "thaw" {
			sig = syscall.SIGCONT
		}
		ts.Check(p.cmd.Process.Signal(sig))
	case "stop", "kill", "wait":
		if p == nil {
			ts.Fatalf("no gateway %s", name)
		}
		switch args[0] {
		case "stop":
			p.cmd.Process.Signal(syscall.SIGTERM)
		case "kill":
			p.cmd.Process.Signal(syscall.SIGKILL)
		}
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			ts.Fatalf("gateway %s did not exit", name)
		}
		if args[0] == "stop" && p.err != nil && !neg {
			ts.Fatalf("gateway %s exited with %v", name, p.err)
		}
		if args[0] == "wait" { // how it ended, for the script to check
			fmt.Fprintln(ts.Stdout(), "exit:", p.cmd.ProcessState.ExitCode())
		}
	default:
		ts.Fatalf("unknown gw command %q", args[0])
	}
}

// runLog is what the run of gateway name that began at from wrote to
// its log (a restart appends to the log of the run before).
func runLog(ts *testscript.TestScript, name string, from int64) []byte {
	log, _ := os.ReadFile(ts.MkAbs(name + ".log"))
	return log[min(from, int64(len(log))):]
}

// lastLines is the last n lines of b.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitfor FILE REGEXP [TIMEOUT] — wait until FILE matches REGEXP (default
// 15s). Delivery is asynchronous; this polls instead of sleeping blindly.
func cmdWaitFor(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: waitfor FILE REGEXP [TIMEOUT]")
	}
	re := regexp.MustCompile(args[1])
	limit := 15 * time.Second
	if len(args) > 2 {
		d, err := time.ParseDuration(args[2])
		ts.Check(err)
		limit = d
	}
	deadline := time.Now().Add(limit)
	for {
		data, _ := os.ReadFile(ts.MkAbs(args[0]))
		if re.Match(data) != neg {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s: no match for %q within %v; content:\n%s", args[0], args[1], limit, data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lines FILE N — FILE has exactly N lines.
func cmdLines(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: lines FILE N")
	}
	data, err := os.ReadFile(ts.MkAbs(args[0]))
	if err != nil && !os.IsNotExist(err) {
		ts.Fatalf("%v", err)
	}
	n := bytes.Count(data, []byte("\n"))
	if (fmt.Sprint(n) == args[1]) == neg {
		ts.Fatalf("%s has %d lines (want %s%s):\n%s", args[0], n, map[bool]string{true: "not ", false: ""}[neg], args[1], data)
	}
}

// rawframe KIND — speak raw bytes to the gateway socket and print its
// reply frame (or "closed") on stdout. KIND: garbage, oversize, truncated,
// badjson, noop, nohello, badutf8, badproto.
func cmdRawFrame(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: rawframe KIND")
	}
	c, err := net.Dial("unix", ts.Getenv("FLEET_SOCKET"))
	ts.Check(err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	frame := func(b []byte) []byte {
		out := make([]byte, 4+len(b))
		binary.BigEndian.PutUint32(out, uint32(len(b)))
		copy(out[4:], b)
		return out
	}
	hello := frame([]byte(`{"op":"hello","proto":1}`))
	var payload []byte
	switch args[0] {
	case "garbage":
		payload = []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	case "oversize":
		payload = append(hello, 0x40, 0, 0, 0) // a 1 GiB frame
	case "truncated":
		payload = append(hello, append([]byte{0, 0, 0, 100}, []byte(`{"op":"ro`)...)...)
	case "badjson":
		payload = append(hello, frame([]byte(`{"op": roster`))...)
	case "noop":
		payload = append(hello, frame([]byte(`{"token":"x"}`))...)
	case "nohello":
		payload = frame([]byte(`{"op":"roster"}`))
	case "badutf8":
		payload = append(hello, frame([]byte("{\"op\":\"send\",\"body\":\"\xff\xfe\"}"))...)
	case "badproto":
		payload = frame([]byte(`{"op":"hello","proto":99}`))
	default:
		ts.Fatalf("unknown rawframe kind %q", args[0])
	}
	_, err = c.Write(payload)
	ts.Check(err)
	if args[0] == "truncated" {
		c.(*net.UnixConn).CloseWrite()
	}
	r := bufio.NewReader(c)
	for {
		data, err := api.ReadFrame(r, 1<<20)
		if err == io.EOF {
			fmt.Fprintln(ts.Stdout(), "closed")
			return
		}
		if err != nil {
			fmt.Fprintln(ts.Stdout(), "closed:", err)
			return
		}
		fmt.Fprintln(ts.Stdout(), string(data))
	}
}

// tmpfs DIR SIZE — mount a small tmpfs on DIR (unmounted at the end): a
// disk that fills up. The tests run as root (make test installs packages).
func cmdTmpfs(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: tmpfs DIR SIZE")
	}
	dir := ts.MkAbs(args[0])
	ts.Check(os.MkdirAll(dir, 0o700))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+args[1]+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		ts.Fatalf("mounting a tmpfs (needs root): %v\n%s", err, out)
	}
	ts.Defer(func() { exec.Command("umount", "-l", dir).Run() })
}
