package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// fakeWakePane is a pane for the wake part's logic: it records what was
// typed, plays the agent (agent, run at each line typed) and counts the
// loop's rounds (each starts with record).
type fakeWakePane struct {
	mu       sync.Mutex
	lines    []string
	at       []time.Time
	agains   int
	rounds   int
	dialog   string
	detached bool
	agent    func(line string)
	agents   sync.WaitGroup // the agent's turns still running
}

func (f *fakeWakePane) record(context.Context, *mailbox, store.Entity) bool {
	f.mu.Lock()
	f.rounds++
	f.mu.Unlock()
	return false
}

func (f *fakeWakePane) blocked(context.Context, store.Entity) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dialog
}

func (f *fakeWakePane) typeLine(_ context.Context, ent store.Entity, line string) error {
	f.mu.Lock()
	if f.detached {
		f.mu.Unlock()
		return &deliver.DetachedError{Target: ent.TmuxTarget, Want: ent.Program, Found: "bash"}
	}
	f.lines = append(f.lines, line)
	f.at = append(f.at, time.Now())
	agent := f.agent
	f.mu.Unlock()
	if agent != nil {
		f.agents.Add(1)
		go func() { defer f.agents.Done(); agent(line) }()
	}
	return nil
}

func (f *fakeWakePane) again(context.Context, store.Entity) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agains++
	return true
}

func (f *fakeWakePane) typed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}

// settle returns once the loop has made a whole round on what it reads
// now: the round that starts next (the mailbox is notified) has ended
// once the one after it starts.
func (f *fakeWakePane) settle(t *testing.T, b *mailbox) {
	t.Helper()
	f.mu.Lock()
	from := f.rounds
	f.mu.Unlock()
	for n := 1; n <= 2; n++ {
		b.notify()
		wakeEventually(t, "the wake loop's rounds", func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.rounds < from+n {
				return fmt.Errorf("%d rounds", f.rounds-from)
			}
			return nil
		})
	}
}

type wakeRig struct {
	t    *testing.T
	st   *store.Store
	b    *mailbox
	w    *wakes
	pane *fakeWakePane
	logs *wakeLog
}

// wakeLog is the part's log, read while it writes.
type wakeLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *wakeLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *wakeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// eventually waits (up to a generous bound) for f to hold.
func wakeEventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newWakeRig runs the wake part alone, on the real store in a temp folder,
// for one idle hook entity with a pane (a fake one): notices again after
// 100ms doubling up to 400ms, a turn's proof within 600ms.
func newWakeRig(t *testing.T) *wakeRig {
	dir := t.TempDir()
	cfg := &config.Config{Host: "h1", NudgeAfter: 100 * time.Millisecond, NudgeMax: 400 * time.Millisecond,
		ConfirmWithin: 600 * time.Millisecond}
	st, err := store.Open(filepath.Join(dir, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &store.Entity{Gid: ident.NewGid("h1"), Name: "codey", Host: "h1", Mode: "hook",
		TmuxTarget: "%7", PaneID: "%7", Program: "codex", Turns: turnsHooks,
		Status: stIdle, StatusAt: time.Now().UTC(), Created: time.Now().UTC()}
	if err := st.CreateEntity(e); err != nil {
		t.Fatal(err)
	}
	logs := &wakeLog{}
	r := &wakeRig{t: t, st: st, b: &mailbox{ent: *e}, pane: &fakeWakePane{}, logs: logs}
	r.w = newWakes(cfg, st, slog.New(slog.NewTextHandler(logs, nil)), nil, func(string) {})
	r.w.pane = func() wakePane { return r.pane }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.w.Run(ctx, r.b) }()
	t.Cleanup(func() { cancel(); <-done; r.pane.agents.Wait() })
	return r
}

// send stores a message for the entity, as routing does, and says so.
func (r *wakeRig) send(body string) *envelope.Envelope {
	e := r.b.snapshot()
	env := envelope.New(envelope.Send, envelope.Party{Gid: ident.NewGid("h1"), Name: "alice", Host: "h1"},
		envelope.Party{Gid: e.Gid, Name: e.Name, Host: "h1"}, body)
	if _, _, err := r.st.Accept(env, time.Now().UTC()); err != nil {
		r.t.Fatal(err)
	}
	r.b.notify()
	return env
}

func (r *wakeRig) hook(status string) {
	if _, err := r.b.putStatus(r.st, status, "", true, ""); err != nil {
		r.t.Error(err)
	}
}

// drain is the prompt hook's fleet-recv: the drain lease, every waiting
// message acknowledged, the lease given back.
func (r *wakeRig) drain() {
	r.b.mu.Lock()
	r.b.draining = true
	r.b.mu.Unlock()
	r.b.notify()
	items, err := r.st.Head(r.b.snapshot().Gid, 0, 100)
	if err != nil {
		r.t.Error(err)
	}
	var keys []string
	for _, it := range items {
		keys = append(keys, store.Key(it.Env))
	}
	if err := r.st.DeliveredAll(keys, time.Now().UTC()); err != nil {
		r.t.Error(err)
	}
	r.b.mu.Lock()
	r.b.draining = false
	r.b.drains++
	r.b.mu.Unlock()
	r.b.notify()
}

func (r *wakeRig) waitLines(n int) []string {
	r.t.Helper()
	var got []string
	wakeEventually(r.t, fmt.Sprintf("%d wake notices", n), func() error {
		if got = r.pane.typed(); len(got) < n {
			return fmt.Errorf("%d typed: %q", len(got), got)
		}
		return nil
	})
	return got
}

// An idle agent with mail gets one notice: a count, with nothing of the
// messages in it; its turn's prompt hook takes the mail, and no second
// notice follows. The next message gets a notice of its own.
func TestWakeNoticeOnceAndTaken(t *testing.T) {
	r := newWakeRig(t)
	r.pane.agent = func(string) { r.hook(stBusy); r.drain(); r.hook(stIdle) }
	r.pane.settle(t, r.b)
	if got := r.pane.typed(); len(got) != 0 {
		t.Fatalf("typed with no mail: %q", got)
	}
	// (sent while a turn runs: both wait when it ends)
	r.hook(stBusy)
	env1 := r.send("first secret body")
	env2 := r.send("second secret body")
	r.pane.settle(t, r.b)
	r.hook(stIdle)
	got := r.waitLines(1)
	want := "(typed by fleet, not by your user) 2 fleet message(s) wait: they come with this turn"
	if got[0] != want {
		t.Fatalf("notice %q, want %q", got[0], want)
	}
	for _, env := range []*envelope.Envelope{env1, env2} {
		for _, leak := range []string{env.Body, "secret", env.MsgID, "alice", env.Sender.Gid, env.TraceID} {
			if strings.Contains(got[0], leak) {
				t.Fatalf("the notice %q carries %q", got[0], leak)
			}
		}
	}
	wakeEventually(t, "the mail taken", func() error {
		if n := r.st.Pending(r.b.snapshot().Gid); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	r.pane.settle(t, r.b)
	if got := r.pane.typed(); len(got) != 1 {
		t.Fatalf("notices after the mail was taken: %q", got)
	}
	if s, _ := r.w.State(r.b.snapshot().Gid); s.Unanswered != 0 || s.Warned {
		t.Fatalf("state %+v", s)
	}
	r.send("third")
	got = r.waitLines(2)
	if got[1] != wakeLine(1) {
		t.Fatalf("second notice %q", got[1])
	}
	if n := strings.Count(r.logs.String(), "took no mail"); n != 0 {
		t.Fatalf("warned of missing hooks with hooks that work:\n%s", r.logs)
	}
}

// A notice whose turn takes nothing (turn hooks, no prompt hook) is typed
// again after waits that double from nudge-after up to nudge-max; the
// missing hook is said once, with the fix.
func TestWakeRepeatsWithBackoff(t *testing.T) {
	r := newWakeRig(t)
	r.pane.agent = func(string) { r.hook(stBusy); r.hook(stIdle) }
	r.send("hello")
	got := r.waitLines(5)
	for _, l := range got {
		if l != wakeLine(1) {
			t.Fatalf("notice %q", l)
		}
	}
	r.pane.mu.Lock()
	at := append([]time.Time(nil), r.pane.at...)
	r.pane.mu.Unlock()
	pol := []time.Duration{100, 200, 400, 400} // nudge-after doubling, capped at nudge-max (ms)
	for i, d := range pol {
		if gap := at[i+1].Sub(at[i]); gap < d*time.Millisecond {
			t.Errorf("notice %d came %v after the one before, want at least %v", i+2, gap, d*time.Millisecond)
		}
	}
	if n := strings.Count(r.logs.String(), "a wake notice's turn took no mail"); n != 1 {
		t.Fatalf("the missing hook said %d times, want once:\n%s", n, r.logs)
	}
	if !strings.Contains(r.logs.String(), "fleet-roster hooks install codex|gemini --trust") {
		t.Fatalf("no fix in the log:\n%s", r.logs)
	}
	if s, _ := r.w.State(r.b.snapshot().Gid); s.Unanswered < 4 || !s.Warned {
		t.Fatalf("state %+v", s)
	}
	// the hooks fixed: the next notice's turn takes the mail, and the
	// streak is over
	r.pane.mu.Lock()
	r.pane.agent = func(string) { r.hook(stBusy); r.drain(); r.hook(stIdle) }
	r.pane.mu.Unlock()
	wakeEventually(t, "the mail taken", func() error {
		if n := r.st.Pending(r.b.snapshot().Gid); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	wakeEventually(t, "the streak over", func() error {
		if s, _ := r.w.State(r.b.snapshot().Gid); s.Unanswered != 0 || s.Warned {
			return fmt.Errorf("state %+v", s)
		}
		return nil
	})
}

// Nothing is typed while the agent is busy, while a hook's fleet-recv
// drains, while a dialog is on its screen, or into a pane whose program
// is not the agent (detached, mail held).
func TestWakeHeldBack(t *testing.T) {
	r := newWakeRig(t)
	r.pane.agent = func(string) { r.hook(stBusy); r.drain(); r.hook(stIdle) }
	r.hook(stBusy)
	r.send("while busy")
	r.pane.settle(t, r.b)
	if got := r.pane.typed(); len(got) != 0 {
		t.Fatalf("typed while busy: %q", got)
	}
	// idle, but a hook drains
	r.b.mu.Lock()
	r.b.draining = true
	r.b.mu.Unlock()
	r.hook(stIdle)
	r.pane.settle(t, r.b)
	if got := r.pane.typed(); len(got) != 0 {
		t.Fatalf("typed while a hook drains: %q", got)
	}
	// a dialog on the screen
	r.pane.mu.Lock()
	r.pane.dialog = "a dialog is open in the pane (Do you trust the files in this folder?)"
	r.pane.mu.Unlock()
	r.b.mu.Lock()
	r.b.draining = false
	r.b.mu.Unlock()
	r.b.notify()
	r.pane.settle(t, r.b)
	if got := r.pane.typed(); len(got) != 0 {
		t.Fatalf("typed over a dialog: %q", got)
	}
	// the pane's program is not the agent: nothing typed, detached
	r.pane.mu.Lock()
	r.pane.dialog, r.pane.detached = "", true
	r.pane.mu.Unlock()
	r.b.notify()
	wakeEventually(t, "detached", func() error {
		if e := r.b.snapshot(); e.Status != stDetached || e.StatusReason != "pane %7 runs bash, not codex" {
			return fmt.Errorf("%s (%s)", e.Status, e.StatusReason)
		}
		return nil
	})
	if got := r.pane.typed(); len(got) != 0 {
		t.Fatalf("typed into a pane without its agent: %q", got)
	}
	if n := r.st.Pending(r.b.snapshot().Gid); n != 1 {
		t.Fatalf("%d pending, want the message held", n)
	}
	// the agent back, its first hook: one notice, the mail taken
	r.pane.mu.Lock()
	r.pane.detached = false
	r.pane.mu.Unlock()
	r.hook(stIdle)
	if got := r.waitLines(1); got[0] != wakeLine(1) {
		t.Fatalf("notice %q", got[0])
	}
	wakeEventually(t, "the mail taken", func() error {
		if n := r.st.Pending(r.b.snapshot().Gid); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
}

// A notice that starts no turn (no busy hook within confirm-within) gets
// one more Enter, then leaves the agent idle again, not busy; the mail
// stays pending (the notice delivers nothing) and the notice comes again.
func TestWakeUnconfirmed(t *testing.T) {
	r := newWakeRig(t)
	env := r.send("hello")
	r.waitLines(1)
	wakeEventually(t, "idle again", func() error {
		if e := r.b.snapshot(); e.Status != stIdle {
			return fmt.Errorf("%s (%s)", e.Status, e.StatusReason)
		}
		return nil
	})
	r.pane.mu.Lock()
	agains := r.pane.agains
	r.pane.mu.Unlock()
	if agains != 1 {
		t.Fatalf("%d second Enters, want 1", agains)
	}
	r.waitLines(2)
	if rec, err := r.st.Record(store.Key(env)); err != nil || rec.State == store.Delivered {
		t.Fatalf("record %+v, %v: the notice delivered it", rec, err)
	}
	if n := r.st.Pending(r.b.snapshot().Gid); n != 1 {
		t.Fatalf("%d pending: the notice delivered something", n)
	}
	if !strings.Contains(r.logs.String(), "showed no sign of taking it") {
		t.Fatalf("log:\n%s", r.logs)
	}
}
