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
	"log/slog"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
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
