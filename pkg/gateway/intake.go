package gateway

// intake.go — the whole path of a message into this host's store: a
// delivery from the broker (one, or a run of what an inbox's consumer had
// waiting), checked, stored in its recipient's inbox (dedup by msg id),
// and the broker's ack (the error each returns: nil acks; a refusal goes
// to bridge.dlq; broker.Hold holds the inbox's intake). A local send is
// stored by the same step (Accept). What comes in that is not mail for an
// inbox (receipts, answers, control and trace answers, live asks) is handed
// to the part it is for, through the hooks the Gateway wires.

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// intake owns the step from a message to its inbox. It holds no state of
// its own beyond what it is wired to: the store, the live entities, the
// open sends a reply may be for, the inbox caps.
type intake struct {
	host     string // this host
	stateDir string // named in a full store's hint
	st       *store.Store
	log      *slog.Logger
	audit    *audit.Log
	metrics  *metrics.Metrics // nil: off
	reg      *registry
	rdv      *rendezvous
	caps     *inboxCaps
	policy   *policy         // policy.go: who may reach the entity
	loops    *loopGuard      // hops.go: a message past max-hops is cut as it arrives
	urgent   *urgentArrivals // urgent.go: another host's sender past its bound comes in as normal mail
	crash    crashpoint

	// the parts what is not inbox mail is handed to (wired by the Gateway)
	kill          func(env *envelope.Envelope, reason string, attempts int) // dead-letter, with its receipt
	receipt       func(*envelope.Envelope) error                            // receipt.go
	answer        func(*envelope.Envelope) error                            // ask.go
	tooLate       func(*envelope.Envelope) error                            // ask.go
	ask           func(b *mailbox, env *envelope.Envelope)                  // ask.go: live-only, memory
	controlResult func(*envelope.Envelope) error                            // control_request.go
	traceResult   func(*envelope.Envelope) error                            // trace.go
}

// Take is the broker's handler for one delivery to a local inbox. The
// message is in the host store (or handed to its part) before the broker
// delivery is acked. Taking it in at once, rather than holding the broker
// delivery until the entity has it, means the gateway never nears
// RabbitMQ's consumer_timeout however long a pull entity stays away, and
// one durable store carries every guarantee.
func (in *intake) Take(env *envelope.Envelope) error {
	switch env.Kind {
	case envelope.SpawnResult, envelope.StopResult:
		return in.controlResult(env)
	case envelope.TraceResult:
		return in.traceResult(env)
	}
	// the host's store cannot take anything now (a full disk): the
	// broker holds this inbox's intake, in order, until it can
	return holdFull(in.take(env))
}

func (in *intake) take(env *envelope.Envelope) error {
	switch env.Kind { // for this gateway, not for the entity's inbox
	case envelope.Receipt:
		return in.receipt(env)
	case envelope.Answer:
		if err := in.loops.Arrival(env); err != nil {
			return err // past max-hops here: cut, the asker told (hops.go)
		}
		return in.answer(env)
	case envelope.Bounce, envelope.Notice:
		// a bounce is made by the sender's own gateway from a receipt, a
		// notice by the entity's own (hops.go)
		return broker.Refuse(broker.ReasonMisrouted, "a %s never crosses hosts", env.Kind)
	}
	if err := in.loops.Arrival(env); err != nil {
		return err
	}
	b, err := in.box(env)
	if err != nil {
		return err
	}
	if env.Recipient.Group == "" {
		// the recipient is named as this host knows it, not as the
		// sending host last heard it (a reply to a gid has no name)
		e := b.snapshot()
		env.Recipient.Name, env.Recipient.Host = e.Name, e.Host
	}
	switch env.Kind {
	case envelope.Ask:
		in.audit.Message("taken", env, 0, "")
		in.ask(b, env) // live-only: memory, never the store
		return nil
	case envelope.TooLate:
		return in.tooLate(env)
	}
	if in.ownCopy(env, b) {
		return nil // our own broadcast, back from the broker
	}
	if _, err := in.caps.Fits([]*envelope.Envelope{env}); err != nil {
		return err // no room: the broker holds it (inboxcap.go)
	}
	recs, _, err := in.AcceptAll([]*envelope.Envelope{env})
	if err == nil {
		in.expire(env, recs[0])
	}
	return err
}

// TakeBatch is the broker's batch handler for a local inbox: what its
// consumer had waiting, in order. Messages for the entity's inbox (SEND,
// REPLY, BROADCAST copies) that come one after another are stored in one
// store operation — one log record and one flush for the run, instead of
// one each — and every other kind goes through Take alone, in its place.
// So the order of an inbox's intake is kept: a run is stored before what
// follows it is handled, and at the first message not taken in (not a
// refusal) nothing after it is tried (broker.ErrNotTried): the broker
// carries on from there one at a time.
func (in *intake) TakeBatch(envs []*envelope.Envelope) []error {
	errs := make([]error, len(envs))
	var run []int // indexes of mail waiting for one store operation
	// flush stores the run; false: it could not be (nothing of it was)
	flush := func() bool {
		if len(run) == 0 {
			return true
		}
		batch := make([]*envelope.Envelope, len(run))
		for k, i := range run {
			batch[k] = envs[i]
		}
		// what the inbox has room for is stored; from the first it has
		// none for, the broker holds the rest, in order (inboxcap.go)
		n, full := in.caps.Fits(batch)
		stored := n > 0
		if stored {
			recs, _, err := in.AcceptAll(batch[:n])
			if err != nil {
				errs[run[0]] = holdFull(err)
				for _, i := range run[1:] {
					errs[i] = broker.ErrNotTried
				}
				run = nil
				return false
			}
			for k := range n {
				in.expire(batch[k], recs[k])
			}
		}
		if full != nil {
			errs[run[n]] = full
			for _, i := range run[n+1:] {
				errs[i] = broker.ErrNotTried
			}
			run = nil
			return false
		}
		run = run[:0]
		return true
	}
	stopAt := func(i int, err error) []error {
		errs[i] = err
		for k := i + 1; k < len(envs); k++ {
			errs[k] = broker.ErrNotTried
		}
		return errs
	}
	for i, env := range envs {
		switch env.Kind {
		case envelope.Send, envelope.Reply, envelope.Broadcast:
			if err := in.loops.Arrival(env); err != nil {
				errs[i] = err // a loop cut (hops.go): refused, as below
				continue
			}
			b, err := in.box(env)
			var r *broker.Refusal
			switch {
			case errors.As(err, &r):
				errs[i] = err // refused: nothing of it is kept, the order of the rest is unchanged
				continue
			case err != nil:
				if !flush() {
					return stopAt(i, broker.ErrNotTried)
				}
				return stopAt(i, err)
			}
			if !in.ownCopy(env, b) {
				run = append(run, i)
			}
			continue
		}
		if !flush() {
			return stopAt(i, broker.ErrNotTried)
		}
		err := in.Take(env)
		var r *broker.Refusal
		if err != nil && !errors.As(err, &r) {
			return stopAt(i, err)
		}
		errs[i] = err
	}
	flush()
	return errs
}

// holdFull is the intake's mapping of a store that cannot take anything
// now (a full disk): the broker holds the inbox's intake, in order, until
// it can.
func holdFull(err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) && fe.Kind == fault.KindStateDir {
		return broker.Hold(err)
	}
	return err
}

// box is the local mailbox of a message from the broker; a broadcast copy
// must be for a member.
func (in *intake) box(env *envelope.Envelope) (*mailbox, error) {
	b := in.reg.Get(env.Recipient.Gid)
	if b == nil {
		return nil, fmt.Errorf("no local entity %s", env.Recipient.Gid)
	}
	if g := env.Recipient.Group; g != "" && g != "all" && !slices.Contains(b.snapshot().Groups, g) {
		// the broker copied it here by its routing key, which the
		// publisher chose: membership is checked here, not believed
		return nil, broker.Refuse(broker.ReasonNotMember, "a broadcast to %s in the inbox of %s, which is not a member", g, env.Recipient.Gid)
	}
	if err := replayClaim(in.st, in.host, env); err != nil {
		return nil, err
	}
	if err := idClaim(in.st, in.host, env); err != nil {
		return nil, err
	}
	// the policy (policy.go); this host's own broadcast copies, back from
	// the broker, met it when they were sent (ownCopy drops those)
	if env.Sender.Host != in.host {
		if err := in.policy.Arrival(b.snapshot(), env); err != nil {
			// the sender's host hears it (a refusal notice): dead, a BOUNCE
			return nil, broker.Refuse(broker.ReasonNotAccepted, "%s", err.Error())
		}
		in.urgent.Arrival(env)
	}
	return b, nil
}

// idClaim refuses a message from the broker under a msg id this host
// already has from another host. A msg id is chosen by its sender, so a
// host that learnt one (a broadcast member, a trace answer) could send a
// message of its own under it first and make the real one a duplicate,
// dropped as seen. Admission proved the signing host is the sender's
// host: an id is that host's only. The second comes to bridge.dlq with
// its reason (for an operator to replay), never dropped; the same
// message again from its own host is still a plain duplicate.
func idClaim(st *store.Store, self string, env *envelope.Envelope) error {
	if h := recordedSender(st, self, store.Key(env)); h != "" && h != env.Sender.Host {
		return broker.Refuse(broker.ReasonWrongHost, "message %s from %q, but this host has a message %s from %q: a msg id is its sender's host's only",
			env.MsgID, env.Sender.Host, env.MsgID, h)
	}
	return nil
}

// replayClaim checks what a replay from the broker says of the dead
// letter it names against what this host knows of that message. A dead
// letter is its msg id and its sender's host: the replay keeps the
// original's sender, whose host signed it (admission), and the
// recipient's store takes one replay per such pair (store.ReplayedKey).
// So another host naming the msg id in replay_of never stands in for the
// real replay; when this host has the message itself (it was taken, or
// died, here) and another host sent it, the claim is refused to
// bridge.dlq. A msg id this host never saw is the signing host's word
// about a message of its own.
func replayClaim(st *store.Store, self string, env *envelope.Envelope) error {
	if env.ReplayOf == "" {
		return nil
	}
	if h := recordedSender(st, self, env.ReplayOf, env.ReplayOf+"/"+env.Recipient.Gid); h != "" && h != env.Sender.Host {
		return broker.Refuse(broker.ReasonWrongHost, "a replay of message %s signed by %q, but this host has it from %q: only its sender's host replays it",
			env.ReplayOf, env.Sender.Host, h)
	}
	return nil
}

// recordedSender is the host that sent the message of the first of keys
// this host has a delivery record of, or "" for none. A gid names the
// host it was made on; one made before gids did is of this host (self):
// one from another host is never admitted.
func recordedSender(st *store.Store, self string, keys ...string) string {
	for _, k := range keys {
		r, err := st.Record(k)
		if err != nil || r.Sender == "" {
			continue
		}
		if h := ident.GidHost(r.Sender); h != "" {
			return h
		}
		return self
	}
	return ""
}

// ownCopy reports whether env is this entity's own broadcast back from
// the broker (not taken in); a broadcast copy for another member is
// addressed to it by name here.
func (in *intake) ownCopy(env *envelope.Envelope, b *mailbox) bool {
	if env.Recipient.Group == "" {
		return false
	}
	if env.Sender.Gid == env.Recipient.Gid {
		return true
	}
	e := b.snapshot()
	if env.Sender.Host == in.host && !in.policy.Allows(e, env) {
		return true // a member whose policy refused it here, as it was sent: no copy
	}
	env.Recipient.Name, env.Recipient.Host = e.Name, e.Host
	return false
}

// expire dead-letters a message just taken in that has expired: per-
// message TTL acts only at a queue's head, so an expired message that
// waited behind live ones is never delivered.
func (in *intake) expire(env *envelope.Envelope, rec *store.Record) {
	if rec.State == store.Accepted && env.Expired(time.Now()) {
		in.kill(env, "expired before delivery", 0)
	}
}

// Accept stores env in its local recipient's inbox (dedup by msg id) and
// wakes the recipient's delivery.
func (in *intake) Accept(env *envelope.Envelope) (*store.Record, error) {
	recs, _, err := in.AcceptAll([]*envelope.Envelope{env})
	if err != nil {
		return nil, err
	}
	return recs[0], nil
}

// AcceptAll is Accept for several messages, in order, in one store
// operation (one log record, one flush): all are stored (or known
// duplicates: dups[i]), or, with an error, none is. A reply an open send
// waits for is handed to it here (rendezvous.go).
func (in *intake) AcceptAll(envs []*envelope.Envelope) ([]*store.Record, []bool, error) {
	ws := make([]*replyWaiter, len(envs))
	for i, env := range envs {
		ws[i] = in.rdv.Claim(env) // a reply an open send waits for
	}
	recs, dups, err := in.st.AcceptBatch(envs, time.Now().UTC())
	for i, w := range ws {
		if w == nil {
			continue
		}
		// always answer a claimed waiter: the reply, or nil for nothing
		if err == nil && !dups[i] {
			w.ch <- envs[i]
		} else {
			in.rdv.Unclaim(store.Key(envs[i]))
			w.ch <- nil
		}
	}
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil, fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient %s", envs[0].Recipient)
		}
		in.log.Error("storing a message", "msg_id", envs[0].MsgID, "trace_id", envs[0].TraceID, "messages", len(envs), "err", err)
		return nil, nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not store the message").
			WithHint("free space in the state folder %s; nothing accepted before is lost", in.stateDir)
	}
	var woken *mailbox
	for i, env := range envs {
		if dups[i] {
			in.log.Info("duplicate msg id: not stored again", "msg_id", env.MsgID, "trace_id", env.TraceID)
			continue
		}
		event := "accepted" // from an entity of this host (or the gateway itself: a bounce)
		if env.Sender.Host != "" && env.Sender.Host != in.host {
			event = "taken" // from the broker, into this host's store
		}
		in.audit.Message(event, env, 0, "")
		in.metrics.Accepted(env.Kind)
		in.crash.at(in.log, "after-accept")
		if b := in.reg.Get(env.Recipient.Gid); b != nil && b != woken {
			b.notify()
			woken = b
		}
	}
	return recs, dups, nil
}

// clipReason keeps a reason from another host to one printable line of at
// most 500 bytes: it is shown in fleet-roster dead and in bounce notices.
func clipReason(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return ' '
		}
		return r
	}, s)
	if len(s) > 500 {
		s = strings.ToValidUTF8(s[:500], "")
	}
	return s
}
