package fleet_test

import (
	"bufio"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"
)

// TestReadmeChecklist runs the README's multi-host checklist ("## Three
// hosts: the checklist") as written: every "MACHINE$ COMMAND" line of its
// sh blocks, in order, each machine a real bash of its own (its own HOME,
// so its own config file and state folder; its exports and background
// gateway stay), against the private node over amqps with client
// certificates. What it substitutes, and only that:
//   - the broker address amqps://broker.internal:5671/fleet becomes the
//     node's TLS listener and a vhost of this test's;
//   - the files the checklist says the operator holds (ca.pem and
//     buildN.pem / buildN.key) are the node's CA and client certificate;
//   - ssh HOST COMMAND runs COMMAND on HOST's machine (its HOME), by a
//     shim on the operator's PATH;
//   - rabbitmqctl is the node's (FLEET_RABBITMQCTL on broker$).
//
// A line must succeed (exit 0); a line whose comment quotes 'TEXT' must
// print TEXT. Three hosts joined from bundles end messaging each other,
// set up in at most five commands, no bundle ever written to a disk.
func TestReadmeChecklist(t *testing.T) {
	testsched.Take(t, testsched.Need{Group: "node"})
	steps := readmeChecklist(t)
	brokerLock.RLock()
	defer brokerLock.RUnlock()
	unlock, err := testnode.Lock(false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	const vhost = "t-readme-checklist"
	if _, drop, err := testnode.Vhost(vhost); err != nil {
		t.Fatal(err)
	} else {
		defer drop()
	}
	tlsURL, err := testnode.Node("tls-url")
	if err != nil {
		t.Fatal(err)
	}
	tlsDir, err := testnode.Node("tls-dir")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(strings.TrimSpace(string(tlsURL)) + vhost)
	if err != nil {
		t.Fatal(err)
	}
	u.User = nil // broker-setup makes each host's own login
	brokerURL := u.String()
	tls := strings.TrimSpace(string(tlsDir))

	work := t.TempDir()
	cp := func(from, to string) {
		data, err := os.ReadFile(filepath.Join(tls, from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, to), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cp("ca.pem", "ca.pem")
	for _, h := range []string{"build1", "build2", "build3"} {
		cp("client.pem", h+".pem")
		cp("client.key", h+".key")
	}
	ctl := ""
	if node, err := testnode.Script(); err == nil {
		ctl = node + " ctl"
		var pin []string
		for _, k := range []string{"FLEET_RMQ_NODE", "FLEET_RMQ_DIR", "FLEET_RMQ_PORT"} {
			if v := os.Getenv(k); v != "" {
				pin = append(pin, k+"="+v)
			}
		}
		if len(pin) > 0 {
			ctl = "env " + strings.Join(pin, " ") + " " + ctl
		}
	}

	// ssh HOST COMMAND, as the checklist's operator runs it: COMMAND in
	// that machine's shell environment (its HOME), its output back
	sshDir := filepath.Join(work, ".ssh-bin")
	if err := os.MkdirAll(sshDir, 0o700); err != nil {
		t.Fatal(err)
	}
	shim := "#!/bin/bash\n# the README checklist's ssh HOST COMMAND, on this machine: HOST's HOME\n" +
		"h=$1; shift\ncd " + work + " && HOME=" + work + "/$h exec bash --noprofile --norc -c \"$*\"\n"
	if err := os.WriteFile(filepath.Join(sshDir, "ssh"), []byte(shim), 0o700); err != nil {
		t.Fatal(err)
	}

	machines := map[string]*machineShell{}
	defer func() {
		for name, m := range machines {
			m.close()
			if log, err := os.ReadFile(filepath.Join(m.home, "fleet-gw.log")); err == nil && t.Failed() {
				t.Logf("%s's gateway log:\n%s", name, log)
			}
		}
	}()
	setup := 0 // the commands before the first wait for a gateway: the set-up
	for _, s := range steps {
		if strings.Contains(s.cmd, "until fleet-gw status") {
			break
		}
		setup++
	}
	if setup > 5 {
		t.Errorf("README checklist: three hosts take %d commands to set up, not at most 5", setup)
	}
	quoted := regexp.MustCompile(`#.*'([^']+)'`)
	for i, s := range steps {
		m := machines[s.machine]
		if m == nil {
			env := []string{"PATH=" + binDir + ":/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "TMPDIR=" + os.TempDir()}
			if s.machine == "broker" || s.machine == "ops" { // ops reaches the broker's rabbitmqctl, and the hosts by ssh
				env = append(env, "FLEET_RABBITMQCTL="+ctl)
			}
			if s.machine == "ops" {
				env[0] = "PATH=" + sshDir + ":" + binDir + ":/usr/local/bin:/usr/bin:/bin"
			}
			m = startMachine(t, s.machine, work, env)
			machines[s.machine] = m
		}
		line := strings.ReplaceAll(s.cmd, "amqps://broker.internal:5671/fleet", brokerURL)
		out, rc := m.run(t, line, 2*time.Minute)
		t.Logf("step %d %s$ %s\n%s", i+1, s.machine, s.cmd, out)
		if rc != 0 {
			t.Fatalf("README checklist, %s$ %s: exit %d\n%s", s.machine, s.cmd, rc, out)
		}
		if q := quoted.FindStringSubmatch(s.cmd); q != nil && !strings.Contains(out, q[1]) {
			t.Fatalf("README checklist, %s$ %s: the output has no %q:\n%s", s.machine, s.cmd, q[1], out)
		}
	}
	// the join installed what the bundle held: nothing else was set up;
	// the peers were admitted by the certificates the bundles carried,
	// over amqps with a client certificate
	for _, h := range []string{"build1", "build2", "build3"} {
		log, _ := os.ReadFile(filepath.Join(work, h, "fleet-gw.log"))
		for _, want := range []string{`"msg":"host admitted by its operator certificate"`, `"msg":"broker connected"`, `amqps://`} {
			if !strings.Contains(string(log), want) {
				t.Errorf("%s's gateway log has no %s:\n%s", h, want, log)
			}
		}
		if bundles, _ := filepath.Glob(filepath.Join(work, "*bundle*")); len(bundles) > 0 {
			t.Errorf("a bundle was written to a disk: %v", bundles)
		}
		conf := filepath.Join(work, h, ".config", "fleet", "config")
		fi, err := os.Stat(conf)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s's config file: %v %v", h, fi, err)
		}
	}
}

type checklistStep struct{ machine, cmd string }

// readmeChecklist reads the checklist's command lines from README.md.
func readmeChecklist(t *testing.T) []checklistStep {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	const head = "## Three hosts: the checklist\n"
	i := strings.Index(text, head)
	if i < 0 {
		t.Fatalf("README.md has no %q section", strings.TrimSpace(head))
	}
	text = text[i+len(head):]
	if j := strings.Index(text, "\n## "); j >= 0 {
		text = text[:j]
	}
	prompt := regexp.MustCompile(`^(broker|ops|build[0-9])\$ (.+)$`)
	var steps []checklistStep
	in := false
	for _, raw := range strings.Split(text, "\n") {
		l := strings.TrimSpace(raw)
		switch {
		case strings.HasPrefix(l, "```sh"):
			in = true
		case strings.HasPrefix(l, "```"):
			in = false
		case in && l != "":
			m := prompt.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("README checklist line %q does not start with the machine it runs on (MACHINE$ )", l)
			}
			steps = append(steps, checklistStep{m[1], m[2]})
		}
	}
	if len(steps) < 8 {
		t.Fatalf("README checklist: %d command lines", len(steps))
	}
	return steps
}

// machineShell is one machine of the checklist: a bash reading commands
// on its stdin, in its own process group (its background gateway too).
type machineShell struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	home string
	n    int
}

func startMachine(t *testing.T, name, work string, env []string) *machineShell {
	home := filepath.Join(work, name)
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir = work
	cmd.Env = append(env, "HOME="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); pw.Close() }()
	return &machineShell{cmd: cmd, in: in, out: bufio.NewReader(pr), home: home}
}

// run runs one line and returns what it printed and its exit code; -1 if
// it did not end within limit.
func (m *machineShell) run(t *testing.T, line string, limit time.Duration) (string, int) {
	m.n++
	mark := fmt.Sprintf("__checklist_done_%d__", m.n)
	if _, err := fmt.Fprintf(m.in, "{ %s\n} </dev/null\n__rc=$?; echo; echo %s $__rc\n", line, mark); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	type result struct {
		out string
		rc  int
	}
	done := make(chan result, 1)
	go func() {
		var b strings.Builder
		for {
			l, err := m.out.ReadString('\n')
			if strings.HasPrefix(l, mark+" ") {
				var rc int
				fmt.Sscanf(strings.TrimPrefix(l, mark+" "), "%d", &rc)
				done <- result{strings.TrimSuffix(b.String(), "\n"), rc}
				return
			}
			b.WriteString(l)
			if err != nil {
				done <- result{b.String(), -2}
				return
			}
		}
	}()
	select {
	case r := <-done:
		return r.out, r.rc
	case <-time.After(limit):
		return "(did not end within " + limit.String() + ")", -1
	}
}

// close ends the machine's shell and everything it started (its gateway).
func (m *machineShell) close() {
	m.in.Close()
	syscall.Kill(-m.cmd.Process.Pid, syscall.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
}
