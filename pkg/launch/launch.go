// Package launch starts and stops the processes of spawned entities (U4,
// fleet-spawn and fleet-stop). Two launchers are built in:
//
//   - tmux: opens a new window (in session "fleet" unless the profile names
//     another, created when missing) running the profile's command; an
//     inject entity gets that window's pane as its tmux target.
//   - exec: runs the command with sh -c, detached (its own session and
//     process group), its output appended to a log file.
//
// Either way the command starts only once the gateway has registered the
// entity: a small sh wrapper waits until the entity's credential file holds
// the credential of that gid, then exports FLEET_TOKEN, FLEET_ENTITY and
// FLEET_SOCKET (and nothing else of the gateway's FLEET_* environment, which
// may hold the broker's password) and runs the command, so the command's
// first fleet call is never refused. The credential never appears in a
// command line (ps shows the file's path, not its contents).
//
// A command that dies within the profile's grace is a launch failure,
// reported with its output; a tmux window that fails so is closed.
package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/private"
)

// Launchers.
const (
	Tmux = "tmux"
	Exec = "exec"
)

// DefaultSession is the tmux session new windows open in.
const DefaultSession = "fleet"

// Spec is one entity to start.
type Spec struct {
	Launcher string   // Tmux or Exec
	Command  string   // run with sh -c; $0 is the entity's name, ARGS are "$@"
	Args     []string // fleet-spawn -- ARGS
	Name     string   // the entity's name (FLEET_ENTITY; the tmux window's name)
	Gid      string   // the entity's gid: the credential the command waits for
	Socket   string   // the gateway's socket (FLEET_SOCKET), absolute
	CredFile string   // where the gateway saves the credential on registering, absolute
	Session  string   // tmux: the session (default DefaultSession)
	Dir      string   // working folder of the command ("" = the gateway's)
	LogDir   string   // exec: folder of the output log
}

// Info is what a launcher started: enough to stop it, also after the
// gateway restarted. It is stored with the entity.
type Info struct {
	Launcher string `json:"launcher"`
	Session  string `json:"session,omitempty"` // tmux
	Window   string `json:"window,omitempty"`  // tmux window id, @N
	Pane     string `json:"pane,omitempty"`    // tmux pane id, %N
	Pid      int    `json:"pid,omitempty"`     // exec: the process, leader of its session and group
	Started  uint64 `json:"started,omitempty"` // exec: its start time in /proc, against pid reuse
	Log      string `json:"log,omitempty"`     // exec: its output
}

func (i Info) String() string {
	switch i.Launcher {
	case Tmux:
		return "tmux window " + i.Window + " (pane " + i.Pane + ") of session " + i.Session
	case Exec:
		return "process group " + strconv.Itoa(i.Pid)
	}
	return i.Launcher
}

// Error is a launcher failure, with what the command or tmux printed.
type Error struct {
	Err    error
	Output string // the command's output (exec: its log; tmux: the pane)
}

func (e *Error) Error() string {
	msg := e.Err.Error()
	if out := condense(e.Output); out != "" {
		msg += "; output: " + out
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// condense puts output on one line (an error is one line), keeping its end.
func condense(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	out := strings.Join(lines, " | ")
	if len(out) > 1000 {
		out = "…" + out[len(out)-1000:]
	}
	return out
}

// Process is a started command, until the gateway knows it stayed up.
type Process struct {
	Info    Info
	exited  chan struct{} // exec: closed when the process ended
	waitErr error
}

// gate is the wrapper every command runs under: it waits (30s at most) for
// the entity's credential and sets the entity's environment; a tail below
// then runs the command. Arguments: entity, socket, credential file, gid,
// command, ARGS.
const gate = `entity=$1 socket=$2 cred=$3 gid=$4 cmd=$5
shift 5
for v in $(env | sed -n 's/^\(FLEET_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
n=0
while :; do
	token=$(cat -- "$cred" 2>/dev/null) && case $token in "fleet1.$gid."*) break ;; esac
	n=$((n + 1))
	if [ "$n" -gt 600 ]; then
		echo "fleet: $entity was never registered: not started" >&2
		exit 1
	fi
	sleep 0.05
done
FLEET_ENTITY=$entity FLEET_SOCKET=$socket FLEET_TOKEN=$token
export FLEET_ENTITY FLEET_SOCKET FLEET_TOKEN
`

// The exec launcher's process is the command itself (its exit status is
// the process's). A tmux pane's command runs as a child and its status is
// written last into the pane: tmux does not always reap a pane's process
// at once, so the pane may be dead with its status still unknown to it.
// The child runs as a job of its own in the terminal's foreground (set
// -m), so that tmux's #{pane_current_command} names the agent, not this
// wrapper: the gateway pastes only while the entity's program is in front.
// A job stopped by Ctrl-Z is resumed at once (with job control on, it
// would otherwise be orphaned when the wrapper exits, and die).
const (
	// (an exec entity is in no pane: a TMUX_PANE inherited from a gateway
	// that runs in tmux would make its hooks speak for that pane)
	execTail = `unset TMUX TMUX_PANE
exec /bin/sh -c "$cmd" "$entity" "$@"` + "\n"
	tmuxTail = `set -m
/bin/sh -c "$cmd" "$entity" "$@"
status=$?
# stopped (Ctrl-Z, or a read from the terminal in the background): the job
# goes on in the foreground; there is no shell in the pane to return to
while [ "$status" -eq 148 ] || [ "$status" -eq 149 ] || [ "$status" -eq 150 ]; do
	fg >/dev/null 2>&1 || break
	status=$?
done
echo "fleet: $entity exited with status $status"
exit "$status"
`
)

var statusLine = regexp.MustCompile(`^fleet: \S+ exited with status (\d+)$`)

func (s Spec) argv() []string {
	script := gate + execTail
	if s.Launcher == Tmux {
		script = gate + tmuxTail
	}
	return append([]string{"/bin/sh", "-c", script, "fleet-launch", s.Name, s.Socket, s.CredFile, s.Gid, s.Command}, s.Args...)
}

// Start starts spec's command under the gate: it runs once the entity's
// credential file holds a credential for spec.Gid.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	if spec.Command == "" {
		return nil, &Error{Err: errors.New("the profile has no command")}
	}
	if spec.Dir != "" {
		if fi, err := os.Stat(spec.Dir); err != nil || !fi.IsDir() {
			return nil, &Error{Err: fmt.Errorf("working folder %s: not a folder", spec.Dir)}
		}
	}
	switch spec.Launcher {
	case Tmux:
		return startTmux(ctx, spec)
	case Exec:
		return startExec(spec)
	}
	return nil, &Error{Err: fmt.Errorf("unknown launcher %q", spec.Launcher)}
}

// Settle waits grace, then reports whether the command is still up. A
// command that died meanwhile is a failure with its output; its tmux window
// is closed. An exec command that finished with status 0 is a success (a
// one-shot job). grace 0 checks nothing.
func (p *Process) Settle(ctx context.Context, grace time.Duration) error {
	switch p.Info.Launcher {
	case Tmux:
		return p.settleTmux(ctx, grace)
	case Exec:
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		case <-p.exited:
			if p.waitErr == nil {
				return nil
			}
			out, _ := os.ReadFile(p.Info.Log)
			return &Error{Err: fmt.Errorf("the command exited at once: %v", p.waitErr), Output: tail(string(out))}
		}
	}
	return nil
}

// Stop stops what info describes: the tmux window is killed, the exec
// process group gets SIGTERM, then SIGKILL after 5 seconds. What is already
// gone is not an error.
func Stop(ctx context.Context, info Info) error {
	switch info.Launcher {
	case Tmux:
		if err := tmux(ctx, "kill-window", "-t", info.Window); err != nil && !gone(err) {
			return &Error{Err: err}
		}
		return nil
	case Exec:
		return stopGroup(info.Pid, info.Started)
	}
	return &Error{Err: fmt.Errorf("unknown launcher %q", info.Launcher)}
}

// ---- tmux ----

func tmuxOut(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "tmux", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("tmux %s: %s", args[0], msg)
	}
	return stdout.String(), nil
}

func tmux(ctx context.Context, args ...string) error {
	_, err := tmuxOut(ctx, args...)
	return err
}

// gone reports a tmux error that means the window, pane or server is no more.
func gone(err error) bool {
	s := err.Error()
	return strings.Contains(s, "can't find") || strings.Contains(s, "no server running") ||
		strings.Contains(s, "no such") || strings.Contains(s, "error connecting")
}

func startTmux(ctx context.Context, spec Spec) (*Process, error) {
	session := spec.Session
	if session == "" {
		session = DefaultSession
	}
	opts := []string{"-d", "-P", "-F", "#{pane_id} #{window_id}", "-n", spec.Name}
	if spec.Dir != "" {
		opts = append(opts, "-c", spec.Dir)
	}
	var out string
	var err error
	if tmux(ctx, "has-session", "-t", "="+session) != nil {
		out, err = tmuxOut(ctx, append(append(append([]string{"new-session", "-s", session}, opts...), "--"), spec.argv()...)...)
		if err != nil && !strings.Contains(err.Error(), "duplicate session") {
			return nil, &Error{Err: err}
		}
		// a duplicate: created meanwhile, so open a window in it
	}
	if out == "" {
		out, err = tmuxOut(ctx, append(append(append([]string{"new-window", "-t", "=" + session + ":"}, opts...), "--"), spec.argv()...)...)
	}
	if err != nil {
		return nil, &Error{Err: err}
	}
	pane, window, ok := strings.Cut(strings.TrimSpace(out), " ")
	if !ok {
		return nil, &Error{Err: fmt.Errorf("tmux printed %q, not a pane and window id", out)}
	}
	info := Info{Launcher: Tmux, Session: session, Window: window, Pane: pane}
	// Keep a pane whose command dies, so Settle can tell and show its
	// output. The command cannot have run yet: it waits for its credential.
	if err := tmux(ctx, "set-option", "-w", "-t", window, "remain-on-exit", "on"); err != nil {
		_ = Stop(context.WithoutCancel(ctx), info)
		return nil, &Error{Err: err}
	}
	return &Process{Info: info}, nil
}

func (p *Process) settleTmux(ctx context.Context, grace time.Duration) error {
	if grace > 0 {
		t := time.NewTimer(grace)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	ctx = context.WithoutCancel(ctx)
	// From now on a command that ends closes its window. Turned off first,
	// then checked: a death before this leaves a dead pane, one after it
	// no pane at all; both are seen below.
	offErr := tmux(ctx, "set-option", "-w", "-t", p.Info.Window, "remain-on-exit", "off")
	if grace <= 0 {
		return nil
	}
	state, err := tmuxOut(ctx, "list-panes", "-t", p.Info.Pane, "-F", "#{pane_dead} #{pane_dead_status}")
	if err != nil {
		if gone(err) || (offErr != nil && gone(offErr)) {
			return &Error{Err: errors.New("the command exited at once and its tmux window closed")}
		}
		return &Error{Err: err}
	}
	dead, status, _ := strings.Cut(strings.TrimSpace(state), " ")
	if dead != "1" {
		return nil
	}
	screen, _ := tmuxOut(ctx, "capture-pane", "-p", "-J", "-t", p.Info.Pane, "-S", "-")
	var lines []string
	for _, l := range strings.Split(screen, "\n") {
		switch m := statusLine.FindStringSubmatch(strings.TrimSpace(l)); {
		case m != nil:
			if status == "" {
				status = m[1] // tmux has not reaped it yet; the gate told us
			}
		case !strings.HasPrefix(l, "Pane is dead"):
			lines = append(lines, l)
		}
	}
	exit := "status " + status
	if status == "" {
		exit = "an unknown status"
	}
	_ = Stop(ctx, p.Info)
	return &Error{Err: fmt.Errorf("the command exited at once with %s", exit), Output: tail(strings.Join(lines, "\n"))}
}

// ---- exec ----

func startExec(spec Spec) (*Process, error) {
	if err := os.MkdirAll(spec.LogDir, 0o700); err != nil {
		return nil, &Error{Err: err}
	}
	logPath := filepath.Join(spec.LogDir, spec.Name+"."+spec.Gid+".log")
	f, err := private.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, &Error{Err: err}
	}
	defer f.Close()
	argv := spec.argv()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // detached: its own session and group
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLEET_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, &Error{Err: err}
	}
	p := &Process{
		Info:   Info{Launcher: Exec, Pid: cmd.Process.Pid, Started: procStart(cmd.Process.Pid), Log: logPath},
		exited: make(chan struct{}),
	}
	go func() {
		p.waitErr = cmd.Wait() // reaps it; the gateway is its parent
		close(p.exited)
	}()
	return p, nil
}

// tail keeps the last lines of a command's output.
func tail(s string) string {
	s = strings.TrimRight(s, "\n ")
	lines := strings.Split(s, "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// procStart returns the start time of pid (field 22 of /proc/PID/stat, in
// clock ticks since boot); 0 when it cannot be read.
func procStart(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// the command name (field 2) is in parentheses and may hold spaces
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(fields[19], 10, 64)
	return n
}

// stopGroup ends the process group of pid, if pid is still the process
// that was started (same start time).
func stopGroup(pid int, started uint64) error {
	if pid <= 1 {
		return &Error{Err: fmt.Errorf("no process recorded")}
	}
	alive := func() bool { return syscall.Kill(-pid, 0) == nil }
	if now := procStart(pid); started != 0 && now != 0 && now != started {
		// pid is another process now: ours and its whole group are gone
		// (Linux reuses no pid while a group of that id lives)
		return nil
	}
	// the leader may be gone while children live on in its group: they
	// get the signals all the same
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return &Error{Err: fmt.Errorf("signalling process group %d: %w", pid, err)}
	}
	for _, step := range []struct {
		wait time.Duration
		sig  syscall.Signal
	}{{5 * time.Second, syscall.SIGKILL}, {2 * time.Second, 0}} {
		deadline := time.Now().Add(step.wait)
		for alive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !alive() {
			return nil
		}
		if step.sig != 0 {
			_ = syscall.Kill(-pid, step.sig)
		}
	}
	return &Error{Err: fmt.Errorf("process group %d did not end after SIGKILL", pid)}
}

// Alive reports whether what info describes still runs: the exec
// command's process group has a live (not zombie) process, or the tmux
// pane is there and not dead. When that cannot be told (tmux itself
// fails, no pid recorded), it says true: a process is never declared
// gone on a guess.
func Alive(ctx context.Context, info Info) bool {
	switch info.Launcher {
	case Exec:
		if info.Pid <= 1 {
			return true
		}
		state, start, ok := procState(info.Pid)
		switch {
		case ok && info.Started != 0 && start != info.Started:
			// pid is another process now: ours and its whole group are
			// gone (Linux reuses no pid while a group of that id lives)
			return false
		case ok && state != 'Z':
			return true
		}
		if err := syscall.Kill(-info.Pid, 0); errors.Is(err, syscall.ESRCH) {
			return false
		}
		// the leader is gone or a zombie: a child may live on in its group
		return groupLives(info.Pid)
	case Tmux:
		out, err := tmuxOut(ctx, "display-message", "-p", "-t", info.Pane, "#{pane_id} #{pane_dead}")
		if err != nil {
			return !gone(err)
		}
		id, dead, _ := strings.Cut(strings.TrimSpace(out), " ")
		return id == info.Pane && dead != "1"
	}
	return true
}

// procState returns the state letter and start time of pid, from
// /proc/PID/stat.
func procState(pid int) (state byte, start uint64, ok bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 20 || f[0] == "" {
		return 0, 0, false
	}
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, true
}

// statFields are the fields of /proc/PID/stat after the command name:
// state, ppid, pgrp, ...
func statFields(pid int) ([]string, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	// the command name (field 2) is in parentheses and may hold spaces
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(data[i+1:])), true
}

// groupLives says whether a process of group pgid lives (not a zombie).
func groupLives(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, ok := statFields(pid)
		if ok && len(f) > 2 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" {
			return true
		}
	}
	return false
}
