package gateway

// hops.go — loops stop by themselves (issue 37.2). Every message carries
// its hop count in its trace (envelope.Hops): the first of a flow is hop
// 0, and a message caused by another is that one's hop plus one. Two
// things make a send a hop of another, its parent:
//
//   - a reply (--reply-to): the message replied to;
//   - a send made while a message is delivered to an exec worker: its
//     command's environment has FLEET_MSG_ID, which fleet-send passes on
//     as the send's cause.
//
// The parent is believed only from this gateway's own record of it, and
// only when that record names the caller as its recipient (a message the
// caller was given); never a hop count from a client or a body. A cause
// that does not pass is ignored: the send starts a flow of its own (a
// script that sends as another entity than the one its message was for
// is not a hop of it). The send continues the parent's trace.
//
// Past max-hops a message is refused as a loop, by the recipient's
// gateway: a local send before anything is stored (exit 77, kind loop),
// one from another host as it arrives (refused to bridge.dlq with reason
// loop, which tells its sender's host: its record goes dead and the
// sender gets a BOUNCE, refusals.go). Both are audited as loop_cut in the
// trace, so fleet-trace shows where the loop was cut, and counted in
// fleet_loops_cut_total{where="send"|"arrival"}.

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// loopGuard cuts messages past max-hops. It holds no state: the bound,
// and where a cut is told.
type loopGuard struct {
	max     int // max-hops
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics // nil: off
}

// over reports whether env is past max-hops.
func (l *loopGuard) over(env *envelope.Envelope) bool {
	return l != nil && l.max > 0 && env.Hops > l.max
}

// Send refuses a local send past max-hops (77, loop): nil when it may go.
func (l *loopGuard) Send(env *envelope.Envelope) error {
	if !l.over(env) {
		return nil
	}
	l.cut(env, "send")
	return fault.New(fault.Refused, fault.KindLoop,
		"message to %s refused: hop %d of trace %s, past max-hops %d: a loop, cut here (nothing sent)",
		env.Recipient.String(), env.Hops, env.TraceID, l.max).
		WithHint("do not answer it again; fleet-trace %s shows where it was cut, and a new flow starts with a plain fleet-send NAME TEXT", env.TraceID)
}

// Arrival refuses a SEND or REPLY from another host past max-hops (a
// *broker.Refusal: to bridge.dlq, its sender told): nil when it may come
// in.
func (l *loopGuard) Arrival(env *envelope.Envelope) error {
	if (env.Kind != envelope.Send && env.Kind != envelope.Reply) || !l.over(env) {
		return nil
	}
	l.cut(env, "arrival")
	return broker.Refuse(broker.ReasonLoop, "hop %d of trace %s, past max-hops %d: a loop, cut", env.Hops, env.TraceID, l.max)
}

// cut tells of a loop cut where ("send" or "arrival").
func (l *loopGuard) cut(env *envelope.Envelope, where string) {
	l.log.Warn("loop cut: past max-hops", "msg_id", env.MsgID, "trace_id", env.TraceID,
		"hops", env.Hops, "max_hops", l.max, "where", where, "sender", env.Sender.String(), "recipient", env.Recipient.String())
	l.audit.Message("loop_cut", env, 0, loopReason(env.Hops, l.max, where))
	l.metrics.LoopCut(where)
}

// loopReason is the audit line's reason of a cut.
func loopReason(hops, max int, where string) string {
	at := "at send"
	if where == "arrival" {
		at = "on arrival"
	}
	return fmt.Sprintf("hop %d past max-hops %d, %s", hops, max, at)
}

// limit is what bounds a send before anything of it is stored or
// published: past max-hops to a local recipient (77, loop; one on another
// host is cut there, on arrival), then over pair-rate (75, rate_limited,
// pairrate.go), which a retry of a message sent before (the same msg id)
// does not spend again.
func (rt *router) limit(env *envelope.Envelope, local, retry bool) error {
	if local {
		if err := rt.loops.Send(env); err != nil {
			return err
		}
	}
	if retry {
		return nil
	}
	wait, ok := rt.pairs.Take(env.Sender.Gid, env.Recipient.Gid)
	if ok {
		return nil
	}
	rt.metrics.RateLimited()
	shown := (wait + 99*time.Millisecond).Truncate(100 * time.Millisecond)
	rt.log.Info("send refused: over pair-rate", "trace_id", env.TraceID, "sender", env.Sender.String(),
		"recipient", env.Recipient.String(), "pair_rate", rt.pairs.Rate(), "retry_after", shown)
	e := fault.New(fault.TempFail, fault.KindRateLimited,
		"%s has sent %s its pair-rate of %d messages a minute: try again in %v (nothing was sent)",
		env.Sender.String(), env.Recipient.String(), rt.pairs.Rate(), shown).
		WithHint("wait %v, then send again; the limit is the gateway's pair-rate (fleet-config(5))", shown)
	e.RetryAfter = wait
	return e
}

// deliveredTo is this host's record of message id when it names gid as
// its recipient (a broadcast copy is recorded per member), else nil: the
// only parent a send of gid's may be a hop of.
func deliveredTo(st *store.Store, id, gid string) *store.Record {
	if id == "" || !envelope.ValidID(id) {
		return nil
	}
	r, err := st.Record(id)
	if err != nil {
		r, err = st.Record(id + "/" + gid)
	}
	if err != nil || r.Recipient != gid {
		return nil
	}
	return r
}
