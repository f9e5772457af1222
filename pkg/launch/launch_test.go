package launch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spec returns a spec whose credential file and logs live in a fresh
// folder, the command running there.
func spec(t *testing.T, launcher, command string, args ...string) Spec {
	t.Helper()
	dir := t.TempDir()
	return Spec{
		Launcher: launcher, Command: command, Args: args, Name: "w1",
		Gid:    "7c9e6679-7425-40de-944b-e07fc1f90ae7",
		Socket: "/run/test/gw.sock", CredFile: filepath.Join(dir, "w1.token"),
		Dir: dir, LogDir: filepath.Join(dir, "spawn"),
	}
}

func register(t *testing.T, s Spec, gid string) {
	t.Helper()
	tmp := s.CredFile + ".tmp"
	if err := os.WriteFile(tmp, []byte("fleet1."+gid+".secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.CredFile); err != nil {
		t.Fatal(err)
	}
}

func waitFile(t *testing.T, path, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(path)
		if strings.Contains(string(data), want) {
			return string(data)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held %q; it holds %q", path, want, data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The command waits for its own credential (a stale one of another gid
// does not let it through), then runs with the entity's environment, its
// arguments as "$@", and none of the gateway's other FLEET_* variables.
func TestExecWaitsForCredentialAndSetsEnvironment(t *testing.T) {
	t.Setenv("FLEET_BROKER", "amqp://user:secret@broker/")
	s := spec(t, Exec, `printf '%s|%s|%s|%s|%s|%s\n' "$0" "$FLEET_ENTITY" "$FLEET_SOCKET" "$FLEET_TOKEN" "${FLEET_BROKER-unset}" "$*" > out.txt`, "--model", "big one")
	out := filepath.Join(s.Dir, "out.txt")
	register(t, s, "00000000-0000-4000-8000-000000000000") // another entity's
	p, err := Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	// no sleep-then-absence: the stale credential of another gid is there
	// from the start, so a command that ran before its own credential (or
	// with any credential) wrote that token, and the comparison below fails
	register(t, s, s.Gid)
	got := waitFile(t, out, "\n")
	want := "w1|w1|/run/test/gw.sock|fleet1." + s.Gid + ".secret|unset|--model big one\n"
	if got != want {
		t.Errorf("the command saw %q, want %q", got, want)
	}
	if err := p.Settle(context.Background(), 5*time.Second); err != nil {
		t.Errorf("a command that finished with status 0 failed to settle: %v", err)
	}
}

func TestExecCommandThatDiesIsAFailureWithItsOutput(t *testing.T) {
	s := spec(t, Exec, `echo "model not found: gpt-9" >&2; exit 3`)
	p, err := Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, s.Gid)
	err = p.Settle(context.Background(), time.Minute) // returns when it exits
	var le *Error
	if !errors.As(err, &le) {
		t.Fatalf("Settle = %v, want a *launch.Error", err)
	}
	if !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "model not found: gpt-9") {
		t.Errorf("error %q lacks the status or the output", err)
	}
}

func TestExecStopEndsTheWholeGroup(t *testing.T) {
	s := spec(t, Exec, `sleep 600 & echo started > up.txt; sleep 600`)
	p, err := Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, s.Gid)
	waitFile(t, filepath.Join(s.Dir, "up.txt"), "started")
	if err := p.Settle(context.Background(), 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p.Info.Started == 0 {
		t.Error("no start time recorded")
	}
	if err := Stop(context.Background(), p.Info); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-p.Info.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process group %d still has members after Stop (kill: %v)", p.Info.Pid, err)
	}
	if err := Stop(context.Background(), p.Info); err != nil {
		t.Errorf("stopping what is gone: %v", err)
	}
}

func TestStopLeavesAReusedPidAlone(t *testing.T) {
	other := exec.Command("sleep", "600")
	other.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	info := Info{Launcher: Exec, Pid: other.Process.Pid, Started: procStart(other.Process.Pid) + 1}
	if err := Stop(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(other.Process.Pid, 0); err != nil {
		t.Errorf("Stop killed a process that only shares the recorded pid: %v", err)
	}
}

func tmuxServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (make test installs it): ", err)
	}
	dir := t.TempDir()
	t.Setenv("TMUX_TMPDIR", dir)
	t.Setenv("TMUX", "")
	t.Cleanup(func() { exec.Command("tmux", "kill-server").Run() })
}

func windows(t *testing.T) string {
	t.Helper()
	out, _ := exec.Command("tmux", "list-windows", "-a", "-F", "#{session_name}:#{window_name}").CombinedOutput()
	return string(out)
}

func TestTmuxOpensAWindowAndStopClosesIt(t *testing.T) {
	tmuxServer(t)
	s := spec(t, Tmux, `echo "$FLEET_ENTITY $1" > out.txt; exec cat > pane.txt`, "arg1")
	p, err := Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if p.Info.Session != DefaultSession || !strings.HasPrefix(p.Info.Pane, "%") || !strings.HasPrefix(p.Info.Window, "@") {
		t.Errorf("info = %+v", p.Info)
	}
	register(t, s, s.Gid)
	waitFile(t, filepath.Join(s.Dir, "out.txt"), "w1 arg1")
	if err := p.Settle(context.Background(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if w := windows(t); !strings.Contains(w, "fleet:w1") {
		t.Fatalf("no window fleet:w1 in %q", w)
	}
	// a second one opens in the same session
	s2 := spec(t, Tmux, `exec cat`)
	s2.Name = "w2"
	p2, err := Start(context.Background(), s2)
	if err != nil {
		t.Fatal(err)
	}
	if err := Stop(context.Background(), p.Info); err != nil {
		t.Fatal(err)
	}
	if w := windows(t); strings.Contains(w, "fleet:w1") || !strings.Contains(w, "fleet:w2") {
		t.Errorf("after stopping w1, windows are %q", w)
	}
	if err := Stop(context.Background(), p.Info); err != nil {
		t.Errorf("stopping a window that is gone: %v", err)
	}
	Stop(context.Background(), p2.Info)
}

func TestTmuxCommandThatDiesIsAFailureWithItsScreen(t *testing.T) {
	tmuxServer(t)
	s := spec(t, Tmux, `echo "no such model: gpt-9"; exit 4`)
	p, err := Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	register(t, s, s.Gid)
	err = p.Settle(context.Background(), 500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "status 4") || !strings.Contains(err.Error(), "no such model: gpt-9") {
		t.Fatalf("Settle = %v, want the status and the screen", err)
	}
	if w := windows(t); strings.Contains(w, ":w1") {
		t.Errorf("the failed window is still open: %q", w)
	}
}

func TestMissingFolderIsALaunchFailure(t *testing.T) {
	s := spec(t, Exec, "true")
	s.Dir = filepath.Join(s.Dir, "nope")
	if _, err := Start(context.Background(), s); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Errorf("Start = %v, want a missing folder refused", err)
	}
}

// Alive follows an exec command's process group: up while any process of
// it lives, gone once none does (a zombie leader counts for nothing).
func TestAliveExec(t *testing.T) {
	start := func(script string) (*exec.Cmd, Info) {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		return cmd, Info{Launcher: Exec, Pid: cmd.Process.Pid, Started: procStart(cmd.Process.Pid)}
	}
	ctx := context.Background()

	cmd, info := start("exec sleep 60")
	if !Alive(ctx, info) {
		t.Fatal("a running command reads gone")
	}
	syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	// not reaped yet: a zombie is not alive
	waitFor(t, "the killed leader reads gone while a zombie", func() bool { return !Alive(ctx, info) })
	cmd.Wait()
	if Alive(ctx, info) {
		t.Fatal("a reaped command reads alive")
	}

	// the leader exits, a child lives on in its group
	cmd, info = start("sleep 60 & echo started; exit 0")
	cmd.Wait()
	if !Alive(ctx, info) {
		t.Fatal("a group whose child lives on reads gone")
	}
	syscall.Kill(-info.Pid, syscall.SIGKILL)
	waitFor(t, "the group reads gone once its child died", func() bool { return !Alive(ctx, info) })

	// a pid reused by another process: gone
	if Alive(ctx, Info{Launcher: Exec, Pid: os.Getpid(), Started: procStart(os.Getpid()) + 1}) {
		t.Fatal("a pid with another start time reads alive")
	}
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
