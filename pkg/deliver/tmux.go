package deliver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Tmux pastes a message into a tmux pane as one unit — a named paste
// buffer — then, after a settle delay, presses Enter. The pane's program
// therefore sees the whole text at once and one submit, never a stream of
// keystrokes it could act on halfway.
//
// Nothing in the text can act as a key: its control characters are
// neutralised (see Inert), and Enter is pressed by the adapter alone, once.
// Its newlines are text only inside a bracketed paste, so which form is
// pasted depends on the pane:
//
//   - the program in the pane enabled bracketed paste and tmux says so
//     (#{bracket_paste_flag} is 1, a format newer tmux versions have): Text,
//     header line then the body with its newlines and tabs, pasted with -p
//     (inside ESC[200~ … ESC[201~) and -r (newlines stay LF: the Enter after
//     the paste is the only CR the program receives);
//   - otherwise — bracketed paste off, or unknown because tmux has no such
//     format (tmux 3.3a has none): Line, the message on one line with its
//     newlines and tabs shown as ␊ and ␉, so that no byte below 0x20
//     reaches the program before the Enter. It is still pasted with -p, so
//     a program that enabled bracketed paste gets it bracketed.
//
// The choice and the paste are one tmux command (if-shell -F), so the
// program cannot switch bracketed paste between the check and the paste. A
// target that cannot be quoted in that command (see quotable) gets Line.
type Tmux struct {
	Target string        // tmux target pane, e.g. "work:1.0" or "%3"
	Settle time.Duration // pause between paste and Enter
}

func tmux(ctx context.Context, stdin []byte, args ...string) error {
	return tmuxAs(ctx, args[0], stdin, args...)
}

// tmuxAs runs tmux, naming the failure after what it did (name).
func tmuxAs(ctx context.Context, name string, stdin []byte, args ...string) error {
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
		return fmt.Errorf("tmux %s: %s", name, msg)
	}
	return nil
}

// quotable says whether s may be written between single quotes in a tmux
// command string — no quote, no format (#), no space or control
// character: ^[A-Za-z0-9_.:%@$+=/-]+$, checked by hand (TestHandGrammars).
func quotable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_.:%@$+=/-", c) >= 0) {
			return false
		}
	}
	return true
}

// bracketFlag is the tmux condition for pasting the multi-line Text: 1 when
// the pane's program enabled bracketed paste (empty, so false, on a tmux
// without the format). Tests replace it.
var bracketFlag = "#{bracket_paste_flag}"

// Deliver pastes the text and submits it.
func (t *Tmux) Deliver(ctx context.Context, env *envelope.Envelope) error {
	id := env.MsgID
	if !quotable(id) || len(id) > 64 {
		sum := sha256.Sum256([]byte(id))
		id = hex.EncodeToString(sum[:8])
	}
	lines, line := "fleet-"+id+"-text", "fleet-"+id+"-line"
	drop := func() {
		_ = tmux(context.Background(), nil, "delete-buffer", "-b", lines)
		_ = tmux(context.Background(), nil, "delete-buffer", "-b", line)
	}
	if err := tmux(ctx, []byte(Line(env)), "load-buffer", "-b", line, "-"); err != nil {
		return err
	}
	// -d deletes the buffer after pasting; -p brackets the paste when the
	// application enabled bracketed paste; -r keeps LF as LF.
	paste := func(buf string) string {
		return "paste-buffer -d -p -r -b '" + buf + "' -t '" + t.Target + "'"
	}
	var err error
	if quotable(t.Target) {
		if err = tmux(ctx, []byte(Text(env)), "load-buffer", "-b", lines, "-"); err != nil {
			drop()
			return err
		}
		err = tmuxAs(ctx, "paste-buffer", nil, "if-shell", "-F", "-t", t.Target, bracketFlag,
			paste(lines), paste(line))
	} else {
		err = tmux(ctx, nil, "paste-buffer", "-d", "-p", "-r", "-b", line, "-t", t.Target)
	}
	drop()
	if err != nil {
		return fmt.Errorf("pane %s: %w", t.Target, err)
	}
	// From here on the text is in the pane: a failure is uncertain, never
	// retried (a retry would paste it twice).
	select {
	case <-time.After(t.Settle):
	case <-ctx.Done():
	}
	for i := 0; i < 3; i++ {
		if err = tmux(context.WithoutCancel(ctx), nil, "send-keys", "-t", t.Target, "Enter"); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%w: text pasted into %s but Enter failed: %v", ErrUncertain, t.Target, err)
}
