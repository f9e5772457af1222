package deliver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// pane starts a private tmux server with one session whose program enables
// bracketed paste, switches its terminal to raw mode and records every byte
// it reads. It returns the pane's target and the recording's path.
func pane(t *testing.T) (target, rec string) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (make test installs it): ", err)
	}
	dir := t.TempDir()
	t.Setenv("TMUX_TMPDIR", dir)
	t.Setenv("TMUX", "")
	rec = filepath.Join(dir, "rec")
	prog := `printf '\033[?2004h'; stty raw -echo; echo ready > ` + rec + `.ready; exec cat > ` + rec
	if out, err := exec.Command("tmux", "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "200", "-y", "20", prog).CombinedOutput(); err != nil {
		t.Fatalf("tmux new-session: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("tmux", "kill-server").Run() })
	waitFile(t, rec+".ready", func(b []byte) bool { return len(b) > 0 })
	time.Sleep(200 * time.Millisecond) // tmux reads the ESC[?2004h
	return "t:0.0", rec
}

func waitFile(t *testing.T, path string, ok func([]byte) bool) []byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if ok(b) {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %q", path, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Both forms, chosen by the pane's bracketed paste flag in one tmux command:
// the flag forced to 1 (what a tmux with #{bracket_paste_flag} reports for
// this pane) pastes Text, bracketed, newlines as LF; forced to 0 (or a tmux
// without the format) pastes Line. Either way the only CR is the Enter.
func TestTmuxDeliverForms(t *testing.T) {
	env := &envelope.Envelope{
		Kind: envelope.Send, MsgID: "m-1", Sender: envelope.Party{Name: "alice", Host: "h1"},
		Recipient: envelope.Party{Gid: "g"}, Created: time.Now(),
		Body: "one\x1b[201~\r\n\ttwo\x03\n",
	}
	for _, tc := range []struct {
		flag, want string
	}{
		{"1", "\x1b[200~" + Text(env) + "\x1b[201~\r"},
		{"0", "\x1b[200~" + Line(env) + "\x1b[201~\r"},
		{"#{bracket_paste_flag}", "\x1b[200~" + Line(env) + "\x1b[201~\r"}, // tmux 3.3a: unknown
	} {
		t.Run(tc.flag, func(t *testing.T) {
			old := bracketFlag
			bracketFlag = tc.flag
			defer func() { bracketFlag = old }()
			target, rec := pane(t)
			x := &Tmux{Target: target, Settle: 20 * time.Millisecond}
			if err := x.Deliver(context.Background(), env); err != nil {
				t.Fatal(err)
			}
			waitFile(t, rec, func(b []byte) bool { return bytes.HasSuffix(b, []byte("\r")) })
			time.Sleep(200 * time.Millisecond) // anything after the Enter would show
			got, _ := os.ReadFile(rec)
			if string(got) != tc.want {
				t.Errorf("pane got\n%q\nwant\n%q", got, tc.want)
			}
			out, _ := exec.Command("tmux", "list-buffers").CombinedOutput()
			if strings.Contains(string(out), "fleet-") {
				t.Errorf("buffers left behind: %s", out)
			}
		})
	}
}

func TestTmuxDeliverNoPane(t *testing.T) {
	pane(t)
	for _, target := range []string{"nosuch:9.9", "no such'pane"} {
		x := &Tmux{Target: target}
		err := x.Deliver(context.Background(), &envelope.Envelope{Kind: envelope.Send, MsgID: "m 'x", Body: "hi"})
		if err == nil || errors.Is(err, ErrUncertain) || !strings.Contains(err.Error(), "tmux paste-buffer: can't find") {
			t.Errorf("Deliver to %q: err = %v, want tmux paste-buffer: can't find ...", target, err)
		}
	}
	out, _ := exec.Command("tmux", "list-buffers").CombinedOutput()
	if strings.Contains(string(out), "fleet-") {
		t.Errorf("buffers left behind: %s", out)
	}
}

// The foreground guard: the paste and the Enter reach the pane only while
// its foreground program is the entity's; a pane back at its shell, or
// running another program, gets no byte, and Deliver says what it found.
// Every paste setting and header place, pasted into the program it names.
func TestTmuxDeliverForeground(t *testing.T) {
	env := &envelope.Envelope{
		Kind: envelope.Send, MsgID: "m-2", Sender: envelope.Party{Name: "alice", Host: "h1"},
		Recipient: envelope.Party{Gid: "g"}, Created: time.Now(),
		Body: "status please; echo PWNED > x\nsecond line",
	}
	target, rec := pane(t) // its foreground program is cat (exec cat)
	p, err := Probe(context.Background(), target)
	if err != nil || p.Command != "cat" || !strings.HasPrefix(p.ID, "%") || p.PID == 0 || p.Dead {
		t.Fatalf("Probe = %+v, %v; want cat in a live pane", p, err)
	}
	for _, prog := range []string{"bash", "claude"} {
		x := &Tmux{Target: p.ID, Settle: 20 * time.Millisecond, Program: prog}
		err := x.Deliver(context.Background(), env)
		var d *DetachedError
		if !errors.As(err, &d) || d.Found != "cat" || d.Want != prog || errors.Is(err, ErrUncertain) {
			t.Fatalf("Deliver into a pane running cat, as %s: err = %v, want a DetachedError (found cat)", prog, err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if got, _ := os.ReadFile(rec); len(got) != 0 {
		t.Fatalf("the pane received %q from a delivery to another program", got)
	}
	want := ""
	for _, tc := range []struct{ paste, header, text string }{
		{PasteLine, HeaderBefore, Line(env)},
		{PasteBracketed, HeaderAfter, Format(env, HeaderAfter, true)},
		{PasteLine, HeaderOff, "status please; echo PWNED > x␊second line"},
		{PasteBracketed, HeaderOff, "status please; echo PWNED > x\nsecond line"},
	} {
		x := &Tmux{Target: p.ID, Settle: 20 * time.Millisecond, Program: "cat", Paste: tc.paste, Header: tc.header}
		if err := x.Deliver(context.Background(), env); err != nil {
			t.Fatalf("%s/%s: %v", tc.paste, tc.header, err)
		}
		want += "\x1b[200~" + tc.text + "\x1b[201~\r"
		waitFile(t, rec, func(b []byte) bool { return string(b) == want })
	}
	// this pane's program echoes nothing: an Enter that must show on the
	// screen is uncertain (the proof a program without hooks gives)
	x := &Tmux{Target: p.ID, Settle: 20 * time.Millisecond, Program: "cat", Confirm: 300 * time.Millisecond}
	if err := x.Deliver(context.Background(), env); !errors.Is(err, ErrUncertain) || !strings.Contains(err.Error(), "changed nothing on the screen") {
		t.Fatalf("Deliver with a screen confirmation into a pane that shows nothing: %v", err)
	}
	if !strings.HasSuffix(Format(env, HeaderAfter, true), "\n"+header(env)) {
		t.Errorf("HeaderAfter: %q", Format(env, HeaderAfter, true))
	}
	// the program exits: the pane is dead (remain-on-exit) or gone
	exec.Command("tmux", "set-option", "-g", "remain-on-exit", "on").Run()
	exec.Command("tmux", "respawn-pane", "-k", "-t", p.ID, "true").Run()
	time.Sleep(300 * time.Millisecond)
	x = &Tmux{Target: p.ID, Program: "cat"}
	var d *DetachedError
	if err := x.Deliver(context.Background(), env); !errors.As(err, &d) || !d.Dead {
		t.Fatalf("Deliver into a dead pane: %v, want a DetachedError (dead)", err)
	}
}

func TestIsShell(t *testing.T) {
	for _, s := range []string{"bash", "-bash", "sh", "zsh", "fish", "dash"} {
		if !IsShell(s) {
			t.Errorf("IsShell(%q) = false", s)
		}
	}
	for _, s := range []string{"claude", "node", "codex", "ipython3", "cat", ""} {
		if IsShell(s) {
			t.Errorf("IsShell(%q) = true", s)
		}
	}
}

// panes starts a private tmux server with n windows whose programs record
// every byte they read in raw mode (no bracketed paste: Line is pasted),
// and returns their targets and recordings.
func panes(t *testing.T, n int) (targets, recs []string) {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is required (make test installs it): ", err)
	}
	dir := t.TempDir()
	t.Setenv("TMUX_TMPDIR", dir)
	t.Setenv("TMUX", "")
	t.Cleanup(func() { exec.Command("tmux", "kill-server").Run() })
	for i := 0; i < n; i++ {
		rec := filepath.Join(dir, "rec"+strconv.Itoa(i))
		prog := `stty raw -echo; echo ready > ` + rec + `.ready; exec cat > ` + rec
		args := []string{"-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "200", "-y", "20", prog}
		if i > 0 {
			args = []string{"new-window", "-d", "-t", "t:" + strconv.Itoa(i), prog}
		}
		if out, err := exec.Command("tmux", args...).CombinedOutput(); err != nil {
			t.Fatalf("tmux %s: %v: %s", args[0], err, out)
		}
		waitFile(t, rec+".ready", func(b []byte) bool { return len(b) > 0 })
		targets = append(targets, "t:"+strconv.Itoa(i)+".0")
		recs = append(recs, rec)
	}
	return targets, recs
}

// The copies of one broadcast reach the panes of one host at once, each
// pane's in order (the gateway delivers each inbox in its own goroutine):
// every delivery has buffers of its own, so every paste succeeds at its
// first attempt, each pane gets each message once, and no buffer is left
// behind. With buffers named by msg id alone, one copy's paste (-d)
// deleted the buffer of another ("no buffer fleet-<id>-line").
func TestTmuxBroadcastCopiesDoNotRace(t *testing.T) {
	const n, msgs = 4, 10
	targets, recs := panes(t, n)
	envs := make([]*envelope.Envelope, msgs)
	for i := range envs {
		envs[i] = &envelope.Envelope{
			Kind: envelope.Broadcast, MsgID: "bc-" + strconv.Itoa(i), Sender: envelope.Party{Name: "main", Host: "h1"},
			Recipient: envelope.Party{Group: "crew"}, Created: time.Now(), Body: "broadcast " + strconv.Itoa(i) + "\nto the crew",
		}
	}
	errs := make(chan error, n*msgs)
	var wg sync.WaitGroup
	for p := range targets {
		wg.Add(1)
		go func(target string) {
			defer wg.Done()
			x := &Tmux{Target: target, Settle: 10 * time.Millisecond, Paste: PasteLine}
			for _, env := range envs {
				if err := x.Deliver(context.Background(), env); err != nil {
					errs <- fmt.Errorf("%s, %s: %w", target, env.MsgID, err)
				}
			}
		}(targets[p])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error("a first attempt failed: ", err)
	}
	want := ""
	for _, env := range envs {
		want += Line(env) + "\r"
	}
	for _, rec := range recs {
		waitFile(t, rec, func(b []byte) bool { return len(b) >= len(want) })
		time.Sleep(100 * time.Millisecond) // anything more would show
		got, _ := os.ReadFile(rec)
		if string(got) != want {
			t.Errorf("%s got\n%q\nwant\n%q", rec, got, want)
		}
	}
	out, _ := exec.Command("tmux", "list-buffers").CombinedOutput()
	if strings.Contains(string(out), "fleet-") {
		t.Errorf("buffers left behind: %s", out)
	}
}

// Two deliveries of one message to one pane never share a buffer name.
func TestBufferIDPerDelivery(t *testing.T) {
	a, b := bufferID("m-1", "%3"), bufferID("m-1", "%3")
	if a == b || !quotable("fleet-"+a+"-text") {
		t.Errorf("bufferID gave %q and %q", a, b)
	}
	if c := bufferID("m-1", "%4"); c[:12] == a[:12] {
		t.Errorf("two panes, one message: %q and %q share the message-and-pane part", a, c)
	}
}
