package deliver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Exec runs Command with sh -c, the message JSON on stdin and the message's
// ids in FLEET_* variables (see Run for the environment). Exit 0 means
// delivered, as amqp-consume does.
type Exec struct {
	Command string
	Entity  string // name, exported as FLEET_ENTITY
	Timeout time.Duration
}

// Deliver runs the command once.
func (x *Exec) Deliver(ctx context.Context, env *envelope.Envelope) error {
	data, err := envelope.Encode(env)
	if err != nil {
		return err
	}
	err = Run(ctx, x.Command, x.Timeout, bytes.NewReader(append(data, '\n')), []string{
		"FLEET_ENTITY=" + x.Entity,
		"FLEET_MSG_ID=" + env.MsgID,
		"FLEET_TRACE_ID=" + env.TraceID,
		"FLEET_KIND=" + string(env.Kind),
		"FLEET_SENDER=" + env.Sender.String(),
	})
	if err != nil {
		return fmt.Errorf("exec adapter: %w", err)
	}
	return nil
}

// Run runs command under sh -c in its own process group with stdin and the
// extra environment, killing the group at the timeout. A failure is an
// *ExecError: the exit status, the size of stderr and its hash, never the
// output or the command line (see ExecError).
//
// The command gets the gateway's environment without any FLEET_* variable
// (they may hold the broker's password), plus env: FLEET_* variables whose
// values Run makes one inert line each (see Inert), since some come from
// message fields. An entry of env that is not FLEET_NAME=VALUE is an error.
func Run(ctx context.Context, command string, timeout time.Duration, stdin *bytes.Reader, env []string) error {
	vars, err := childEnv(os.Environ(), env)
	if err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	if stdin != nil {
		cmd.Stdin = stdin
	}
	cmd.Env = vars
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if err == nil {
		return nil
	}
	x := &ExecError{Stderr: stderr.Len(), Sum: sha256.Sum256(stderr.Bytes())}
	var exit *exec.ExitError
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		x.Status = "timed out after " + timeout.String()
	case errors.As(err, &exit):
		x.Status = exit.ProcessState.String() // "exit status 3", "signal: killed"
	default:
		x.Status = err.Error() // /bin/sh not started, or stdin not copied: no output in it
	}
	return x
}

// ExecError is a failed run of a hook or adapter command. Its text is what
// reaches the audit log, trace answers, dead letters and bounces (another
// entity's or host's reading), so it holds no byte of the command's output
// and not the command line: the command was given the message, and its
// output (or its line, a secret in an argument) may repeat it. What is
// left to tell runs apart: the exit status, how many bytes went to stderr,
// and their sha256 (to match against what the command logs itself).
type ExecError struct {
	Status string // "exit status 3", "signal: killed", "timed out after 30s"
	Stderr int    // bytes written to stderr
	Sum    [sha256.Size]byte
}

func (x *ExecError) Error() string {
	if x.Stderr == 0 {
		return x.Status + " (no stderr)"
	}
	return fmt.Sprintf("%s (stderr %d bytes, sha256 %x)", x.Status, x.Stderr, x.Sum[:8])
}

// isFleetVar says whether k is a FLEET_* variable name: ^FLEET_[A-Z0-9_]+$,
// checked by hand (a regexp compiled at package init costs every command
// that imports this package; TestHandGrammars holds it to the expression).
func isFleetVar(k string) bool {
	rest, ok := strings.CutPrefix(k, "FLEET_")
	if !ok || rest == "" {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// childEnv is base without its FLEET_* variables, then extra, each value
// made Inert on one line.
func childEnv(base, extra []string) ([]string, error) {
	vars := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		if !strings.HasPrefix(kv, "FLEET_") {
			vars = append(vars, kv)
		}
	}
	for _, kv := range extra {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !isFleetVar(k) {
			return nil, fmt.Errorf("exec: bad environment entry %q: want FLEET_NAME=VALUE", Inert(kv, false))
		}
		vars = append(vars, k+"="+Inert(v, false))
	}
	return vars, nil
}
