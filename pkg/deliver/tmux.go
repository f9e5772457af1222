package deliver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Tmux pastes a message into a tmux pane as one unit — a named paste
// buffer — then, after a settle delay, presses Enter. The pane's program
// therefore sees the whole text at once and one submit, never a stream of
// keystrokes it could act on halfway.
//
// Nothing is typed into the wrong program: with Program set, the paste and
// the Enter are each one tmux command that runs only while the pane's
// foreground program (#{pane_current_command}) is Program (if-shell -F,
// evaluated by tmux itself, so nothing can change between the check and
// the keys). A pane whose agent exited — back at its shell, another
// program, a dead pane — gets nothing, and Deliver says so with a
// *DetachedError: a body can never become a shell command.
//
// Nothing in the text can act as a key: its control characters are
// neutralised (see Inert), and Enter is pressed by the adapter alone, once.
// Its newlines are text only inside a bracketed paste, so which form is
// pasted is the entity's paste setting (Paste):
//
//   - PasteLine, for a program that may take pasted text as typed keys:
//     Line, the message on one line with its newlines and tabs shown as ␊
//     and ␉, so that no byte below 0x20 reaches the program before the
//     Enter;
//   - PasteBracketed, for a program that enables bracketed paste (Claude
//     Code, Codex, Gemini CLI, IPython): Text, header line then the body
//     with its newlines and tabs, pasted with -p (inside ESC[200~ …
//     ESC[201~) and -r (newlines stay LF: the Enter after the paste is the
//     only CR the program receives);
//   - PasteAuto (the default): Text when the program enabled bracketed
//     paste and tmux says so (#{bracket_paste_flag} is 1, a format newer
//     tmux versions have), else Line — always Line on tmux 3.3a, which has
//     no such format. The choice and the paste are one tmux command.
//
// Either form is pasted with -p, so a program that enabled bracketed paste
// gets it bracketed. A target that cannot be quoted in a tmux command (see
// quotable) gets Line and no foreground check; the gateway passes the
// pane's id (%N), which always can be.
type Tmux struct {
	Target  string        // tmux target pane, e.g. "%3" or "work:1.0"
	Settle  time.Duration // pause between paste and Enter
	Program string        // the pane's foreground program a paste needs ("" checks nothing)
	Paste   string        // PasteAuto (""), PasteLine or PasteBracketed
	Header  string        // HeaderBefore (""), HeaderAfter or HeaderOff
	// Confirm, when positive, is how long the Enter has to change the
	// screen (its text, cursor or history) before the delivery is
	// uncertain: the proof of a program that has no turn hooks.
	Confirm time.Duration
	// Echo, when positive, is how long to wait for the paste to show on
	// the screen before the settle delay and the Enter: an agent CLI that
	// reads an Enter right behind pasted text as a newline (Gemini CLI
	// within 30 ms) gets it only once the text is in its input.
	Echo time.Duration
}

// The paste settings.
const (
	PasteAuto      = "auto"
	PasteLine      = "line"
	PasteBracketed = "bracketed"
)

// ErrDetached is what a *DetachedError matches with errors.Is.
var ErrDetached = errors.New("the agent is not in its pane")

// DetachedError says a pane does not run the program a paste needs; the
// adapter typed nothing into it.
type DetachedError struct {
	Target, Want string
	Found        string // the pane's foreground program, or "" if the pane is dead or gone
	Dead         bool
}

func (e *DetachedError) Error() string {
	switch {
	case e.Dead:
		return fmt.Sprintf("pane %s is dead (its program exited; %s is not running)", e.Target, e.Want)
	case e.Found == "":
		return fmt.Sprintf("pane %s is gone", e.Target)
	}
	return fmt.Sprintf("pane %s runs %s, not %s", e.Target, e.Found, e.Want)
}

func (e *DetachedError) Unwrap() error { return ErrDetached }

func tmux(ctx context.Context, stdin []byte, args ...string) error {
	_, err := tmuxOut(ctx, args[0], stdin, args...)
	return err
}

// tmuxOut runs tmux and returns its output, naming a failure after what it
// did (name).
func tmuxOut(ctx context.Context, name string, stdin []byte, args ...string) (string, error) {
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
		return "", fmt.Errorf("tmux %s: %s", name, msg)
	}
	return string(out), nil
}

// quotable says whether s may be written between single quotes in a tmux
// command string, or between double quotes inside one — no quote, no
// format (#), no $ (tmux expands $VAR inside double quotes), no space or
// control character: ^[A-Za-z0-9_.:%@+=/-]+$, checked by hand
// (TestHandGrammars).
func quotable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_.:%@+=/-", c) >= 0) {
			return false
		}
	}
	return true
}

// ProgramOK says whether name may be an entity's program: a command name
// as tmux shows it (^[A-Za-z0-9_.+-]{1,64}$), so it can stand in a tmux
// format unquoted.
func ProgramOK(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_.+-", c) >= 0) {
			return false
		}
	}
	return true
}

// bracketFlag is the tmux condition for pasting the multi-line Text: 1 when
// the pane's program enabled bracketed paste (empty, so false, on a tmux
// without the format). Tests replace it.
var bracketFlag = "#{bracket_paste_flag}"

// notForeground is what the guarded commands print when the pane's
// foreground program is not the one they need.
const notForeground = "fleet:not-foreground"

// guard wraps the tmux command string cmd so that tmux runs it only while
// the pane's foreground program is t.Program: the arguments of one tmux
// command (if-shell -F).
func (t *Tmux) guard(cmd string) []string {
	return []string{"if-shell", "-F", "-t", t.Target, "#{==:#{pane_current_command}," + t.Program + "}",
		cmd, "display-message -p '" + notForeground + "'"}
}

// detached says why a guarded command found the wrong program: the pane as
// tmux sees it now.
func (t *Tmux) detached(ctx context.Context) *DetachedError {
	e := &DetachedError{Target: t.Target, Want: t.Program}
	if p, err := Probe(ctx, t.Target); err == nil {
		e.Found, e.Dead = p.Command, p.Dead
	}
	return e
}

// bufferID names the paste buffers of one delivery: the message and the
// pane (hashed: both come from outside, and a buffer name must stay
// quotable), then a random part. tmux's buffers are one namespace per
// server, and the copies of a broadcast to the panes of one host have one
// msg id and are pasted at once; a name of the message alone let one
// copy's paste (-d) delete another's buffer ("no buffer fleet-<id>-line").
// The random part keeps even two deliveries of one message to one pane
// apart (a retry racing a paste still under way, two gateways on one
// tmux server).
func bufferID(msgID, target string) string {
	sum := sha256.Sum256([]byte(msgID + "\x00" + target))
	var r [8]byte
	rand.Read(r[:]) // never fails (crypto/rand)
	return hex.EncodeToString(sum[:6]) + "-" + hex.EncodeToString(r[:])
}

// Deliver pastes the text and submits it.
func (t *Tmux) Deliver(ctx context.Context, env *envelope.Envelope) error {
	return t.submit(ctx, env.MsgID, Format(env, t.Header, true), Format(env, t.Header, false))
}

// Type pastes one line of the gateway's own text and submits it, by the
// same path, checks and single Enter as Deliver: the line is made Inert
// (no byte of it can act as a key) and pasted only while the pane's
// program is in front. key names its paste buffers.
func (t *Tmux) Type(ctx context.Context, key, line string) error {
	line = Inert(line, false)
	return t.submit(ctx, "type\x00"+key, line, line)
}

// submit pastes text (the lines form, for a bracketed paste) or line (the
// one-line form), as the entity's paste setting and the pane say, then
// presses Enter. key names the paste buffers.
func (t *Tmux) submit(ctx context.Context, key, text, oneLine string) error {
	if t.Program != "" && (!quotable(t.Target) || !ProgramOK(t.Program)) {
		return fmt.Errorf("pane %q or program %q cannot be checked before a paste", t.Target, t.Program)
	}
	id := bufferID(key, t.Target)
	lines, line := "fleet-"+id+"-text", "fleet-"+id+"-line"
	drop := func() {
		_ = tmux(context.Background(), nil, "delete-buffer", "-b", lines)
		_ = tmux(context.Background(), nil, "delete-buffer", "-b", line)
	}
	mode := t.Paste
	if !quotable(t.Target) {
		mode = PasteLine
	}
	if mode != PasteBracketed {
		if err := tmux(ctx, []byte(oneLine), "load-buffer", "-b", line, "-"); err != nil {
			return err
		}
	}
	if mode != PasteLine {
		if err := tmux(ctx, []byte(text), "load-buffer", "-b", lines, "-"); err != nil {
			drop()
			return err
		}
	}
	// -d deletes the buffer after pasting; -p brackets the paste when the
	// application enabled bracketed paste; -r keeps LF as LF.
	paste := func(buf string) string {
		return "paste-buffer -d -p -r -b '" + buf + "' -t '" + t.Target + "'"
	}
	var args []string
	switch {
	case !quotable(t.Target):
		args = []string{"paste-buffer", "-d", "-p", "-r", "-b", line, "-t", t.Target}
	case mode == PasteLine:
		args = []string{"if-shell", "-F", "-t", t.Target, "1", paste(line)}
	case mode == PasteBracketed:
		args = []string{"if-shell", "-F", "-t", t.Target, "1", paste(lines)}
	default:
		args = []string{"if-shell", "-F", "-t", t.Target, bracketFlag, paste(lines), paste(line)}
	}
	if t.Program != "" {
		// args[5:] are the commands of an if-shell: nest it in the guard
		inner := args[5:]
		cmd := "if-shell -F -t '" + t.Target + "' '" + args[4] + "' \"" + inner[0] + "\""
		if len(inner) > 1 {
			cmd += " \"" + inner[1] + "\""
		}
		args = t.guard(cmd)
	}
	var shown string
	if t.Echo > 0 {
		shown, _ = Screen(ctx, t.Target)
	}
	out, err := tmuxOut(ctx, "paste-buffer", nil, args...)
	drop()
	if err != nil {
		return fmt.Errorf("pane %s: %w", t.Target, err)
	}
	if strings.Contains(out, notForeground) {
		return t.detached(ctx) // nothing was pasted
	}
	// From here on the text is in the pane: a failure is uncertain, never
	// retried (a retry would paste it twice).
	if t.Echo > 0 {
		changed(ctx, t.Target, shown, t.Echo) // the paste shows in the input
	}
	select {
	case <-time.After(t.Settle):
	case <-ctx.Done():
	}
	// the screen just before the Enter: a program that echoes the paste a
	// moment late does not pass for one that took the Enter
	var before string
	if t.Confirm > 0 {
		before, _ = Screen(context.WithoutCancel(ctx), t.Target)
	}
	if err := t.Enter(ctx); err != nil {
		return fmt.Errorf("%w: text pasted into %s, %v", ErrUncertain, t.Target, err)
	}
	if t.Confirm > 0 && !changed(ctx, t.Target, before, t.Confirm) {
		return fmt.Errorf("%w: text pasted into %s, but its Enter changed nothing on the screen within %v", ErrUncertain, t.Target, t.Confirm)
	}
	return nil
}

// Enter presses Enter in the pane, only while its program is in front.
func (t *Tmux) Enter(ctx context.Context) error {
	enter := []string{"send-keys", "-t", t.Target, "Enter"}
	if t.Program != "" {
		enter = t.guard("send-keys -t '" + t.Target + "' Enter")
	}
	var out string
	var err error
	for i := 0; i < 3; i++ {
		if out, err = tmuxOut(context.WithoutCancel(ctx), "send-keys", nil, enter...); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("but Enter failed: %v", err)
	}
	if strings.Contains(out, notForeground) {
		return fmt.Errorf("then before its Enter: %v", t.detached(ctx))
	}
	return nil
}

// Interrupt presses key, the agent CLI's own interrupt (Escape), in the
// pane, only while its program is in front: never without a program to
// guard it with.
func (t *Tmux) Interrupt(ctx context.Context, key string) error {
	if t.Program == "" {
		return fmt.Errorf("no program named for pane %s: an interrupt is pressed only into the agent", t.Target)
	}
	out, err := tmuxOut(context.WithoutCancel(ctx), "send-keys", nil, t.guard("send-keys -t '"+t.Target+"' "+key)...)
	if err != nil {
		return fmt.Errorf("pressing %s: %v", key, err)
	}
	if strings.Contains(out, notForeground) {
		return t.detached(ctx)
	}
	return nil
}

// changed waits up to within for target's screen to differ from before.
func changed(ctx context.Context, target, before string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		now, err := Screen(context.WithoutCancel(ctx), target)
		if err == nil && now != before {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PaneInfo is what tmux says of a pane.
type PaneInfo struct {
	ID      string // %N: the pane's id for its whole life
	PID     int    // its first process (the program it was started with)
	Dead    bool   // its program exited and tmux keeps the pane (remain-on-exit)
	Command string // the foreground program (#{pane_current_command})
}

// Probe reads pane target from tmux.
func Probe(ctx context.Context, target string) (PaneInfo, error) {
	out, err := tmuxOut(ctx, "display-message", nil, "display-message", "-p", "-t", target,
		"#{pane_id}\t#{pane_pid}\t#{pane_dead}\t#{pane_current_command}")
	if err != nil {
		return PaneInfo{}, err
	}
	f := strings.SplitN(strings.TrimRight(out, "\n"), "\t", 4)
	if len(f) != 4 || !strings.HasPrefix(f[0], "%") {
		return PaneInfo{}, fmt.Errorf("tmux display-message: no pane %s", target)
	}
	pid, _ := strconv.Atoi(f[1])
	return PaneInfo{ID: f[0], PID: pid, Dead: f[2] == "1", Command: f[3]}, nil
}

// Screen is pane target's screen as text, with where its cursor is and how
// much history it has: two calls return the same string only if nothing
// was shown, moved or scrolled between them.
func Screen(ctx context.Context, target string) (string, error) {
	out, err := tmuxOut(ctx, "capture-pane", nil, "capture-pane", "-p", "-t", target)
	if err != nil {
		return "", err
	}
	pos, err := tmuxOut(ctx, "display-message", nil, "display-message", "-p", "-t", target,
		"#{cursor_x},#{cursor_y},#{history_size}")
	if err != nil {
		return "", err
	}
	return pos + out, nil
}

// IsShell says whether a program name is a shell: a pane that runs one
// has no agent in front.
func IsShell(name string) bool {
	switch strings.TrimPrefix(name, "-") {
	case "sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "tcsh", "csh", "ash", "busybox", "nu", "elvish", "xonsh":
		return true
	}
	return false
}
