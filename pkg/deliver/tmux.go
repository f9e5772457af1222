package deliver

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Tmux pastes a message into a tmux pane as one unit — a named paste
// buffer, pasted with bracketed paste when the program in the pane asked
// for it — then, after a settle delay, presses Enter. The pane's program
// therefore sees the whole text at once and one submit, never a stream of
// keystrokes it could act on halfway.
type Tmux struct {
	Target string        // tmux target pane, e.g. "work:1.0" or "%3"
	Settle time.Duration // pause between paste and Enter
}

func tmux(ctx context.Context, stdin []byte, args ...string) error {
	cmd := exec.CommandContext(ctx, "tmux", args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("tmux %s: %s", args[0], msg)
	}
	return nil
}

// Deliver pastes the text and submits it.
func (t *Tmux) Deliver(ctx context.Context, env *envelope.Envelope) error {
	buf := "fleet-" + env.MsgID
	if err := tmux(ctx, []byte(Text(env)), "load-buffer", "-b", buf, "-"); err != nil {
		return err
	}
	// -d deletes the buffer after pasting; -p uses bracketed paste when the
	// application enabled it.
	if err := tmux(ctx, nil, "paste-buffer", "-d", "-p", "-b", buf, "-t", t.Target); err != nil {
		_ = tmux(context.Background(), nil, "delete-buffer", "-b", buf)
		return fmt.Errorf("pane %s: %w", t.Target, err)
	}
	// From here on the text is in the pane: a failure is uncertain, never
	// retried (a retry would paste it twice).
	select {
	case <-time.After(t.Settle):
	case <-ctx.Done():
	}
	var err error
	for i := 0; i < 3; i++ {
		if err = tmux(context.WithoutCancel(ctx), nil, "send-keys", "-t", t.Target, "Enter"); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%w: text pasted into %s but Enter failed: %v", ErrUncertain, t.Target, err)
}
