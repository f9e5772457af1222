package broker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Across hosts, identity comes from the key (design decision 6): every
// gateway signs the exact bytes it publishes with its Ed25519 key
// (header fleet-sig) and names itself (header fleet-host); the receiver
// checks both, and every claim the message makes, before anything is taken
// in. What fails is refused: a copy goes to bridge.dlq with the reason in
// fleet-reason, the original is acked, and one ERROR line says why.

// Signer signs the bytes of a published body.
type Signer func(body []byte) []byte

// Verifier checks that body, signed by host, is authentic and that env's
// claims fit the signing host. A nil error admits the message; a refusal
// should be a *Refusal (anything else is refused as not authentic).
type Verifier func(host string, body, sig []byte, env *envelope.Envelope) error

// SetAuth sets the signer and the verifier; call before Run.
func (b *Broker) SetAuth(sign Signer, verify Verifier) { b.sign, b.verify = sign, verify }

// Sealer seals the text of what this gateway publishes to the hosts that
// deliver it, and opens what it takes in (issue 27, pkg/seal). The order
// is seal, encode, sign; then verify, open: the signature covers the
// sealed bytes, and nothing from an unknown or lying host is decrypted.
type Sealer interface {
	// Seal seals env's body in place (env is the broker's own copy),
	// or leaves it as it is (a kind without text, a host named to get
	// plain text). An error stops the publish before anything is
	// written; it is returned to the publisher as it is (a *fault.Error).
	Seal(env *envelope.Envelope) error
	// Open opens env's sealed body in place, env signed by host and
	// admitted by the verifier; a refusal should be a *Refusal
	// (anything else is refused as tampered).
	Open(host string, env *envelope.Envelope) error
}

// SetSealer sets the sealer; call before Run. Without one, bodies travel
// as they are.
func (b *Broker) SetSealer(s Sealer) { b.sealer = s }

// sealed returns env as it is to be published: a sealed copy, or env
// itself when there is no sealer.
func (b *Broker) sealed(env *envelope.Envelope) (*envelope.Envelope, error) {
	if b.sealer == nil || env.Kind == envelope.Presence {
		return env, nil
	}
	c := *env
	if err := b.sealer.Seal(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

// open opens a delivery's envelope, once authentic (signed by host): a
// *Refusal, or a *Drop the sealer returned as it is.
func (b *Broker) open(d amqp.Delivery, env *envelope.Envelope) error {
	if b.sealer == nil {
		return nil
	}
	host, _ := d.Headers["fleet-host"].(string)
	if err := b.sealer.Open(host, env); err != nil {
		var drop *Drop
		if errors.As(err, &drop) {
			return drop
		}
		return asRefusal(err, ReasonTampered)
	}
	return nil
}

// Drop is the Sealer's word that an authentic message is not to be
// taken in, and is no fault of its sender's: a sealed broadcast copy
// whose member gets its copy in the clear instead, as the signed
// envelope itself says (issue 36). It is acked, logged and told to
// OnDropped; no dead letter, no refusal notice. Only what the signing
// host signed may lead to one (never a header, never the body).
type Drop struct{ Why string }

func (d *Drop) Error() string { return "dropped: " + d.Why }

// Dropped returns a Drop saying why.
func Dropped(format string, args ...any) *Drop { return &Drop{Why: fmt.Sprintf(format, args...)} }

// OnDropped sets a function told of every message dropped (Drop), for
// the audit log; call before Run.
func (b *Broker) OnDropped(f func(env *envelope.Envelope, why string)) { b.onDropped = f }

// drop acks a delivery the sealer said to drop.
func (b *Broker) drop(d amqp.Delivery, q string, env *envelope.Envelope, why string) {
	b.log.Info("message dropped: "+why, "msg_id", env.MsgID, "trace_id", env.TraceID, "queue", q)
	if err := d.Ack(false); err != nil {
		b.log.Warn("ack failed; the redelivery will be dropped again", "msg_id", env.MsgID, "trace_id", env.TraceID, "queue", q, "err", err)
	}
	if b.onDropped != nil {
		b.onDropped(env, why)
	}
}

// Refusal reasons: the fleet-reason header of a refused message in
// bridge.dlq. Fields are only ever added.
const (
	ReasonMalformed   = "malformed"      // not an envelope, or a field outside its grammar
	ReasonNewerSchema = "newer_schema"   // a schema major this build does not read
	ReasonUnsigned    = "unsigned"       // no fleet-host or fleet-sig header
	ReasonUntrusted   = "untrusted_host" // signed by a host not in the trust file
	ReasonForged      = "bad_signature"  // the signature does not verify
	ReasonWrongHost   = "wrong_host"     // a claim about another host than the signer
	ReasonReplay      = "replay"         // older than its window, or superseded
	ReasonNotMember   = "not_member"     // a broadcast copy in a non-member's inbox
	ReasonMisrouted   = "misrouted"      // in an inbox or queue it was not addressed to
	ReasonNotAccepted = "not_accepted"   // its recipient's inbound policy does not accept its sender
	// sealed bodies (issue 27)
	ReasonSealedElsewhere = "sealed_elsewhere" // sealed to other hosts' keys, none of this host's
	ReasonUnknownSealKey  = "unknown_seal_key" // sealed to a key of this host it destroyed, or retired past its grace
	ReasonTampered        = "tampered"         // sealed bytes altered, malformed, or sealed for another message
	ReasonUnsealed        = "unsealed"         // text in the clear from a host not named in plaintext-hosts
)

// Refusal is why a message from the broker is refused. Err is what may
// be told across hosts (a refusal notice, a dead letter's header); Local
// is what only this host's log may say (a path of its own files: its
// trust file, its state folder), never put in anything that leaves it.
type Refusal struct {
	Reason string // one of the Reason constants
	Err    error
	Local  string
}

// Here adds this host's own detail to r (Local), for its log only.
func (r *Refusal) Here(format string, args ...any) *Refusal {
	r.Local = fmt.Sprintf(format, args...)
	return r
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// ReasonLoop: a SEND or REPLY past the receiving gateway's max-hops in
// its trace (issue 37.2: a loop, cut on arrival). A refusal reason as the
// others above.
const ReasonLoop = "loop"

// Refuse returns a refusal for reason.
func Refuse(reason, format string, args ...any) *Refusal {
	return &Refusal{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// asRefusal classifies err as a refusal: a decode error by its fault kind,
// any other error as not authentic.
func asRefusal(err error, fallback string) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	if fault.KindOf(err) == fault.KindNewerSchema {
		return &Refusal{Reason: ReasonNewerSchema, Err: err}
	}
	return &Refusal{Reason: fallback, Err: err}
}

// signHeaders adds the signature headers to msg.
func (b *Broker) signHeaders(msg *amqp.Publishing) {
	if b.sign == nil {
		return
	}
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers["fleet-host"] = b.cfg.Host
	msg.Headers["fleet-sig"] = base64.StdEncoding.EncodeToString(b.sign(msg.Body))
}

// authentic checks a delivery's signature and claims. An unsigned one
// reaches the verifier with an empty host and signature.
func (b *Broker) authentic(d amqp.Delivery, env *envelope.Envelope) error {
	if b.verify == nil {
		return nil
	}
	host, _ := d.Headers["fleet-host"].(string)
	s, _ := d.Headers["fleet-sig"].(string)
	sig, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return Refuse(ReasonUnsigned, "malformed fleet-sig header")
	}
	return b.verify(host, d.Body, sig, env)
}

// refuse sends a refused delivery to bridge.dlq: a copy with its reason
// (fleet-reason, fleet-error, fleet-refused-by, fleet-queue) is published
// to bridge.msg as fleet.dead.<host> (so to bridge.dlq) and confirmed,
// then the delivery is acked; if the copy
// cannot be published, the delivery is rejected without requeue (an inbox
// dead-letters it to bridge.dlq itself, without the reason). ack is false
// for an auto-ack delivery (the roster queue). One ERROR line says why,
// with the trace id when the envelope could be read.
func (b *Broker) refuse(d amqp.Delivery, queue string, env *envelope.Envelope, r *Refusal, ack bool) {
	claimed, _ := d.Headers["fleet-host"].(string)
	attrs := []any{"queue", queue, "reason", r.Reason, "err", r.Err.Error(), "claimed_host", claimed}
	if r.Local != "" {
		attrs = append(attrs, "here", r.Local)
	}
	if env != nil {
		attrs = append(attrs, "msg_id", env.MsgID, "trace_id", env.TraceID, "kind", string(env.Kind), "claimed_sender", env.Sender.String())
	} else {
		attrs = append(attrs, "msg_id", d.MessageId)
	}
	b.log.Error("message refused: "+r.Reason+"; sent to bridge.dlq", attrs...)
	b.refused(r.Reason, claimed)
	if b.onRefusedMsg != nil && ack {
		s, _ := d.Headers["fleet-sig"].(string)
		sig, _ := base64.StdEncoding.DecodeString(s)
		m := RefusedMsg{Queue: queue, Refusal: r, Env: env, Body: d.Body, Sig: sig, SignedBy: claimed}
		if env == nil {
			m.Env, m.Unread = unreadHead(d, queue, claimed), true
		}
		if m.Env != nil {
			b.onRefusedMsg(m)
		}
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers["fleet-reason"] = r.Reason
	headers["fleet-error"] = clip(r.Err.Error(), 500)
	headers["fleet-refused-by"] = b.cfg.Host
	headers["fleet-queue"] = queue
	if env != nil {
		headers["fleet-trace-id"] = env.TraceID
	}
	msg := amqp.Publishing{
		ContentType: d.ContentType, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp,
		DeliveryMode: amqp.Persistent, Body: d.Body, Headers: headers,
	}
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	copied := gen != nil && b.copyDead(gen, msg) == nil
	if !ack {
		if !copied {
			b.log.Warn("refused message not copied to bridge.dlq", "queue", queue, "msg_id", d.MessageId)
		}
		return
	}
	if copied {
		_ = d.Ack(false)
	} else {
		_ = d.Nack(false, false)
	}
}

// copyDead publishes a dead letter's copy to bridge.dlq, mandatory: a copy
// the broker cannot route (bridge.dlq not bound as fleet.dead.*, a
// topology from before it) is an error, said loudly, never a silent loss.
func (b *Broker) copyDead(gen *generation, msg amqp.Publishing) error {
	switch gen.publisher().publishTo(context.Background(), ExMsg, DeadKey(b.cfg.Host), msg, time.Now().Add(b.cfg.PublishTimeout), true) {
	case resAck:
		return nil
	case resReturned:
		b.log.Error("bridge.dlq is not bound to bridge.msg as fleet.dead.*: dead letters have nowhere to go",
			"msg_id", msg.MessageId, "fix", "run fleet-gw broker-setup for this host (it makes the binding)")
		return errors.New("dead letter unroutable")
	default:
		return errors.New("dead letter not confirmed")
	}
}

// OnRefused sets a function told of every refusal (its reason and the
// host the message claimed), for the roster's "untrusted" rows.
func (b *Broker) OnRefused(f func(reason, claimedHost string)) { b.onRefused = f }

// RefusedMsg is a refused delivery of an inbox or the control queue whose
// envelope could be read, or whose delivery says enough of itself
// (unreadHead): what a refusal notice to its sender is made of. Nothing
// of it is proven but the bytes themselves: the sender checks its own
// signature.
type RefusedMsg struct {
	Queue    string
	Refusal  *Refusal
	Env      *envelope.Envelope
	Body     []byte // the bytes as published
	Sig      []byte // their fleet-sig (nil: none, or not base64)
	SignedBy string // the fleet-host header: the host it claims to be from
	// Unread: the body could not be read as an envelope of this build (a
	// newer schema, malformed, over max-body); Env is then only what the
	// delivery says of itself (unreadHead), never its claims checked.
	Unread bool
}

// unreadHead is what a delivery of an inbox whose body is no envelope of
// this build says of itself, as an envelope with only these fields: its
// msg id and kind (the AMQP message id and type, as publishing sets them),
// its sender (the fleet-sender header, else the body's "sender" if the
// body is JSON that names one), its sender's host (the fleet-host header),
// trace id, and the entity whose inbox it is in. nil when that is not a
// msg id, a kind, a sender gid and an inbox; or when the header and the
// body disagree. None of it is proven: it only says where a refusal notice
// may go, and the host it goes to believes it only for bytes it signed
// itself (gateway/refusals.go).
func unreadHead(d amqp.Delivery, queue, signedBy string) *envelope.Envelope {
	gid, inbox := strings.CutPrefix(queue, "agent.")
	gid, suffix := strings.CutSuffix(gid, ".inbox")
	if !inbox || !suffix || !ident.IsGid(gid) {
		return nil // a control queue, the roster: no inbox, nobody to tell
	}
	env := &envelope.Envelope{MsgID: d.MessageId, Kind: envelope.Kind(d.Type), Recipient: envelope.Party{Gid: gid}}
	env.Sender.Gid, _ = d.Headers["fleet-sender"].(string)
	env.TraceID, _ = d.Headers["fleet-trace-id"].(string)
	var body struct { // a newer schema may keep these; a malformed one may still have them
		MsgID  string `json:"msg_id"`
		Kind   string `json:"kind"`
		Sender struct {
			Gid string `json:"gid"`
		} `json:"sender"`
	}
	if json.Unmarshal(d.Body, &body) == nil {
		for _, f := range [...]struct {
			have *string
			body string
		}{
			{&env.MsgID, body.MsgID}, {(*string)(&env.Kind), body.Kind}, {&env.Sender.Gid, body.Sender.Gid}} {
			switch {
			case *f.have == "":
				*f.have = f.body
			case f.body != "" && f.body != *f.have:
				return nil // the delivery contradicts itself
			}
		}
	}
	if !envelope.ValidID(env.MsgID) || !env.Kind.Known() || !ident.IsGid(env.Sender.Gid) || signedBy == "" {
		return nil
	}
	env.Sender.Host = signedBy
	return env
}

// OnRefusedMsg sets a function told of every refused delivery of an inbox
// or the control queue that says who sent it (call before Run). It runs on the consumer's
// goroutine: it must not block.
func (b *Broker) OnRefusedMsg(f func(RefusedMsg)) { b.onRefusedMsg = f }

func (b *Broker) refused(reason, host string) {
	if b.onRefused != nil {
		b.onRefused(reason, host)
	}
	if b.observe.Refused != nil {
		b.observe.Refused(reason)
	}
}

// clip keeps s to at most n bytes of valid UTF-8 (a header value).
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") // no rune cut in half
	}
	return s
}
