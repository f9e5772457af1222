package gateway

// refusals.go — a refusal is told to its sender (issue 24, point 3).
//
// A message this host refuses from the broker (its sender's host not
// admitted here, a bad signature, a replay, a malformed field, a claim
// that does not fit) goes to bridge.dlq as before (broker/auth.go). When
// it is a SEND or a REPLY to an entity of this host, this host also tells
// the host it claims to come from: a dead RECEIPT for it, with the reason,
// and with the refused bytes and their signature exactly as they came.
//
// The receiver cannot know who really sent what it refuses, so the notice
// proves nothing by itself; the sender decides what to believe
// (believeRefusal): the notice must be signed by a host it trusts (the
// admission check, as for every receipt), come from the recipient of the
// message, and carry bytes this host signed itself with that msg id,
// sender and recipient. Then its outbound record goes from accepted to
// dead with the reason, the bytes are kept as its dead letter (so
// fleet-dlq replay works there once the cause is fixed), and its sender
// gets a BOUNCE. A forged notice could only kill a message of ours that
// the signer of the notice received: that host could as well refuse it.
// A notice of bytes this host did not sign (a forgery in its name, which
// the receiver rightly refused) is ignored quietly: a forger cannot make
// this host's log noisy through another host.
//
// Noise: a notice goes for a real message only (never for presence,
// receipts, bounces, broadcast copies or control requests), and at most
// noticesPerMinute a minute to one host; the rest are counted in one log
// line a minute.

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// noticesPerMinute bounds the refusal notices sent to one host a minute.
const noticesPerMinute = 60

// refusedCopy is what a refusal notice carries of the refused message.
type refusedCopy struct {
	Why  string `json:"why"`  // the broker.Reason constant
	Body string `json:"body"` // base64 of the bytes as published
	Sig  string `json:"sig"`  // base64 of their fleet-sig
}

// refusalNotices sends the notices of one gateway. It owns the per-host
// counts of notices sent in the current minute.
type refusalNotices struct {
	host    string
	maxBody int                                     // a notice must fit a body
	publish func(to string, env *envelope.Envelope) // on the side: never blocks the caller
	log     *slog.Logger

	mu   sync.Mutex
	runs map[string]*noticeRun // sender host -> this minute's notices
}

type noticeRun struct {
	start   time.Time
	sent    int
	dropped int
}

// refused is the broker's OnRefusedMsg: it sends a notice for m when one
// is owed and allowed.
func (n *refusalNotices) refused(m broker.RefusedMsg) {
	env := m.Env
	switch {
	case env.Kind != envelope.Send && env.Kind != envelope.Reply:
		return // only a message someone waits on
	case env.Recipient.Group != "" || ident.GidHost(env.Recipient.Gid) != n.host:
		return // a broadcast copy, or not for an entity of this host
	case len(m.Sig) == 0 || m.SignedBy == "" || m.SignedBy == n.host || env.Sender.Host != m.SignedBy:
		return // unsigned, ours, or not even claimed by its signer: nobody to tell
	case !ident.IsGid(env.Sender.Gid) || ident.GidHost(env.Sender.Gid) != m.SignedBy:
		return
	}
	rc := refusedCopy{Why: m.Refusal.Reason, Body: base64.StdEncoding.EncodeToString(m.Body), Sig: base64.StdEncoding.EncodeToString(m.Sig)}
	reason := clipReason("refused by " + n.host + ": " + m.Refusal.Error())
	rb := receiptBody{MsgID: env.MsgID, State: store.Dead, Reason: reason, At: time.Now().UTC(), Refused: &rc}
	body, err := json.Marshal(rb)
	if err != nil || len(body) > n.maxBody {
		return // too big to carry back whole: the copy in bridge.dlq stays the only trace
	}
	if !n.allow(m.SignedBy, time.Now()) {
		return
	}
	r := envelope.New(envelope.Receipt,
		envelope.Party{Gid: env.Recipient.Gid, Name: env.Recipient.Name, Host: n.host},
		envelope.Party{Gid: env.Sender.Gid, Name: env.Sender.Name, Host: env.Sender.Host}, string(body))
	r.TraceID, r.InReplyTo = env.TraceID, env.MsgID
	n.publish(env.Sender.Gid, r)
}

// allow counts a notice to host; false past noticesPerMinute this minute.
func (n *refusalNotices) allow(host string, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runs == nil {
		n.runs = map[string]*noticeRun{}
	}
	run := n.runs[host]
	if run == nil || now.Sub(run.start) >= time.Minute {
		if run != nil && run.dropped > 0 {
			n.log.Warn("refusal notices not sent: too many for one host", "host", host, "dropped", run.dropped, "per_minute", noticesPerMinute)
		}
		if run == nil && len(n.runs) >= 256 {
			for h, r := range n.runs { // forget the stale ones; a flood of hosts stays bounded
				if now.Sub(r.start) >= time.Minute {
					delete(n.runs, h)
				}
			}
			if len(n.runs) >= 256 {
				return false
			}
		}
		run = &noticeRun{start: now}
		n.runs[host] = run
	}
	if run.sent >= noticesPerMinute {
		run.dropped++
		return false
	}
	run.sent++
	return true
}

// believedRefusal is a refusal notice this host believes: its message's
// bytes as sent (the dead letter) and the envelope they hold.
type believedRefusal struct {
	raw []byte
	env *envelope.Envelope
	at  time.Time
}

// believeRefusal checks a refusal notice from the broker (a RECEIPT whose
// signer the admission check already trusts) against own, this host's
// key: the bytes it carries are a message this host signed, with the
// notice's msg id, sent by the entity the notice is addressed to, to the
// entity the notice is from. Anything else is refused.
func believeRefusal(own ed25519.PublicKey, notice *envelope.Envelope, rb *receiptBody) (*believedRefusal, error) {
	rc := rb.Refused
	if rb.State != store.Dead || len(rb.More) > 0 {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice must be one dead receipt")
	}
	raw, err1 := base64.StdEncoding.DecodeString(rc.Body)
	sig, err2 := base64.StdEncoding.DecodeString(rc.Sig)
	if err1 != nil || err2 != nil {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice with a copy that is not base64")
	}
	if len(own) == 0 || !ed25519.Verify(own, raw, sig) {
		return nil, broker.Refuse(broker.ReasonForged, "a refusal notice for message %s that this host did not sign", rb.MsgID)
	}
	env, err := envelope.Decode(raw, 1<<30)
	if err != nil {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice with a copy that is not an envelope: %v", err)
	}
	if env.MsgID != rb.MsgID || env.Recipient.Gid != notice.Sender.Gid || env.Sender.Gid != notice.Recipient.Gid {
		return nil, broker.Refuse(broker.ReasonWrongHost, "a refusal notice for message %s from %s, which is not its recipient", rb.MsgID, notice.Sender.String())
	}
	at := rb.At.UTC()
	if at.IsZero() || at.After(time.Now().Add(maxSkew)) {
		at = time.Now().UTC()
	}
	return &believedRefusal{raw: raw, env: env, at: at}, nil
}
