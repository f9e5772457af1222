package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// inboxes makes this host's entities live and delivers to them: an
// entity registered (joined, spawned) or unregistered (left, stopped) in
// the store, on the broker and in memory (entities.go Register,
// Unregister); a mailbox in the registry, its broker inbox kept consumed, and its
// delivery worker (an inject entity's paste or command, a pull entity's
// nudge hook, a hook entity's wake notice: wake.go); a message that
// cannot be delivered is dead-lettered here (Kill). Its workers belong to
// the gateway's worker group, waited for in the drain. It holds no state
// of its own beyond the live mailboxes, which are the registry's; what it
// needs of the rest is wired in once (gateway.go open), the broker and the
// admission read at each use (set in Run, nil in single-host mode).
type inboxes struct {
	cfg       *config.Config
	st        *store.Store
	log       *slog.Logger
	audit     *audit.Log
	metrics   *metrics.Metrics // nil: off
	reg       *registry
	rdv       *rendezvous // a reply being handed to an open send is not delivered as well
	wake      *wakes
	rcpt      *receipts        // a message settled: its receipt or bounce
	peers     *peerView        // a name is one entity across the trusted hosts (Register)
	names     *nameBook        // names.go
	follow    *followers       // follow.go: an entity that leaves is not followed
	caps      *inboxCaps       // inboxcap.go: an entity that leaves takes in its broker inbox whole
	interrupt *urgentInterrupt // urgent.go: an agent's own interrupt for urgent mail, where it opted in
	crash     crashpoint
	workers   *sync.WaitGroup // the delivery workers: the gateway's, waited for in the drain

	change func(gid string)       // announcer.go: an entity's presence changed
	br     func() *broker.Broker  // nil: single-host mode
	admit  func() *admission      // nil: single-host mode
	run    func() context.Context // cancelled when shutdown starts: the workers stop
	ctx    func() context.Context // the work in flight's: cancelled past the drain bound
}

// OnBroker reports whether gid has an inbox on the broker: there is one,
// and gid names this host (an entity from before gids named their host has
// none: this host's broker login may not make it, and other hosts would
// not believe it; it can only leave, and join again).
func (ib *inboxes) OnBroker(gid string) bool {
	return ib.br() != nil && ident.GidHost(gid) == ib.cfg.Host
}

// Add makes e live: its mailbox, its broker inbox kept consumed (a new
// entity's register has declared and consumed it already), and its
// delivery worker.
func (ib *inboxes) Add(e *store.Entity) *mailbox {
	ctx, cancel := context.WithCancel(ib.run())
	b := &mailbox{ent: *e, stop: cancel, done: make(chan struct{})}
	ib.reg.Add(b)
	if ib.OnBroker(e.Gid) {
		ib.br().KeepInbox(e.Gid, e.Groups)
	}
	if e.Mode != "inject" && e.Nudge == "" && !wantsWake(e) {
		// a pull entity without a nudge hook needs no worker: fleet-recv
		// serves it (one goroutine fewer per entity, at thousands of them),
		// nor a hook entity without a pane (its agent's hooks take its mail)
		close(b.done)
		return b
	}
	ib.workers.Add(1)
	go func() {
		defer ib.workers.Done()
		defer close(b.done)
		switch {
		case e.Mode == "inject":
			ib.injectLoop(ctx, b)
		case wantsWake(e):
			ib.wake.Run(ctx, b) // wake.go: the wake notice in its pane
		default:
			ib.nudgeLoop(ctx, b)
		}
	}()
	return b
}

func (ib *inboxes) Remove(gid string) {
	if b := ib.reg.Remove(gid); b != nil {
		b.stop()
		<-b.done
	}
}

func (ib *inboxes) adapter(e store.Entity) deliver.Adapter {
	if e.TmuxTarget != "" {
		return tmuxAdapter(e, ib.cfg)
	}
	return &deliver.Exec{Command: e.Exec, Entity: e.Name, Timeout: ib.cfg.ExecTimeout}
}

// injectLoop delivers an inject entity's inbox head first, one message at a
// time (per-recipient FIFO). It waits while the entity is busy; a failed
// delivery is retried with backoff and dead-lettered after the configured
// attempts. The in-flight marker written before each attempt is what makes
// a crash during injection detectable (see recoverInflight).
func (ib *inboxes) injectLoop(ctx context.Context, b *mailbox) {
	pol := backoff.Policy{Base: ib.cfg.RetryBase, Max: ib.cfg.RetryMax, Jitter: true}
	net := &agentWatch{cfg: ib.cfg}
	bindOld(ctx, b, ib.st) // an entity from before panes were bound
	held := ""             // the head last logged as held while not idle
	interrupted := ""      // the urgent head the agent's interrupt was tried for (urgent.go)
	for {
		changed := b.watch()
		if ctx.Err() != nil {
			return
		}
		ent := b.snapshot()
		// the safety net (agent.go): a state that time or the pane
		// changed is recorded before anything is pasted
		if ent.TmuxTarget != "" && net.record(ctx, b, ent, ib.st, ib.log, ib.change) {
			continue
		}
		if ent.Status != stIdle {
			// said once per head: what waits, and why (a test's sentinel
			// that the gateway saw the message and chose not to paste)
			if items, _ := ib.st.Head(ent.Gid, 0, 1); len(items) > 0 {
				head := items[0].Env
				if head.MsgID != held {
					held = head.MsgID
					ib.log.Info("held: the agent is not idle", "entity", ent.Name, "status", ent.Status,
						"msg_id", held, "trace_id", head.TraceID)
				}
				// urgent mail for an agent in a turn: its own interrupt,
				// for an entity that opted in; the paste follows at idle
				if head.MsgID != interrupted && ib.interrupt.Try(ctx, ent, head) {
					interrupted = head.MsgID
				}
			}
			var tick <-chan time.Time
			var t *time.Timer
			if watched(ent) {
				t = time.NewTimer(time.Second)
				tick = t.C
			}
			select {
			case <-ctx.Done():
			case <-changed:
			case <-tick:
			}
			if t != nil {
				t.Stop()
			}
			continue
		}
		if asks := b.liveHead(time.Now()); len(asks) > 0 {
			// a live ask first: its asker's turn is waiting
			env := asks[0]
			if ent.TmuxTarget != "" && ent.Turns != turnsNone {
				if _, err := b.putStatus(ib.st, stBusy, pastedReason, false, ""); err != nil {
					ib.log.Error("recording the status", "entity", ent.Name, "err", err)
				}
			}
			err := ib.adapter(ent).Deliver(ib.ctx(), env)
			if err == nil || errors.Is(err, deliver.ErrUncertain) {
				b.liveDone(env.MsgID)
				ib.audit.Message("injected", env, 1, "ask")
				ib.metrics.Delivered(env.Kind)
				continue
			}
			if ent.TmuxTarget != "" {
				if perr := notPasted(b, ib.st, err); perr != nil {
					ib.log.Error("recording the status", "entity", ent.Name, "err", perr)
				}
			}
			ib.log.Warn("ask not injected: retrying until it expires", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
			backoff.Sleep(ctx, pol.Delay(1))
			continue
		}
		items, err := ib.st.Head(ent.Gid, 0, 16)
		if err != nil {
			ib.log.Error("reading inbox", "entity", ent.Name, "err", err)
		}
		items, _ = ib.rdv.Free(items) // a reply being handed to an open send is not injected as well
		if len(items) == 0 {
			// an idle pane is looked at now and then too, so that an agent
			// that exited reads detached before mail comes for it
			var look <-chan time.Time
			var t *time.Timer
			if ent.TmuxTarget != "" && ent.Program != "" {
				t = time.NewTimer(idleLook)
				look = t.C
			}
			select {
			case <-ctx.Done():
			case <-changed:
			case <-look:
			}
			if t != nil {
				t.Stop()
			}
			continue
		}
		env := items[0].Env
		log := ib.log.With("entity", ent.Name, "msg_id", env.MsgID, "trace_id", env.TraceID)
		if env.Expired(time.Now()) {
			ib.Kill(env, "expired before delivery", -1)
			continue
		}
		if !ib.admit().trusted(env.Sender.Host) {
			// admitted once, but its host was removed from the trust file
			// since: what it sent is not typed into a terminal now
			ib.Kill(env, "sender host "+env.Sender.Host+" is no longer trusted", -1)
			continue
		}
		attempt, err := ib.st.BeginInject(store.Key(env))
		if err != nil {
			log.Error("recording delivery attempt", "err", err)
			backoff.Sleep(ctx, time.Second)
			continue
		}
		hooked := ent.TmuxTarget != "" && ent.Turns != turnsNone
		pasted := time.Now()
		if !hooked && statusMoved(ent, b.snapshot()) {
			// a hook said busy since the status was read (the look at
			// the pane and the store can take seconds on a loaded host):
			// nothing is pasted from a stale idle
			if ferr := ib.st.Failed(store.Key(env), "the agent's status changed before the paste"); ferr != nil {
				log.Error("recording failed attempt", "err", ferr)
			}
			continue
		}
		if hooked {
			// busy from the paste: nothing else is pasted until the
			// agent's hooks say how its turn went — and nothing is pasted
			// if a hook said busy since the status was read
			if _, err := b.putStatusFrom(ib.st, &ent, stBusy, pastedReason, false, ""); err != nil {
				if !errors.Is(err, errStale) {
					log.Error("recording the status", "err", err)
				}
				if ferr := ib.st.Failed(store.Key(env), "the agent's status changed before the paste"); ferr != nil {
					log.Error("recording failed attempt", "err", ferr)
				}
				continue
			}
		}
		err = ib.adapter(ent).Deliver(ib.ctx(), env)
		ib.crash.at(ib.log, "after-inject")

		// a stop drains in-flight work: the proof is waited for until the
		// drain bound (hardCtx), not only until the stop began
		if err == nil && hooked && !b.confirmed(ib.ctx(), pasted, ib.cfg.ConfirmWithin/3) {
			// no busy hook yet. An Enter taken as a newline (Gemini CLI),
			// or lost by an agent just starting, leaves the text in its
			// input: one more Enter submits it — only while the text
			// shows and no turn or dialog does (an approval question)
			if againEnter(ib.ctx(), ent, env.MsgID) {
				log.Info("no busy hook and the paste still shows: Enter once more")
				if eerr := tmuxAdapter(ent, ib.cfg).Enter(ib.ctx()); eerr != nil {
					log.Warn("second Enter", "err", eerr)
				}
			}
		}
		if err == nil && hooked && !b.confirmed(ib.ctx(), pasted, ib.cfg.ConfirmWithin*2/3) {
			err = fmt.Errorf("%w: pasted into pane %s, but the agent showed no sign of taking it (no busy hook) within %v",
				deliver.ErrUncertain, ent.TmuxTarget, ib.cfg.ConfirmWithin)
		}
		if err != nil && ent.TmuxTarget != "" && !errors.Is(err, deliver.ErrUncertain) {
			// nothing was typed: detached (the mail is held until the
			// program is back), or not busy from this paste after all
			if perr := notPasted(b, ib.st, err); perr != nil {
				log.Error("recording the status", "err", perr)
			}
			ib.change(ent.Gid)
			if errors.Is(err, deliver.ErrDetached) {
				if ferr := ib.st.Failed(store.Key(env), err.Error()); ferr != nil {
					log.Error("recording failed attempt", "err", ferr)
				}
				log.Warn("agent detached: nothing pasted, mail held", "err", err)
				continue
			}
		}
		if err == nil {
			// Injected: record it, retrying the record alone — going back to
			// the head would inject it again. If the gateway stops first, the
			// in-flight marker makes it "uncertain" at the next start.
			// A stop drains in-flight work: the record is retried until the
			// drain bound (hardCtx), not only until the stop began.
			recorded := false
			for try := 1; ib.ctx().Err() == nil; try++ {
				if err := ib.st.Delivered(store.Key(env), time.Now().UTC()); err != nil {
					log.Error("recording delivery", "err", err, "try", try)
					backoff.Sleep(ib.ctx(), pol.Delay(try))
					continue
				}
				recorded = true
				break
			}
			if !recorded {
				return
			}
			ib.audit.Message("injected", env, attempt, "")
			log.Info("delivered", "attempt", attempt, "mode", "inject")
			ib.rcpt.Settled(env, store.Delivered, "", attempt)
			ib.crash.at(ib.log, "after-record")
			continue
		}
		if errors.Is(err, deliver.ErrUncertain) {
			log.Error("delivery uncertain: not retried", "err", err)
			ib.Kill(env, "uncertain: "+err.Error(), attempt)
			continue
		}
		log.Warn("delivery failed", "attempt", attempt, "of", ib.cfg.DeliveryAttempts, "err", err)
		ib.audit.Message("retry", env, attempt, err.Error())
		if err := ib.st.Failed(store.Key(env), err.Error()); err != nil {
			log.Error("recording failed attempt", "err", err)
		}
		if attempt >= ib.cfg.DeliveryAttempts {
			ib.Kill(env, "delivery failed "+strconv.Itoa(attempt)+" times: "+err.Error(), attempt)
			continue
		}
		backoff.Sleep(ctx, pol.Delay(attempt))
	}
}

// Kill dead-letters env with reason.
func (ib *inboxes) Kill(env *envelope.Envelope, reason string, attempts int) {
	if err := ib.st.Kill(store.Key(env), reason, attempts); err != nil {
		ib.log.Error("dead-lettering", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		return
	}
	ib.audit.Message("dead", env, attempts, reason)
	ib.log.Warn("dead-lettered", "msg_id", env.MsgID, "trace_id", env.TraceID, "entity", env.Recipient.String(), "reason", reason)
	if ib.br() != nil && env.Sender.Host != ib.cfg.Host {
		// a remote message: its copy in bridge.dlq carries the reason too
		if err := ib.br().DeadLetter(env, reason, attempts); err != nil {
			ib.log.Warn("dead letter not copied to bridge.dlq", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		} else {
			ib.log.Info("dead letter copied to bridge.dlq", "msg_id", env.MsgID, "trace_id", env.TraceID)
		}
	}
	ib.rcpt.Settled(env, store.Dead, reason, attempts)
}

// nudgeLoop runs a pull entity's nudge hook while unread mail waits: first
// after nudge-after, then with doubling intervals up to nudge-max. It checks
// right before each run that mail still waits and no fleet-recv is draining,
// so it never nags about read mail; an emptied inbox resets the backoff.
func (ib *inboxes) nudgeLoop(ctx context.Context, b *mailbox) {
	pol := backoff.Policy{Base: ib.cfg.NudgeAfter, Max: ib.cfg.NudgeMax}
	var since time.Time // when unread mail started waiting
	n := 0
	var drains uint64 // the drains seen: one since (a hook was running) starts over
	for {
		changed := b.watch()
		ent := b.snapshot()
		b.mu.Lock()
		draining, drained := b.draining, b.drains != drains
		drains = b.drains
		b.mu.Unlock()
		if drained {
			since, n = time.Time{}, 0 // an emptied inbox resets the backoff
		}
		if draining || ent.Nudge == "" || !ib.st.HasPending(ent.Gid) {
			since, n = time.Time{}, 0
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			continue
		}
		if since.IsZero() {
			since = time.Now()
		}
		var wait time.Duration
		for i := 1; i <= n+1; i++ {
			wait += pol.Delay(i)
		}
		t := time.NewTimer(time.Until(since.Add(wait)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
			t.Stop()
			continue
		case <-t.C:
		}
		b.mu.Lock()
		draining = b.draining
		b.mu.Unlock()
		if draining || !ib.st.HasPending(ent.Gid) {
			continue
		}
		pending := ib.st.Pending(ent.Gid) // counted only when a nudge fires
		n++
		now := b.snapshot() // detached (follow.go): nobody reads it, and why
		err := deliver.Run(ctx, ent.Nudge, ib.cfg.ExecTimeout, bytes.NewReader(nil), []string{
			"FLEET_ENTITY=" + ent.Name,
			"FLEET_PENDING=" + strconv.Itoa(pending),
			"FLEET_NUDGE=" + strconv.Itoa(n),
			"FLEET_STATUS=" + now.Status,
			"FLEET_STATUS_REASON=" + now.StatusReason,
		})
		if err != nil {
			ib.log.Warn("nudge hook failed", "entity", ent.Name, "err", err)
		} else {
			ib.log.Info("nudged", "entity", ent.Name, "pending", pending, "nudge", n)
		}
		ib.audit.Write(audit.Line{Event: "nudge", Entity: ent.Name, Attempt: n})
	}
}
