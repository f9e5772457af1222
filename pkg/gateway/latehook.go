package gateway

// latehook.go — agents whose first hook comes late (issue 40.3). Codex
// and GitHub Copilot CLI run their session-start hook only at the first
// prompt. An entity joined
// at a shell, where a person then types `codex`, has no program until a
// hook names it, so it stayed starting with its mail held — and the first
// prompt that would send the hook never came, since the first prompt is
// that mail. Such a CLI is recognised instead from its process: the
// terminal's foreground process group leader in the pane, whose command
// line names it. The entity is bound to that process and program (the
// paste guard, as a hook would bind them) and reads idle from its screen
// once the CLI's ready prompt shows and the screen stands still
// (lateQuiet), no dialog on it — what --idle-screen does, on by default
// for these CLIs only. Its first hook, when it comes, takes over.
//
// Started by a compound command (tmux new-session "codex; exec bash") or
// a wrapper that does not exec it, such a CLI runs in the process group
// of the pane's shell, and tmux shows the shell in front: nothing proves
// that the CLI, not the shell, reads what is typed, and no hook comes to
// say so before the first prompt. The entity goes unhooked at once, with
// the reason, as a hook from such an agent makes it (agentOf).

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/store"
)

// lateHookCLIs are the agent CLIs whose first hook comes only with their
// first prompt, by the name a word of their command line has
// (docs/agent-clis/): the npm launcher (node …/codex.js) or the binary.
var lateHookCLIs = map[string]string{
	"codex":    "codex",
	"codex.js": "codex",
	// Copilot CLI runs sessionStart with the first prompt too (its npm
	// launcher, node …/.bin/copilot or npm-loader.js, spawns the binary)
	"copilot": "copilot",
}

// lateQuiet is how long the screen of a CLI recognised from its process
// must stand still, its ready prompt on it, to read idle before its first
// hook (as TestCodex's --idle-screen 2s).
const lateQuiet = 2 * time.Second

// lateCLI is the late-hook CLI process pid runs ("" for none).
func lateCLI(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	for i, arg := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
		if i > 2 { // the program, an interpreter's script: not its arguments
			break
		}
		if cli := lateHookCLIs[path.Base(string(arg))]; cli != "" {
			return cli
		}
	}
	return ""
}

// bindLate binds a starting entity with no program yet to a late-hook
// CLI in front of its pane: its program as tmux shows it, and its
// process. It says whether it bound one (the caller looks again).
func bindLate(ctx context.Context, b *mailbox, ent store.Entity, st *store.Store, log *slog.Logger) bool {
	if ent.Program != "" || ent.Status != stStarting || ent.Turns == turnsNone || ent.PanePID == 0 {
		return false
	}
	p, err := deliver.Probe(ctx, ent.PaneTarget())
	if err == nil && !p.Dead && p.PID == ent.PanePID && shellProc(p.PID) && unhookLate(b, ent, st, log, p.PID) {
		return true
	}
	if err != nil || p.Dead || p.PID != ent.PanePID || !agentInFront(p) {
		return false
	}
	fg, _, ok := stat(p.PID)
	if !ok {
		return false
	}
	cli := lateCLI(fg)
	if cli == "" {
		return false
	}
	_, start, ok := stat(fg)
	if !ok {
		return false
	}
	_, after, err := b.update(st, func(x *store.Entity) error {
		if x.Program == "" && x.Status == stStarting {
			x.Program, x.AgentPID, x.AgentStart = p.Command, fg, start
			x.StatusReason = cli + " recognised in the pane (its first hook comes with its first prompt): idle once its ready prompt shows"
		}
		return nil
	})
	if err != nil {
		log.Error("binding the agent in the pane", "entity", ent.Name, "err", err)
		return false
	}
	if after.Program == "" {
		return false
	}
	log.Info("agent recognised from its process: its first hook comes late", "entity", ent.Name, "cli", cli, "program", after.Program, "pid", fg)
	return true
}

// unhookLate makes ent unhooked, with the reason, when a late-hook CLI
// runs in the process group of its pane's shell, pane (in front: a
// non-interactive shell, which gives its children no group of their
// own). It says whether it did.
func unhookLate(b *mailbox, ent store.Entity, st *store.Store, log *slog.Logger, pane int) bool {
	cli, pid := lateInGroup(pane)
	if cli == "" {
		return false
	}
	why := compoundReason(comm(pid), pid, shellName(pane))
	if _, err := b.putStatusFrom(st, &ent, stUnhooked, why, false, ""); err != nil {
		if !errors.Is(err, errStale) {
			log.Error("recording the status", "entity", ent.Name, "err", err)
		}
		return false
	}
	log.Warn("the agent cannot be told from its pane's shell: its mail is held", "entity", ent.Name, "cli", cli, "reason", why)
	return true
}

// lateInGroup is a late-hook CLI process below pane in the process group
// that pane leads and has in front ("", 0 for none): its descendants from
// /proc/PID/task/PID/children, at most 64 looked at.
func lateInGroup(pane int) (string, int) {
	if fg, _, ok := stat(pane); !ok || fg != pane {
		return "", 0
	}
	next := children(pane)
	for n := 0; len(next) > 0 && n < 64; n++ {
		pid := next[0]
		next = next[1:]
		if pgrp(pid) != pane {
			continue // a group of its own: not the shell's
		}
		if cli := lateCLI(pid); cli != "" {
			return cli, pid
		}
		next = append(next, children(pid)...) // a wrapper's, a subshell's
	}
	return "", 0
}

// idleQuiet is how long ent's screen must stand still to read idle
// (0: never): its --idle-screen, or lateQuiet for a late-hook CLI
// recognised in front of its pane.
func idleQuiet(ent store.Entity) time.Duration {
	if ent.IdleScreen > 0 {
		return time.Duration(ent.IdleScreen) * time.Millisecond
	}
	if ent.AgentPID != 0 && lateCLI(ent.AgentPID) != "" {
		return lateQuiet
	}
	return 0
}
