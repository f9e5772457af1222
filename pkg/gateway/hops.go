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
// Asks and broadcasts are hops too: an ask made with --about, or while a
// message is delivered (its cause), is one more than that message; an
// answer is one more than its ask; a broadcast made while a message is
// delivered, one more than it.
//
// Past max-hops a message is refused as a loop: by the sender's gateway
// before anything is stored or published, whatever its recipient's host
// (exit 77, kind loop), and by the recipient's gateway, against its own
// max-hops, as it arrives from another host (refused to bridge.dlq with
// reason loop, which tells its sender's host: its record goes dead and
// the sender gets a BOUNCE, refusals.go; an ask's fleet-ask ends 77).
// Both are audited as loop_cut in the trace, so fleet-trace shows where
// the loop was cut, and counted in
// fleet_loops_cut_total{where="send"|"arrival"}.
//
// The other party is told too: the entity whose message the cut one
// answered (its parent's sender), when it lives on the host that cut it,
// gets a NOTICE in its inbox (not a BOUNCE: nothing of its own died)
// saying which message was cut and why, audited as loop_notice and
// counted in fleet_loop_notices_total. At a send the parent is this
// host's record; on arrival, the record of the message it replies to
// when this host has it, else the cut message's recipient (in a loop of
// two, the same entity; an answer's asker). The notice keeps the cut
// hop count, so what its reader sends because of it is cut at once: a
// notice never restarts a loop.

import (
	"fmt"
	"log/slog"
	"strings"
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
	st      *store.Store     // a message cut on arrival: the record of what it replies to (nil: none)
	tell    loopTeller       // the other party's NOTICE (receipt.go); nil: not told
}

// loopTeller puts a NOTICE about a cut message in an entity's inbox:
// false when gid is no entity of this host.
type loopTeller interface {
	LoopNotice(gid string, cut *envelope.Envelope, text string) bool
}

// over reports whether env is past max-hops.
func (l *loopGuard) over(env *envelope.Envelope) bool {
	return l != nil && l.max > 0 && env.Hops > l.max
}

// Send refuses a send, reply, ask, answer or broadcast of this host's
// past max-hops (77, loop): nil when it may go. parent is the message it
// is a hop after (nil: none), whose sender is told of the cut.
func (l *loopGuard) Send(env *envelope.Envelope, parent *store.Record) error {
	if !l.over(env) {
		return nil
	}
	other := ""
	if parent != nil {
		other = parent.Sender
	}
	l.cut(env, "send", other)
	what := "message to " + env.Recipient.String()
	switch env.Kind {
	case envelope.Ask:
		what = "ask to " + env.Recipient.String()
	case envelope.Answer:
		what = "answer to " + env.Recipient.String()
	case envelope.Broadcast:
		what = "broadcast to broadcast." + env.Recipient.Group
	}
	return fault.New(fault.Refused, fault.KindLoop,
		"%s refused: hop %d of trace %s, past max-hops %d: a loop, cut here (nothing sent)",
		what, env.Hops, env.TraceID, l.max).
		WithHint("do not answer it again; fleet-trace %s shows where it was cut, and a new flow starts with a plain fleet-send NAME TEXT", env.TraceID)
}

// Arrival refuses a SEND, REPLY, ASK, ANSWER or BROADCAST copy from
// another host past max-hops (a *broker.Refusal: to bridge.dlq, its
// sender told): nil when it may come in.
func (l *loopGuard) Arrival(env *envelope.Envelope) error {
	switch env.Kind {
	case envelope.Send, envelope.Reply, envelope.Ask, envelope.Answer, envelope.Broadcast:
	default:
		return nil
	}
	if !l.over(env) {
		return nil
	}
	l.cut(env, "arrival", l.arrivalParty(env))
	return broker.Refuse(broker.ReasonLoop, "hop %d of trace %s, past max-hops %d: a loop, cut", env.Hops, env.TraceID, l.max)
}

// arrivalParty is the other party of a message cut on arrival: the
// sender of the message it replies to, by this host's own record, else
// its recipient here (in a loop of two the same entity; an answer's
// asker, since asks are never recorded).
func (l *loopGuard) arrivalParty(env *envelope.Envelope) string {
	if env.InReplyTo != "" && l.st != nil {
		if r, err := l.st.Record(env.InReplyTo); err == nil && r.Sender != "" {
			return r.Sender
		}
	}
	return env.Recipient.Gid
}

// cut tells of a loop cut where ("send" or "arrival"), and other (a gid,
// "" for none) when it is another entity of this host than the sender.
func (l *loopGuard) cut(env *envelope.Envelope, where, other string) {
	l.log.Warn("loop cut: past max-hops", "msg_id", env.MsgID, "trace_id", env.TraceID,
		"hops", env.Hops, "max_hops", l.max, "where", where, "sender", env.Sender.String(), "recipient", env.Recipient.String())
	l.audit.Message("loop_cut", env, 0, loopReason(env.Hops, l.max, where))
	l.metrics.LoopCut(where)
	if other == "" || other == env.Sender.Gid || l.tell == nil {
		return
	}
	to := env.Recipient.String()
	if env.Kind == envelope.Broadcast {
		to = "broadcast." + env.Recipient.Group
	}
	text := fmt.Sprintf("loop cut: %s %s from %s to %s, hop %d of trace %s, is past max-hops %d and was not delivered; "+
		"the flow stops here: do not answer it again (fleet-trace %s shows where it was cut)",
		strings.ToLower(string(env.Kind)), env.MsgID, env.Sender.String(), to, env.Hops, env.TraceID, l.max, env.TraceID)
	if l.tell.LoopNotice(other, env, text) {
		l.metrics.LoopNoticed()
		l.log.Info("loop cut: the other party told", "msg_id", env.MsgID, "trace_id", env.TraceID, "entity", other)
	}
}

// loopReason is the audit line's reason of a cut.
func loopReason(hops, max int, where string) string {
	at := "at send"
	if where == "arrival" {
		at = "on arrival"
	}
	return fmt.Sprintf("hop %d past max-hops %d, %s", hops, max, at)
}

// rate spends a token of env's sender→recipient pair (pairrate.go), and
// of its sender's urgent-rate for an urgent one (urgent.go): the
// last bound a send, reply, ask, answer or broadcast meets before
// anything of it is stored or published, after every refusal that would
// leave the token unspent (the loop guard, the recipient's policy, a
// host with no sealing key). Over pair-rate: 75, rate_limited. A
// broadcast's pair is its sender and its group; a retry of a message
// sent before (the same msg id) does not spend one again.
func (rt *router) rate(env *envelope.Envelope, retry bool) error {
	if retry {
		return nil
	}
	to, named := env.Recipient.Gid, env.Recipient.String()
	if env.Kind == envelope.Broadcast {
		to = "broadcast." + env.Recipient.Group // never a gid
		named = to
	}
	wait, ok := rt.pairs.Take(env.Sender.Gid, to)
	if ok {
		// urgent-rate on top (urgent.go): refused there, the pair's
		// token is handed back, so a refused message spends neither
		if err := rt.urgent.Take(env, retry); err != nil {
			rt.pairs.Give(env.Sender.Gid, to)
			return err
		}
		return nil
	}
	rt.metrics.RateLimited()
	shown := (wait + 99*time.Millisecond).Truncate(100 * time.Millisecond)
	rt.log.Info("send refused: over pair-rate", "trace_id", env.TraceID, "kind", string(env.Kind), "sender", env.Sender.String(),
		"recipient", named, "pair_rate", rt.pairs.Rate(), "retry_after", shown)
	e := fault.New(fault.TempFail, fault.KindRateLimited,
		"%s has sent %s its pair-rate of %d messages a minute: try again in %v (nothing was sent)",
		env.Sender.String(), named, rt.pairs.Rate(), shown).
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
