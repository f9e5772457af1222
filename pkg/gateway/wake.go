package gateway

// The wake notice: how the gateway wakes the idle agent of a hook entity
// joined with a pane (fleet-roster join NAME --mode hook --tmux-target
// PANE) when its CLI has no hook that can start a turn by itself (Codex,
// Gemini CLI; Claude Code's asyncRewake hook needs no pane).
//
// While mail waits and the agent is idle, the gateway types one fixed line
// into the pane and presses Enter, by the inject path and under its rules
// (agent.go: the program in front, idle from the agent's own hooks, no
// dialog on the screen, nothing typed into a pane whose agent exited, the
// second Enter when the line still shows):
//
//	(typed by fleet, not by your user) N fleet message(s) wait: they come with this turn
//
// a count only — no byte of any message, no sender, no id. The turn it
// starts runs the agent's prompt hook (fleet-recv --hook CLI --event
// prompt), which hands the mail over and acknowledges it: the notice
// itself delivers nothing, and nothing is marked delivered because of it.
// A notice whose turn took nothing (the inbox's head is the same message
// once the agent is idle again) is typed again after a wait that doubles
// from nudge-after up to nudge-max, and the gateway says once, with the
// fix, that the agent's prompt hook does not run.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/store"
)

// wakeMarker opens every wake notice: what the agent reads first, and what
// the second Enter looks for on the screen.
const wakeMarker = "(typed by fleet, not by your user)"

// wakeLine is the notice for n waiting messages.
func wakeLine(n int) string {
	return fmt.Sprintf("%s %d fleet message(s) wait: they come with this turn", wakeMarker, n)
}

// wakeReason is the reason of the gateway's own busy from a notice.
const wakeReason = "a wake notice was typed"

// wakePane is what the wake part does to an entity's pane: paneWaker (the
// safety net and the tmux adapter of agent.go) in the gateway, a fake in
// the tests of the part's logic. One per entity (it may keep a memory of
// the screen).
type wakePane interface {
	// record applies the safety net to ent (agentWatch.record): true when
	// a status was recorded and the caller must look again.
	record(ctx context.Context, b *mailbox, ent store.Entity) bool
	// blocked says why nothing may be typed now though the agent reads
	// idle (a dialog on its screen), or "".
	blocked(ctx context.Context, ent store.Entity) string
	// typeLine pastes line into ent's pane and presses Enter, only while
	// its program is in front (deliver.Tmux.Type).
	typeLine(ctx context.Context, ent store.Entity, line string) error
	// again presses Enter once more when the typed line still shows and
	// nothing else could take the Enter (againEnter), and says so.
	again(ctx context.Context, ent store.Entity) bool
}

// wakeState is what the part did for one entity (wakes.State).
type wakeState struct {
	Notices    int       // notices typed since the entity's mail started waiting
	Unanswered int       // of them, in a row, whose turn took nothing
	Last       time.Time // when the last was typed
	Warned     bool      // the missing prompt hook was said (once a streak)
}

// wakes is the gateway's wake notice: one loop per hook entity with a
// pane, started and stopped with the entity's delivery (inboxes.Add, Remove).
type wakes struct {
	cfg      *config.Config
	st       *store.Store
	log      *slog.Logger
	audit    *audit.Log
	announce func(gid string)      // a status recorded: tell the other hosts
	pane     func() wakePane       // a new pane for an entity's loop
	mu       sync.Mutex            // guards state
	state    map[string]*wakeState // gid -> its loop's doings, while it runs
}

func newWakes(cfg *config.Config, st *store.Store, log *slog.Logger, a *audit.Log, announce func(gid string)) *wakes {
	w := &wakes{cfg: cfg, st: st, log: log, audit: a, announce: announce, state: map[string]*wakeState{}}
	w.pane = func() wakePane { return &paneWaker{w: w, net: &agentWatch{cfg: cfg}} }
	return w
}

// wantsWake says whether entity e is the part's: a hook entity with a pane.
func wantsWake(e *store.Entity) bool { return e.Mode == "hook" && e.TmuxTarget != "" }

// State is what the loop of entity gid did so far (false: none runs).
func (w *wakes) State(gid string) (wakeState, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.state[gid]
	if !ok {
		return wakeState{}, false
	}
	return *s, true
}

func (w *wakes) put(gid string, f func(*wakeState)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.state[gid]
	if s == nil {
		s = &wakeState{}
		w.state[gid] = s
	}
	f(s)
}

// Run is the loop of b's entity, until ctx ends: the safety net on its
// pane, and a notice whenever mail waits and its agent is idle.
func (w *wakes) Run(ctx context.Context, b *mailbox) {
	ent := b.snapshot()
	gid, log := ent.Gid, w.log.With("entity", ent.Name)
	w.put(gid, func(*wakeState) {})
	defer func() {
		w.mu.Lock()
		delete(w.state, gid)
		w.mu.Unlock()
	}()
	pane := w.pane()
	pol := backoff.Policy{Base: w.cfg.NudgeAfter, Max: w.cfg.NudgeMax}
	var (
		head string    // the inbox's head when the last notice was typed ("": none typed)
		due  time.Time // when a notice whose turn took nothing may be typed again
		n    int       // notices in a row whose turn took nothing
		// what the loop last said of waiting mail it held back, and
		// whether mail waited since it last said nothing does: each said
		// once, a test's sentinel that the loop saw the inbox and chose
		// not to type (never a byte of a message: its key, counts, states)
		said   string
		waited bool
	)
	for {
		changed := b.watch()
		if ctx.Err() != nil {
			return
		}
		ent := b.snapshot()
		if pane.record(ctx, b, ent) {
			continue
		}
		now := time.Now()
		count, h := w.waiting(b, now)
		b.mu.Lock()
		draining := b.draining
		b.mu.Unlock()
		if count == 0 {
			// nothing waits: a streak of unanswered notices is over
			head, due, n = "", time.Time{}, 0
			w.put(gid, func(s *wakeState) { s.Notices, s.Unanswered, s.Warned = 0, 0, false })
			if waited {
				waited, said = false, ""
				log.Info("no wake notice: nothing waits")
			}
		} else {
			waited = true
		}
		if count > 0 && (ent.Status != stIdle || draining) {
			if key := h + " " + ent.Status + " " + strconv.FormatBool(draining); key != said {
				said = key
				log.Info("wake notice held: the agent is not idle", "status", ent.Status, "draining", draining, "head", h, "pending", count)
			}
		}
		if count == 0 || ent.Status != stIdle || draining {
			// an idle pane is looked at now and then, so that an agent
			// that exited reads detached before mail comes for it
			tick := time.Duration(0)
			if watched(ent) {
				tick = time.Second
			} else if ent.Status == stIdle && ent.Program != "" {
				tick = idleLook
			}
			wait(ctx, changed, tick)
			continue
		}
		if head != "" && h != head {
			// the last notice's turn took mail: the hooks work
			head, due, n = "", time.Time{}, 0
			w.put(gid, func(s *wakeState) { s.Unanswered, s.Warned = 0, false })
		}
		if head != "" {
			// idle again, and the same message heads the inbox: the turn
			// the notice started took nothing
			if due.IsZero() {
				n++
				due = now.Add(pol.Delay(n))
				warn := false
				w.put(gid, func(s *wakeState) { s.Unanswered, warn, s.Warned = n, !s.Warned, true })
				if warn {
					log.Warn("a wake notice's turn took no mail: the agent's hooks did not run fleet-recv --hook (not installed, or not trusted)",
						"pending", count,
						"fix", "install the recipe's hooks and trust them: fleet-roster hooks install codex|gemini --trust (then restart the agent)")
				}
				log.Info("wake notice unanswered: typed again later", "unanswered", n, "again_in", due.Sub(now).String())
			}
			if now.Before(due) {
				wait(ctx, changed, due.Sub(now))
				continue
			}
		}
		if why := pane.blocked(ctx, ent); why != "" {
			if key := h + " blocked " + why; key != said {
				said = key
				log.Info("wake notice held: "+why, "head", h, "pending", count)
			}
			wait(ctx, changed, time.Second)
			continue
		}
		// busy from the notice, as from a paste: nothing is typed again
		// until the agent's hooks say how its turn went — and nothing is
		// typed if a hook came since the status was read
		if _, err := b.putStatusFrom(w.st, &ent, stBusy, wakeReason, false, ""); err != nil {
			if !errors.Is(err, errStale) {
				log.Error("recording the status", "err", err)
				backoff.Sleep(ctx, time.Second)
			}
			continue
		}
		b.mu.Lock()
		draining = b.draining
		b.mu.Unlock()
		if again, _ := w.waiting(b, time.Now()); again == 0 || draining {
			// taken meanwhile (a fleet-recv began): nothing to wake it for
			if perr := notPasted(b, w.st, errors.New("nothing waits")); perr != nil {
				log.Error("recording the status", "err", perr)
			}
			continue
		}
		typed := time.Now()
		err := pane.typeLine(ctx, ent, wakeLine(count))
		if err != nil && !errors.Is(err, deliver.ErrUncertain) {
			// nothing was typed: detached, or idle again
			if perr := notPasted(b, w.st, err); perr != nil {
				log.Error("recording the status", "err", perr)
			}
			w.announce(gid)
			log.Warn("wake notice not typed", "err", err)
			if !errors.Is(err, deliver.ErrDetached) {
				backoff.Sleep(ctx, time.Second)
			}
			continue
		}
		head, due = h, time.Time{}
		w.put(gid, func(s *wakeState) { s.Notices++; s.Last = typed })
		w.audit.Write(audit.Line{Event: "wake", Entity: ent.Name, Attempt: n + 1})
		if err != nil {
			log.Warn("wake notice typed, its Enter uncertain", "err", err)
		}
		if !b.confirmed(ctx, typed, w.cfg.ConfirmWithin/3) && pane.again(ctx, ent) {
			log.Info("no busy hook and the wake notice still shows: Enter once more")
		}
		if !b.confirmed(ctx, typed, w.cfg.ConfirmWithin*2/3) {
			// no turn started: idle again from the gateway's own busy, and
			// the notice counts as one whose turn took nothing
			if perr := notPasted(b, w.st, errors.New("no busy hook")); perr != nil {
				log.Error("recording the status", "err", perr)
			}
			log.Warn("wake notice typed, but the agent showed no sign of taking it (no busy hook)", "within", w.cfg.ConfirmWithin.String())
			continue
		}
		log.Info("wake notice typed", "pending", count)
	}
}

// waiting is how many messages wait for b's entity (live asks and stored
// mail) and which heads them (its key, or "").
func (w *wakes) waiting(b *mailbox, now time.Time) (int, string) {
	asks := b.liveHead(now)
	gid := b.snapshot().Gid
	n := len(asks) + w.st.Pending(gid)
	if len(asks) > 0 {
		return n, asks[0].MsgID
	}
	if n == 0 {
		return 0, ""
	}
	items, err := w.st.Head(gid, 0, 1)
	if err != nil || len(items) == 0 {
		return n, ""
	}
	return n, store.Key(items[0].Env)
}

// wait returns at the next change, when ctx ends, or after d (0: never).
func wait(ctx context.Context, changed <-chan struct{}, d time.Duration) {
	var tick <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-ctx.Done():
	case <-changed:
	case <-tick:
	}
}

// paneWaker is a wakePane on a real tmux pane, by agent.go's rules.
type paneWaker struct {
	w   *wakes
	net *agentWatch
}

func (p *paneWaker) record(ctx context.Context, b *mailbox, ent store.Entity) bool {
	return p.net.record(ctx, b, ent, p.w.st, p.w.log, p.w.announce)
}

func (p *paneWaker) blocked(ctx context.Context, ent store.Entity) string {
	s, err := deliver.Screen(ctx, ent.PaneTarget())
	if err != nil {
		return "its screen cannot be read: " + err.Error()
	}
	if m := dialogRE.FindString(s); m != "" {
		return "a dialog is open in the pane (" + strings.TrimSpace(m) + ")"
	}
	if restoredRE.MatchString(s) {
		return "an interrupted message is back in the agent's input"
	}
	return ""
}

func (p *paneWaker) typeLine(ctx context.Context, ent store.Entity, line string) error {
	return tmuxAdapter(ent, p.w.cfg).Type(ctx, "wake", line)
}

func (p *paneWaker) again(ctx context.Context, ent store.Entity) bool {
	if !againEnter(ctx, ent, wakeMarker) {
		return false
	}
	if err := tmuxAdapter(ent, p.w.cfg).Enter(ctx); err != nil {
		p.w.log.Warn("second Enter", "entity", ent.Name, "err", err)
	}
	return true
}
