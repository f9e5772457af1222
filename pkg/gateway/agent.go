package gateway

// The last metre: what the gateway knows of the agent in an inject entity's
// tmux pane beyond what the agent's own turn hooks say, and the rules that
// keep its mail flowing without ever typing into the wrong program. A hook
// entity joined with its pane is watched by the same rules (wake.go types
// its wake notice under them).
//
// An entity's status (store.Entity.Status, the roster's vocabulary):
//
//	starting  joined or spawned, or its program came back to the pane:
//	          nothing is pasted until the agent's first hook (its idle)
//	idle      the agent's hook said its turn ended (or, stuck, its screen
//	          stood still for the entity's idle-screen time)
//	busy      the agent's hook said a turn started, or the gateway is
//	          submitting a paste (busy from the paste: a second message is
//	          never pasted before the agent's own busy hook has run)
//	stuck     busy for stuck-after with no hook: mail is held; with
//	          idle-screen set, idle is read from the screen
//	unhooked  starting for start-bound with no hook: mail is held, with a
//	          hint (the agent's hooks are not installed, or not trusted)
//	detached  the pane does not run the entity's program (a shell, another
//	          program, a dead or gone pane): nothing is typed, mail is
//	          held until the program is back
//
// and "waiting" (idle, on an ask of its own; row() says so). A paste is
// delivered only once the agent shows it took it: its busy hook within
// confirm-within, or, for a program without turn hooks (turns none), a
// screen that changed at the Enter (deliver.Tmux.Confirm). Whatever else
// happens to a pasted message is "uncertain", never "delivered".
//
// A hook is the agent's by the process that runs it: `fleet-roster status
// busy --pane` (what fleet-turn runs inside tmux) is matched to the entity
// whose pane's first process is an ancestor of the caller (agentOf), not by
// an environment a process serving several sessions could have inherited.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// The statuses, in the order the docs list them.
const (
	stIdle     = "idle"
	stBusy     = "busy"
	stWaiting  = "waiting"
	stStarting = "starting"
	stStuck    = "stuck"
	stDetached = "detached"
	stUnhooked = "unhooked"
)

var statuses = []string{stIdle, stBusy, stWaiting, stStarting, stStuck, stDetached, stUnhooked}

func knownStatus(s string) bool { return slices.Contains(statuses, s) }

// wireStatus is a status as other hosts hear it: the safety net's states
// are "busy" there (the entity takes no mail now), which every gateway
// version reads — one from before these states refuses a snapshot that
// holds an unknown status, and would lose this host's whole roster.
func wireStatus(s string) string {
	switch s {
	case stStarting, stStuck, stUnhooked, stDetached:
		return stBusy
	}
	return s
}

// onWire makes r a row for other hosts: its status as they hear it, and
// nothing of why (a pane's program and state are this host's business;
// a reason that changes would cost a notice each time).
func onWire(r *api.EntityRow) {
	if wireStatus(r.Status) != r.Status {
		// the others hear busy, since a time this host does not keep:
		// none is said, rather than the time of the held state
		r.StatusSince = time.Time{}
	}
	r.Status, r.StatusReason, r.Program = wireStatus(r.Status), "", ""
	r.Accept, r.AcceptFrom = nil, "" // who may reach it is this host's business (policy.go)
	r.InterruptOnUrgent = ""
}

// The turns setting: where busy and idle come from.
const (
	turnsHooks = "hooks" // the agent's own hooks (the default)
	turnsNone  = "none"  // a program without turns (a REPL, a shell worker): idle whenever its pane runs it
)

// checkPane holds an entity's pane settings to their grammar.
func checkPane(e *store.Entity) error {
	usage := func(format string, args ...any) error {
		return fault.New(fault.Usage, fault.KindUsage, format, args...)
	}
	if e.TmuxTarget == "" {
		if e.Program != "" || e.Turns != "" || e.Paste != "" || e.Header != "" || e.IdleScreen != 0 || e.InterruptOnUrgent != "" {
			return usage("--program, --turns, --paste, --header, --idle-screen and --interrupt-on-urgent are for a --tmux-target entity")
		}
		return nil
	}
	if e.Program != "" && !deliver.ProgramOK(e.Program) {
		return usage("%q is not a program name as tmux shows it (letters, digits, _ . + -)", e.Program)
	}
	switch e.Turns {
	case "", turnsHooks, turnsNone:
	default:
		return usage("--turns takes hooks or none, not %q", e.Turns)
	}
	switch e.Paste {
	case "", deliver.PasteAuto, deliver.PasteLine, deliver.PasteBracketed:
	default:
		return usage("--paste takes auto, line or bracketed, not %q", e.Paste)
	}
	switch e.Header {
	case "", deliver.HeaderBefore, deliver.HeaderAfter, deliver.HeaderOff:
	default:
		return usage("--header takes before, after or off, not %q", e.Header)
	}
	if e.IdleScreen < 0 {
		return usage("--idle-screen must not be negative")
	}
	return nil
}

// bindPane reads a new tmux entity's pane: its id (what the gateway
// addresses from now on) and first process, the program in front unless
// one was named (a shell in front is no agent: its first hook names the
// program then; with turns none the pane's program is taken as it is), and
// its first status.
func bindPane(ctx context.Context, e *store.Entity) error {
	p, err := deliver.Probe(ctx, e.TmuxTarget)
	if err != nil {
		return fault.Wrap(fault.Usage, fault.KindUsage, err, "the gateway cannot see tmux pane %s", e.TmuxTarget).
			WithHint("name a pane of the tmux server the gateway uses (in the pane: --tmux-target $TMUX_PANE)")
	}
	if p.Dead {
		return fault.New(fault.Usage, fault.KindUsage, "tmux pane %s is dead", e.TmuxTarget)
	}
	e.PaneID, e.PanePID = p.ID, p.PID
	if e.Turns == "" {
		e.Turns = turnsHooks
	}
	if e.Program == "" && (e.Turns == turnsNone || agentInFront(p)) {
		e.Program = p.Command
	}
	if agentInFront(p) && e.Turns != turnsNone {
		// the process in front is the agent joined: the program in front
		// must stay that process (its first hook says so again)
		if fg, _, ok := stat(p.PID); ok {
			if _, start, ok := stat(fg); ok {
				e.AgentPID, e.AgentStart = fg, start
			}
		}
	}
	if e.Turns == turnsNone {
		if e.Program == "" {
			return fault.New(fault.Usage, fault.KindUsage, "pane %s runs %q, which cannot be checked before a paste", e.TmuxTarget, p.Command).
				WithHint("name the program: --program NAME")
		}
		e.Status = stIdle
		return nil
	}
	e.Status, e.StatusReason = stStarting, "waiting for the agent's first hook"
	return nil
}

// notPasted records what a paste that typed nothing (err) leaves a tmux
// entity as: detached when its program was not in front, else idle again
// (it was busy from the paste only).
func notPasted(b *mailbox, st *store.Store, err error) error {
	if errors.Is(err, deliver.ErrDetached) {
		_, perr := b.putStatus(st, stDetached, err.Error(), false, "")
		return perr
	}
	// back to idle only from the gateway's own busy: a hook's busy stays
	if e := b.snapshot(); e.Status == stBusy && (e.StatusReason == pastedReason || e.StatusReason == wakeReason) {
		_, perr := b.putStatusFrom(st, &e, stIdle, "", false, "")
		if errors.Is(perr, errStale) {
			return nil
		}
		return perr
	}
	return nil
}

// notTheAgent ends the reason of a starting entity whose program in front
// is not the process its hooks came from (the delivery loop forgets that
// process then: the next hook binds the one in front).
const notTheAgent = " in the pane is not the process its hooks came from: waiting for a hook from it"

// againEnter says whether a second Enter may go to ent's pane for the
// message msgID, pasted and not taken: the pasted text still shows (its
// id), and no turn runs and no dialog is on the screen — so the Enter can
// only submit that text.
func againEnter(ctx context.Context, ent store.Entity, msgID string) bool {
	now, err := deliver.Screen(ctx, ent.PaneTarget())
	return err == nil && strings.Contains(now, msgID) && !workingRE.MatchString(now) && !dialogRE.MatchString(now)
}

// pastedReason is the reason of the gateway's own busy (from a paste).
const pastedReason = "a message was pasted"

// bindOld fills in the pane of a tmux entity stored before panes were
// bound (no PaneID): its pane now, as bindPane would, and turns none — it
// was pasted into whenever it read idle, hooks or not. A pane that cannot
// be seen leaves it as it is (its program unknown: nothing is pasted).
func bindOld(ctx context.Context, b *mailbox, st *store.Store) {
	e := b.snapshot()
	if e.TmuxTarget == "" || e.PaneID != "" {
		return
	}
	p, err := deliver.Probe(ctx, e.TmuxTarget)
	if err != nil || p.Dead {
		return
	}
	program := ""
	if agentInFront(p) || deliver.ProgramOK(p.Command) && e.Turns == turnsNone {
		program = p.Command
	}
	// not bound if the store fails: the next look tries again
	b.update(st, func(x *store.Entity) error {
		x.PaneID, x.PanePID = p.ID, p.PID
		if x.Turns == "" {
			x.Turns = turnsNone
		}
		if x.Program == "" {
			x.Program = program
		}
		return nil
	})
}

// tmuxAdapter is the tmux adapter for e: its pane by id, its program and
// paste settings.
func tmuxAdapter(e store.Entity, cfg *config.Config) *deliver.Tmux {
	t := &deliver.Tmux{Target: e.TmuxTarget, Settle: cfg.SettleDelay, Program: e.Program, Paste: e.Paste, Header: e.Header}
	if e.PaneID != "" {
		t.Target = e.PaneID
	}
	if e.Turns == turnsNone {
		t.Confirm = cfg.ConfirmWithin // no hook will say it took it: the screen must
	} else {
		t.Echo = 2 * time.Second // the Enter only once the paste shows
	}
	return t
}

// agentWatch is one tmux entity's safety net, run by its delivery loop
// between deliveries (one goroutine: no lock). It holds the loop's memory
// of the pane's screen for idle-screen.
type agentWatch struct {
	cfg         *config.Config
	screen      string
	screenSince time.Time
	// look is what the last look at the screen found that kept it from
	// reading idle ("": nothing, or no look); said is the look and the
	// status last logged: each logged once, a test's sentinel that the
	// screen was read and not taken for idle
	look, said string
}

// next says what status ent should have now, and why: the states that
// time or the pane can change (starting, busy, stuck, unhooked, detached),
// probing the pane when that can change them. It returns ent's own status
// when nothing changes.
func (w *agentWatch) next(ctx context.Context, ent store.Entity, now time.Time) (status, reason string) {
	status, reason = ent.Status, ent.StatusReason
	w.look = ""
	since := ent.StatusAt
	if ent.HookAt.After(since) {
		since = ent.HookAt
	}
	if ent.Program == "" && status == stIdle {
		// idle said before its program was in front (a hook from the
		// pane's shell): nothing is pasted unchecked
		return stStarting, "its program is not known yet: waiting for a hook from the agent in the pane"
	}
	if ent.Program != "" && (status == stIdle || watched(ent)) {
		p, err := deliver.Probe(ctx, ent.PaneTarget())
		switch {
		case err != nil:
			return stDetached, "pane " + ent.TmuxTarget + " is gone"
		case p.Dead:
			return stDetached, "pane " + ent.TmuxTarget + " is dead: " + ent.Program + " exited"
		case ent.PanePID != 0 && p.PID != ent.PanePID:
			// respawned, or a new tmux server reusing the id: another
			// pane under the old name, whoever's it is
			return stDetached, "pane " + ent.TmuxTarget + " is not the pane joined (its first process changed): join it again"
		case p.Command != ent.Program:
			return stDetached, "pane " + ent.TmuxTarget + " runs " + p.Command + ", not " + ent.Program
		case status == stDetached && ent.Turns == turnsNone:
			return stIdle, ""
		case status == stDetached:
			return stStarting, ent.Program + " is back in its pane: waiting for its first hook"
		case ent.AgentPID != 0 && ent.Turns != turnsNone && status != stStarting && !sameAgent(ent):
			// a program of the same name, but not the process whose hook
			// proved it: the agent started again, or something else did
			return stStarting, ent.Program + notTheAgent
		}
	}
	switch status {
	case stStarting:
		if now.Sub(since) >= w.cfg.StartBound {
			return stUnhooked, fmt.Sprintf("no hook from the agent in %v: its turn hooks are not installed, or not trusted (man 7 fleet-agents: busy and idle from the agent itself)", w.cfg.StartBound)
		}
	case stBusy:
		if now.Sub(since) >= w.cfg.StuckAfter {
			return stStuck, fmt.Sprintf("busy for %v with no hook from the agent", w.cfg.StuckAfter.Round(time.Second))
		}
		if st, why, ok := w.interrupted(ctx, ent, now, since); ok {
			return st, why
		}
	}
	if quiet := idleQuiet(ent); (status == stStarting || status == stStuck || status == stUnhooked) && quiet > 0 && ent.Program != "" {
		// idle read from the screen: the program in front (checked
		// above), no dialog on it, and nothing on it moved for IdleScreen
		s, err := deliver.Screen(ctx, ent.PaneTarget())
		if err != nil {
			return status, reason
		}
		if m := dialogRE.FindString(s); m != "" {
			w.look = "a dialog is open"
			if status == stStarting {
				return status, "a dialog is open in the pane (" + strings.TrimSpace(m) + "): answer it there"
			}
			return status, reason
		}
		if restoredRE.MatchString(s) {
			// Claude Code puts an interrupted prompt back in its input: a
			// paste now would send it again with the next message
			w.look = "an interrupted message is back in the input"
			return status, restoredReason
		}
		if !readyRE.MatchString(s) || workingRE.MatchString(s) {
			// no agent CLI's ready prompt on the screen (a tool's approval
			// question, an unknown first-run screen, a turn): not idle
			w.look = "no ready prompt"
			if status == stStarting {
				return status, "waiting for the agent's first hook, or its ready prompt on the screen"
			}
			return status, reason
		}
		if s != w.screen {
			w.screen, w.screenSince = s, now
		} else if now.Sub(w.screenSince) >= quiet {
			return stIdle, "read from the screen: unchanged for " + quiet.String()
		}
	}
	return status, reason
}

// record applies the safety net to ent, b's entity as just read: the
// status next says it should have now, recorded (and announced) when it
// differs. It says whether the caller must look again before it acts (a
// status was recorded, or a hook came meanwhile, or the record failed).
func (w *agentWatch) record(ctx context.Context, b *mailbox, ent store.Entity, st *store.Store, log *slog.Logger, announce func(gid string)) bool {
	if bindLate(ctx, b, ent, st, log) { // latehook.go
		announce(ent.Gid)
		return true
	}
	status, why := w.next(ctx, ent, time.Now())
	if said := w.look + " " + status; w.look == "" {
		w.said = ""
	} else if said != w.said {
		w.said = said
		log.Info("not read as idle from the screen: "+w.look, "entity", ent.Name, "status", status)
	}
	if status == ent.Status && why == ent.StatusReason {
		return false
	}
	if _, err := b.putStatusFrom(st, &ent, status, why, false, ""); errors.Is(err, errStale) {
		return true // a hook came meanwhile: look again
	} else if err != nil {
		log.Error("recording the status", "entity", ent.Name, "err", err)
		backoff.Sleep(ctx, time.Second)
		return true
	}
	if strings.HasSuffix(why, notTheAgent) {
		if _, err := b.bindAgent(st, 0); err != nil {
			log.Error("forgetting the agent's process", "entity", ent.Name, "err", err)
		}
	}
	log.Info("agent "+status, "entity", ent.Name, "reason", why)
	announce(ent.Gid)
	return true
}

// dialogRE finds the first-run and review dialogs of the agent CLIs on a
// screen (workspace trust, hook review): no paste may answer one, so a
// screen that shows one is never read as idle.
// The texts, as docs/agent-clis/ records them: Gemini CLI's folder trust,
// Codex's folder trust and hook review, Claude Code's workspace trust, its
// API-key question, its bypass-mode warning and its auto-mode stop.
// readyRE finds an agent CLI's idle input prompt on a screen, and
// workingRE a turn running (docs/agent-clis/): idle is read from a still
// screen only where one of the known ready prompts shows and no turn does
// — never from a stillness alone, which a tool's approval question has too.
// OpenCode's: its footer "ctrl+p commands" (at its prompt and mid-turn:
// a turn shows "esc interrupt" on its spinner line), and its tool
// approval "Permission required". Copilot CLI's: its footer "/ commands ·
// ? help" at its prompt, which a turn replaces by "Working esc …".
var (
	readyRE   = regexp.MustCompile(`\? for shortcuts|Type your message or @path/to/file|ctrl\+p commands|/ commands · \? help`)
	workingRE = regexp.MustCompile(`esc to interrupt|esc to cancel|esc interrupt|Working esc`)
)

// interruptScreens are the agent programs whose interrupt (Escape
// mid-turn) runs no hook, and whose screen says measurably when a turn
// ended that way (docs/agent-clis/claude.md, Escape mid-turn): Claude
// Code. Without a reading, such an entity stayed busy, its mail held,
// until stuck-after (10 minutes). Copilot CLI too (docs/agent-clis/
// copilot.md), by its process (its program reads node): nor does it run
// a hook when a model error ends its turn.
var interruptScreens = map[string]bool{"claude": true, "copilot": true}

// busyScreenAfter is how old a busy must be before its screen is read for
// an interrupt: a paste's busy is confirmed by the turn's own hook well
// within it.
const busyScreenAfter = 3 * time.Second

// restoredReason is the reason of an entity whose agent has an
// interrupted fleet message back in its input.
const restoredReason = "an interrupted message is back in the agent's input: clear it there, and its mail flows again"

// interrupted reads the screen of a busy agent whose interrupt runs no
// hook (interruptScreens) for a turn that ended by one: the interrupted
// fleet message back in its input (restoredRE) keeps it busy, with the
// reason, as a paste would send it again; the ready prompt with an empty
// box (readyRE: it shows only then), no turn and no dialog, unchanged for
// lateQuiet, is idle. ok false: nothing read that changes the status.
func (w *agentWatch) interrupted(ctx context.Context, ent store.Entity, now, since time.Time) (status, reason string, ok bool) {
	if !(interruptScreens[ent.Program] || interruptScreens[lateCLI(ent.AgentPID)]) || ent.TmuxTarget == "" || (now.Sub(since) < busyScreenAfter && ent.StatusReason != restoredReason) {
		return "", "", false
	}
	s, err := deliver.Screen(ctx, ent.PaneTarget())
	switch {
	case err != nil:
		return "", "", false
	case workingRE.MatchString(s) || dialogRE.MatchString(s):
		w.screen = "" // a turn, or a question: not over
		return "", "", false
	case restoredRE.MatchString(s):
		w.look = "an interrupted message is back in the input"
		return stBusy, restoredReason, true
	case !readyRE.MatchString(s):
		w.screen = ""
		return "", "", false
	}
	if s != w.screen {
		w.screen, w.screenSince = s, now
		return "", "", false
	}
	if now.Sub(w.screenSince) < lateQuiet {
		return "", "", false
	}
	return stIdle, "read from the screen: its turn ended with no hook (an interrupt), its input empty", true
}

// restoredRE finds a fleet message back in an agent's input box (between
// Claude Code's two rules, after its prompt glyph and a no-break space):
// what Claude Code does with the prompt of a turn interrupted by Escape.
var restoredRE = regexp.MustCompile(`─\n❯[ \x{a0}]\[fleet [a-z]+ from `)

var dialogRE = regexp.MustCompile(`(?i)do you trust the files in this folder|trust this folder\?|hooks need review|` +
	`is this a project you created or one you trust|yes, i trust this folder|don't trust|` +
	`do you want to use this api key\?|running in bypass permissions mode|auto mode can't check actions|` +
	`do you want to proceed\?|would you like to run the following command|allow execution|apply this change\?|` +
	`do you want to make this edit|yes, and don't ask again|permission required`)

// idleLook is how often the pane of an idle tmux entity with nothing to
// deliver is looked at (one tmux call): often enough that an agent that
// exited reads detached in the roster within seconds.
const idleLook = 3 * time.Second

// watched says whether status is one the safety net must look at again
// after a while (a tick), not only when something changes.
func watched(ent store.Entity) bool {
	if ent.TmuxTarget == "" {
		return false
	}
	switch ent.Status {
	case stStarting, stBusy, stStuck, stUnhooked, stDetached:
		return true
	}
	return false
}

// paneTaken is the name of the entity bound to pane id whose first
// process is pid, or "". A binding to the same id with another first
// process is of a pane that is gone — a new tmux server (after a reboot)
// numbers its panes from %0 again, and a respawned pane keeps its id — and
// holds nothing: its entity is told to look at its pane again, and reads
// detached, with the reason (agentWatch.next).
func paneTaken(reg *registry, id string, pid int) string {
	for _, b := range reg.Members("all") {
		e := b.snapshot()
		if e.PaneID != id {
			continue
		}
		if e.PanePID == 0 || e.PanePID == pid { // (0: bound before the first process was kept)
			return e.Name
		}
		b.notify() // its loop looks at the pane now: detached
	}
	return ""
}

// agentOf returns the mailbox of the tmux entity whose agent process pid
// is: the one whose pane's first process is pid's nearest ancestor.
//
// It returns the agent's process too: the leader of the terminal's
// foreground process group, when the caller descends from it (a hook run
// by the agent in front), else 0. And why the agent cannot be told from
// the pane's shell ("" when it can): it runs in the shell's own process
// group, the shell leading the foreground — started by a non-interactive
// compound command (tmux new-session "claude; exec bash") or a wrapper
// that does not exec it. Then nothing proves, at paste time, that the
// agent and not the shell reads what is typed (issue 40.3).
func agentOf(reg *registry, pid int) (*mailbox, int, string) {
	up := ancestors(pid)
	var best *mailbox
	bestAt := len(up)
	for _, b := range reg.Members("all") {
		e := b.snapshot()
		if e.PanePID == 0 {
			continue
		}
		if i := slices.Index(up, e.PanePID); i >= 0 && i < bestAt {
			best, bestAt = b, i
		}
	}
	if best == nil {
		return nil, 0, ""
	}
	pane := best.snapshot().PanePID
	if fg, _, ok := stat(pane); ok && slices.Contains(up[:bestAt+1], fg) {
		if fg == pane && shellProc(pane) {
			// the agent is the first process below the pane's shell, in
			// its group, that is no shell by name (a subshell of a
			// compound command may stand between them; a wrapper
			// script's process, named after the script, is taken for the
			// agent, which is as true) and not the caller itself (a hook
			// run by the pane's shell: fleet-turn's sh, then fleet-roster)
			for i := bestAt - 1; i >= 1 && pgrp(up[i]) == pane; i-- {
				if !deliver.IsShell(comm(up[i])) {
					return best, fg, compoundReason(comm(up[i]), up[i], shellName(pane))
				}
			}
		}
		return best, fg, ""
	}
	return best, 0, ""
}

// bindAgent records pid as the entity's agent process (with its start
// time), when it is not already.
func (b *mailbox) bindAgent(st *store.Store, pid int) (*store.Entity, error) {
	var start uint64
	if pid != 0 { // 0: forget it
		var ok bool
		if _, start, ok = stat(pid); !ok {
			e := b.snapshot()
			return &e, nil
		}
	}
	e := b.snapshot()
	if e.AgentPID == pid && e.AgentStart == start {
		return &e, nil
	}
	_, ne, err := b.update(st, func(x *store.Entity) error {
		x.AgentPID, x.AgentStart = pid, start
		return nil
	})
	return ne, err
}

// sameAgent says whether the terminal of the pane whose first process is
// panePID has e's agent process in front: its process group leads the
// foreground, and it is the process that started when the hook proved it.
func sameAgent(e store.Entity) bool {
	fg, _, ok := stat(e.PanePID)
	if !ok {
		return false
	}
	_, start, ok := stat(e.AgentPID)
	return ok && fg == e.AgentPID && start == e.AgentStart
}
