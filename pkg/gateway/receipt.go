package gateway

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// Honest status across hosts. When a message settles (delivered or dead)
// on its recipient's host, that gateway tells the sender's: a small
// RECEIPT, non-persistent on the broker. The sender's gateway moves its
// outbound record forward, so `fleet-send --status` and `--until` tell the
// truth wherever the recipient lives. A message that died anywhere also
// sends its sender a BOUNCE notice, delivered like any message.

type receiptBody struct {
	MsgID    string    `json:"msg_id"`
	State    string    `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Attempts int       `json:"attempts"`
	At       time.Time `json:"at"`
	// More: other messages of the same recipient from the same host,
	// settled together (a fleet-recv batch) — each with its sender, as the
	// receipt is addressed to the first one's only. A gateway before
	// coalesced receipts ignores them (those records stay "sent").
	More []receiptItem `json:"more,omitempty"`
	// Refused: a refusal notice — the message was refused at the broker
	// on the receipt's host, and this is a copy of it (refusals.go). A
	// gateway before notices settles its record dead without a dead letter.
	Refused *refusedCopy `json:"refused,omitempty"`
}

type receiptItem struct {
	MsgID    string    `json:"msg_id"`
	Sender   string    `json:"sender"` // the sender's gid, on the receipt's host
	State    string    `json:"state"`
	Reason   string    `json:"reason,omitempty"`
	Attempts int       `json:"attempts"`
	At       time.Time `json:"at"`
}

// maxReceiptItems bounds the messages one receipt may settle: a
// fleet-recv batch at most (defaultWindow).
const maxReceiptItems = defaultWindow

// quiet kinds never produce receipts or bounces (no loops, no noise).
func quiet(k envelope.Kind) bool {
	switch k {
	case envelope.Receipt, envelope.Bounce, envelope.Presence, envelope.TooLate, envelope.Broadcast, envelope.Notice:
		return true
	}
	return false
}

// receipts owns the settling of delivery records across hosts: what a
// settled message owes its sender (a RECEIPT to its host, or a BOUNCE
// here), the receipts that come back, and the signal that a record
// changed (router.WaitState, --until). Its broker and the host's signing key
// come once the broker is set up (Run); until then nothing crosses hosts.
type receipts struct {
	host    string
	st      *store.Store
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics // nil: off
	reg     *registry
	in      *intake                // a bounce is stored like any message
	side    *tasks                 // receipts are published on the side of the work
	records signal                 // a delivery record changed
	ctx     func() context.Context // publishes are aborted past the drain bound (hardCtx)

	// set once in Run, before any delivery starts
	br  *broker.Broker    // nil: single-host mode
	own ed25519.PublicKey // this host's signing key (refusal notices, refusals.go)

	answered   func(msgID, host string) error             // ask.go: an answer landed
	refusedAsk func(msgID, asker, askee, why string) bool // refusals.go: an ask of ours refused there
	named      func(r *store.Record) string               // a record's recipient as it is named here (route.go)
	plain      func(raw []byte) []byte                    // sealing.go: a sealed message of ours, opened for its dead letter (nil: as it is)
}

// Changed returns a channel closed at the next change of any delivery
// record this gateway knows of.
func (rc *receipts) Changed() <-chan struct{} { return rc.records.wait() }

// Notify says a delivery record changed.
func (rc *receipts) Notify() { rc.records.notify() }

// Settled is called once a message in a local inbox was delivered or died.
func (rc *receipts) Settled(env *envelope.Envelope, state, reason string, attempts int) {
	if rc.here(env, state, reason) {
		rc.send([]*envelope.Envelope{env}, state, reason, attempts)
	}
}

// SettledAll is Settled for messages of one inbox delivered together (a
// fleet-recv batch): one RECEIPT per sending host, not one per message.
func (rc *receipts) SettledAll(envs []*envelope.Envelope, state string, attempts int) {
	var hosts []string
	byHost := map[string][]*envelope.Envelope{}
	for _, env := range envs {
		if !rc.here(env, state, "") {
			continue
		}
		h := env.Sender.Host
		if byHost[h] == nil {
			hosts = append(hosts, h)
		}
		byHost[h] = append(byHost[h], env)
	}
	for _, h := range hosts {
		rc.send(byHost[h], state, "", attempts)
	}
}

// here does what a settled message needs on this host; true when
// its sender's host, another one, is owed a RECEIPT.
func (rc *receipts) here(env *envelope.Envelope, state, reason string) bool {
	rc.metrics.Settled(env.Kind, state == store.Dead, reason)
	rc.Notify()
	if quiet(env.Kind) {
		return false
	}
	if env.Sender.Host == rc.host || env.Sender.Gid == "" {
		if state == store.Dead {
			rc.Bounce(env.MsgID, env.TraceID, env.Sender.Gid, env.Recipient.String(), reason)
		}
		return false
	}
	return rc.br != nil
}

// send tells the gateway of envs' senders (all on one host, all
// to one recipient, at most maxReceiptItems) that they settled, in one
// RECEIPT addressed to the first one's sender. If that sender's inbox is
// gone (it left), the others are told again without it.
func (rc *receipts) send(envs []*envelope.Envelope, state, reason string, attempts int) {
	if len(envs) > maxReceiptItems {
		rc.send(envs[maxReceiptItems:], state, reason, attempts)
		envs = envs[:maxReceiptItems]
	}
	first := envs[0]
	now := time.Now().UTC()
	rb := receiptBody{MsgID: first.MsgID, State: state, Reason: reason, Attempts: attempts, At: now}
	for _, env := range envs[1:] {
		rb.More = append(rb.More, receiptItem{MsgID: env.MsgID, Sender: env.Sender.Gid, State: state, Reason: reason, Attempts: attempts, At: now})
	}
	body, _ := json.Marshal(rb)
	// from the recipient, so the sender's gateway can check that the
	// receipt comes from where its message went
	r := envelope.New(envelope.Receipt,
		envelope.Party{Gid: first.Recipient.Gid, Name: first.Recipient.Name, Host: rc.host},
		envelope.Party{Gid: first.Sender.Gid, Name: first.Sender.Name, Host: first.Sender.Host}, string(body))
	r.TraceID, r.InReplyTo = first.TraceID, first.MsgID
	rc.side.Go(func() {
		err := rc.publish(first.Sender.Gid, r)
		if err == nil {
			return
		}
		var rest []*envelope.Envelope
		if fault.KindOf(err) == fault.KindUnknownRecipient {
			for _, env := range envs[1:] {
				if env.Sender.Gid != first.Sender.Gid {
					rest = append(rest, env)
				}
			}
		}
		rc.log.Warn("receipt not sent", "msg_id", first.MsgID, "trace_id", first.TraceID, "messages", len(envs)-len(rest), "err", err)
		if len(rest) > 0 {
			rc.send(rest, state, reason, attempts)
		}
	})
}

// receiptRetry and receiptTries bound the publishes of one RECEIPT: one
// the broker did not take (unreachable, or its confirm lost with the
// connection: a cut, a reconnect) is published again, for about a minute
// in all, as the sender's record waits on it (outcome unknown stays
// unknown until it comes). A copy that got through before settles
// nothing twice: a record moves forward once.
var receiptRetry = backoff.Policy{Base: 500 * time.Millisecond, Max: 10 * time.Second, Jitter: true}

const receiptTries = 8

// publish publishes r, the RECEIPT for gid, within receiptTries.
func (rc *receipts) publish(gid string, r *envelope.Envelope) error {
	ctx := rc.ctx()
	for n := 1; ; n++ {
		err := rc.br.Publish(ctx, gid, r, false)
		if err == nil {
			return nil
		}
		switch fault.CodeOf(err) {
		case fault.Unavailable, fault.OutcomeUnknown, fault.TempFail:
			if n < receiptTries && ctx.Err() == nil {
				rc.log.Info("receipt not taken by the broker: trying again", "msg_id", r.InReplyTo, "attempt", n, "err", err)
				backoff.Sleep(ctx, receiptRetry.Delay(n))
				continue
			}
		}
		return err
	}
}

// Take moves local outbound records forward. A receipt is believed
// only from the host its messages went to: its sender is their recipient
// (on the signing host, admit.go), and each message was sent from here to
// that recipient by the entity the receipt names for it (the first: the
// one it is addressed to).
func (rc *receipts) Take(env *envelope.Envelope) error {
	var rb receiptBody
	if err := json.Unmarshal([]byte(env.Body), &rb); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "receipt body: %v", err)
	}
	if rb.MsgID != env.InReplyTo {
		return broker.Refuse(broker.ReasonMalformed, "a receipt for %q in reply to %q", rb.MsgID, env.InReplyTo)
	}
	var k *believedRefusal
	reason := clipReason(rb.Reason)
	if rb.Refused != nil {
		var err error
		k, err = believeRefusal(rc.own, env, &rb, rc.st.Sent)
		var r *broker.Refusal
		switch {
		case errors.As(err, &r) && r.Reason == broker.ReasonForged:
			// the refusal of bytes this host did not sign (a forgery in
			// its name, refused there): nothing of ours, nothing to say
			rc.log.Debug("a refusal notice for a message this host did not sign: ignored", "msg_id", rb.MsgID, "from", env.Sender.Host)
			return nil
		case errors.Is(err, errNotKept) && rc.refusedAsk(rb.MsgID, env.Recipient.Gid, env.Sender.Gid, reason):
			return nil // an ask too big to quote: its asker's wait ends, as an answer from there would
		case errors.Is(err, errNotKept):
			rb.Refused = nil // a digest of bytes not kept here: believed as any dead receipt from there
		case err != nil:
			return err
		case k.env.Kind == envelope.Ask:
			if rc.refusedAsk(rb.MsgID, k.env.Sender.Gid, k.env.Recipient.Gid, reason) {
				rc.audit.Message("dead", k.env, 0, reason)
				rc.metrics.Dead(k.env.Kind, reason)
			}
			return nil
		}
	}
	if rb.Refused != nil {
		raw := k.raw
		if rc.plain != nil {
			raw = rc.plain(raw)
		}
		dead, err := rc.st.KillOutbound(rb.MsgID, raw, reason, k.at)
		if err != nil || !dead {
			return err // settled already (delivered, or told before), or not ours to track
		}
		rc.log.Warn("a message of this host was refused by its recipient's host: dead here, its sender told",
			"msg_id", rb.MsgID, "trace_id", k.env.TraceID, "recipient", k.env.Recipient.String(), "reason", rb.Refused.Why)
		rc.audit.Message("dead", k.env, 0, reason)
		rc.metrics.Dead(k.env.Kind, reason)
		rc.Notify()
		rc.Bounce(rb.MsgID, k.env.TraceID, k.env.Sender.Gid, k.env.Recipient.String(), reason)
		return nil
	}
	if rb.State == "answered" {
		if len(rb.More) > 0 {
			return broker.Refuse(broker.ReasonMalformed, "an answered receipt for more than one message")
		}
		return rc.answered(rb.MsgID, env.Sender.Host)
	}
	if len(rb.More) >= maxReceiptItems {
		return broker.Refuse(broker.ReasonMalformed, "a receipt for %d messages (at most %d)", len(rb.More)+1, maxReceiptItems)
	}
	items := append([]receiptItem{{MsgID: rb.MsgID, Sender: env.Recipient.Gid, State: rb.State, Reason: rb.Reason, Attempts: rb.Attempts, At: rb.At}}, rb.More...)
	settles := make([]store.Settle, 0, len(items))
	for _, it := range items {
		if it.MsgID == "" {
			return broker.Refuse(broker.ReasonMalformed, "a receipt item without msg_id")
		}
		if it.State != store.Delivered && it.State != store.Dead {
			return broker.Refuse(broker.ReasonMalformed, "a receipt with state %q", it.State)
		}
		if orig, err := rc.st.Record(it.MsgID); err == nil && (orig.Recipient != env.Sender.Gid || orig.Sender != it.Sender) {
			return broker.Refuse(broker.ReasonWrongHost, "a receipt for message %s from %s, which is not its recipient", it.MsgID, env.Sender.String())
		}
		settles = append(settles, store.Settle{MsgID: it.MsgID, State: it.State, Reason: clipReason(it.Reason), Attempts: it.Attempts, At: it.At})
	}
	recs, errs := rc.st.SettleOutboundAll(settles)
	for i, it := range settles {
		if errs[i] != nil {
			rc.log.Info("receipt for a message this host does not know", "msg_id", it.MsgID, "trace_id", env.TraceID)
			continue
		}
		// the message's own trace, from its record
		trace := recs[i].TraceID
		name := "" // the receipt names only the sender it is addressed to
		if i == 0 {
			name = env.Recipient.Name
		}
		rc.audit.Write(audit.Line{Event: "receipt", TraceID: trace, MsgID: it.MsgID, Kind: string(env.Kind), Reason: it.State,
			Entity: name, Sender: env.Sender.Gid, Recipient: recs[i].Sender})
		if it.State == store.Dead && recs[i].State == store.Dead {
			to := env.Sender.String() // its recipient, named by its signing host
			if env.Sender.Name == "" || env.Sender.Host == "" {
				to = rc.named(recs[i]) // as last heard, or its gid
			}
			rc.Bounce(it.MsgID, trace, recs[i].Sender, to, it.Reason)
		}
	}
	rc.Notify()
	return nil
}

// LoopNotice puts the gateway's NOTICE about cut, a message cut as a
// loop (hops.go), in the inbox of gid when that is an entity of this
// host; false when it is not (or the notice could not be stored). The
// notice keeps the cut message's trace and hop count, so anything sent
// because of it is past max-hops too: it never restarts the loop.
func (rc *receipts) LoopNotice(gid string, cut *envelope.Envelope, text string) bool {
	b := rc.reg.Get(gid)
	if b == nil {
		return false
	}
	e := b.snapshot()
	env := envelope.New(envelope.Notice,
		envelope.Party{Name: "fleet", Host: rc.host},
		envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host}, text)
	env.TraceID, env.InReplyTo, env.Hops = cut.TraceID, cut.MsgID, cut.Hops
	if _, err := rc.in.Accept(env); err != nil {
		rc.log.Warn("loop notice not stored", "msg_id", cut.MsgID, "trace_id", cut.TraceID, "entity", e.Name, "err", err)
		return false
	}
	rc.audit.Write(audit.Line{Event: "loop_notice", TraceID: cut.TraceID, MsgID: cut.MsgID, Kind: string(cut.Kind),
		Recipient: e.Gid, Entity: e.Name, Reason: "told of the loop cut: " + env.MsgID})
	return true
}

// Bounce tells the sender of a dead message why, in its inbox.
func (rc *receipts) Bounce(msgID, traceID, senderGid, to, reason string) {
	b := rc.reg.Get(senderGid)
	if b == nil {
		return
	}
	e := b.snapshot()
	env := envelope.New(envelope.Bounce,
		envelope.Party{Name: "fleet", Host: rc.host},
		envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host},
		fmt.Sprintf("your message %s to %s was dead-lettered: %s", msgID, to, reason))
	env.TraceID, env.InReplyTo = traceID, msgID
	if _, err := rc.in.Accept(env); err != nil {
		rc.log.Warn("bounce not stored", "msg_id", msgID, "trace_id", traceID, "err", err)
		return
	}
	rc.audit.Write(audit.Line{Event: "bounced", TraceID: traceID, MsgID: msgID, Entity: e.Name, Sender: e.Gid, Reason: reason})
}
