package gateway

// urgent.go — urgent mail (issue 37.3). fleet-send --urgent and fleet-ask
// --urgent put a message ahead of normal mail in its recipient's inbox:
// the store keeps an urgent lane beside the normal one in every inbox
// (pkg/store/lanes.go), each FIFO, and everything that hands out an
// inbox's head (an injection, a hook, fleet-recv) takes the urgent lane
// first. A live ask goes before stored mail as it always did; an urgent
// one before the other live asks. Across hosts the flag rides the signed
// envelope, so the recipient's gateway puts the message in the urgent
// lane as it takes it in. Nothing pastes into a busy agent for it:
// urgent mail waits for the next boundary like the rest, and is first
// there.
//
// Urgent sends have a rate of their own per sender (urgent-rate, on top of
// pair-rate): over it a send is refused (75, rate_limited), never sent
// as normal mail instead.

import (
	"context"
	"log/slog"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// urgentRate bounds each local sender's urgent messages a minute, to all
// recipients together: a token bucket per sender (pairrate.go's, keyed
// by the sender alone).
type urgentRate struct {
	buckets *pairRates // to "": one bucket per sender
	log     *slog.Logger
	metrics *metrics.Metrics // nil: off
}

func newUrgentRate(rate int, log *slog.Logger, m *metrics.Metrics) *urgentRate {
	return &urgentRate{buckets: newPairRates(rate), log: log, metrics: m}
}

// Take spends one of env's sender's urgent tokens when env is urgent and
// not a retry of a message sent before (the same msg id): nil, or the
// refusal (75, rate_limited, with the wait). A message that is not
// urgent passes.
func (u *urgentRate) Take(env *envelope.Envelope, retry bool) error {
	if u == nil || !env.Urgent || retry {
		return nil
	}
	wait, ok := u.buckets.Take(env.Sender.Gid, "")
	if ok {
		u.metrics.Urgent("sent")
		return nil
	}
	u.metrics.Urgent("rate_limited")
	shown := (wait + 99*time.Millisecond).Truncate(100 * time.Millisecond)
	u.log.Info("urgent send refused: over urgent-rate", "trace_id", env.TraceID, "sender", env.Sender.String(),
		"recipient", env.Recipient.String(), "urgent_rate", u.buckets.Rate(), "retry_after", shown)
	e := fault.New(fault.TempFail, fault.KindRateLimited,
		"%s has sent its urgent-rate of %d urgent messages a minute: try again in %v, or send it without --urgent (nothing was sent)",
		env.Sender.String(), u.buckets.Rate(), shown).
		WithHint("wait %v, or drop --urgent; the limit is the gateway's urgent-rate (fleet-config(5))", shown)
	e.RetryAfter = wait
	return e
}

// urgentArrivals is the receiving side's bound: the urgent flag is the
// word of another host's gateway, signed, but a host that does not keep
// urgent-rate (an older build's bug, or a host gone bad) must not put all
// its mail ahead of everyone's. Each remote sender may have twice
// urgent-rate urgent messages a minute here (room for the jitter between
// its gateway's clock and this one); past that its messages come in as
// normal mail, whole and in order, never refused for it, and the log and
// fleet_urgent_total{outcome="demoted"} say so.
type urgentArrivals struct {
	buckets *pairRates // to "": one bucket per remote sender
	log     *slog.Logger
	metrics *metrics.Metrics
}

func newUrgentArrivals(rate int, log *slog.Logger, m *metrics.Metrics) *urgentArrivals {
	return &urgentArrivals{buckets: newPairRates(2 * rate), log: log, metrics: m}
}

// Arrival clears env's urgent flag when its sender is past its bound.
func (u *urgentArrivals) Arrival(env *envelope.Envelope) {
	if u == nil || !env.Urgent {
		return
	}
	if _, ok := u.buckets.Take(env.Sender.Gid, ""); ok {
		return
	}
	env.Urgent = false
	u.metrics.Urgent("demoted")
	u.log.Warn("urgent message from another host taken in as normal mail: its sender is past twice urgent-rate here",
		"msg_id", env.MsgID, "trace_id", env.TraceID, "sender", env.Sender.String(), "bound", u.buckets.Rate())
}

// The agent CLIs whose own interrupt is measured safe to press for urgent
// mail (docs/agent-clis/): the key, and what makes it safe. An interrupt
// is safe where it ends the turn with a hook (so the entity reads idle
// and the paste follows by the usual path) and leaves the input empty (so
// the paste is the next prompt alone).
var interruptKeys = map[string]string{
	// Escape cancels the request; the Interrupt hook marks idle; the
	// text is not put back (docs/agent-clis/codex.md, TestCodex)
	"codex": "Escape",
}

// notInterruptible says why a CLI's interrupt is not used.
var notInterruptible = map[string]string{
	"claude":  "Claude Code runs no hook on an interrupt and puts the interrupted prompt back in its input box, so a paste after it would be sent with that prompt (docs/agent-clis/claude.md)",
	"gemini":  "Gemini CLI's Escape is measured (its AfterAgent hook marks idle) but not yet tested with urgent mail (docs/agent-clis/gemini.md)",
	"copilot": "GitHub Copilot CLI runs no hook on an interrupt (no agentStop, no errorOccurred), so nothing says when the turn ended that way (docs/agent-clis/copilot.md)",
}

// checkInterrupt holds --interrupt-on-urgent to the CLIs measured safe.
func checkInterrupt(e *store.Entity) error {
	cli := e.InterruptOnUrgent
	if cli == "" {
		return nil
	}
	if _, ok := interruptKeys[cli]; !ok {
		why := notInterruptible[cli]
		if why == "" {
			why = "its interrupt is not measured (docs/agent-clis/)"
		}
		return fault.New(fault.Usage, fault.KindUsage, "--interrupt-on-urgent %s: %s", cli, why).
			WithHint("leave it out: urgent mail then waits for the turn's end and goes first; --interrupt-on-urgent takes codex")
	}
	if e.Turns == turnsNone || e.Mode != "inject" {
		return fault.New(fault.Usage, fault.KindUsage, "--interrupt-on-urgent is for an inject entity whose agent's hooks say busy and idle").
			WithHint("fleet-roster join NAME --mode inject --tmux-target PANE --interrupt-on-urgent codex")
	}
	return nil
}

// urgentInterrupt presses an agent's own interrupt when urgent mail is at
// the head of its inbox while the agent is in a turn, for an entity that
// opted in (--interrupt-on-urgent CLI). It presses it once per urgent
// message, only while the agent its hook proved is in front of the pane,
// and never pastes: the CLI's interrupt hook marks the entity idle, and
// the delivery loop then pastes the urgent message as the next prompt,
// by the usual path and checks. An interrupt that ends no turn (no hook
// follows) leaves the mail where it was.
type urgentInterrupt struct {
	cfg     *config.Config
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics // nil: off
}

// Try presses ent's interrupt for head when it should: head is urgent,
// the entity opted in, its agent is busy in a turn (a hook said so, or a
// paste started one) and is the program its hook proved. It says whether
// it tried (pressed it, or found the agent not in front: either way not
// tried again for this message).
func (u *urgentInterrupt) Try(ctx context.Context, ent store.Entity, head *envelope.Envelope) bool {
	key := interruptKeys[ent.InterruptOnUrgent]
	if u == nil || key == "" || !head.Urgent || ent.Status != stBusy || ent.Program == "" || ent.TmuxTarget == "" {
		return false
	}
	log := u.log.With("entity", ent.Name, "msg_id", head.MsgID, "trace_id", head.TraceID, "cli", ent.InterruptOnUrgent)
	if err := tmuxAdapter(ent, u.cfg).Interrupt(ctx, key); err != nil {
		log.Warn("urgent mail waits: the agent's interrupt was not pressed", "err", err)
		return true
	}
	log.Info("urgent mail: the agent's turn interrupted", "key", key)
	u.audit.Message("interrupted", head, 0, "urgent: "+ent.InterruptOnUrgent+"'s "+key+" pressed in "+ent.TmuxTarget)
	u.metrics.Urgent("interrupted")
	return true
}
