package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
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
}

// quiet kinds never produce receipts or bounces (no loops, no noise).
func quiet(k envelope.Kind) bool {
	switch k {
	case envelope.Receipt, envelope.Bounce, envelope.Presence, envelope.TooLate, envelope.Broadcast:
		return true
	}
	return false
}

// recordsChanged returns a channel closed at the next change of any
// delivery record this gateway knows of.
func (g *Gateway) recordsChanged() <-chan struct{} { return g.records.wait() }

func (g *Gateway) notifyRecords() { g.records.notify() }

// settled is called once a message in a local inbox was delivered or died.
func (g *Gateway) settled(env *envelope.Envelope, state, reason string, attempts int) {
	g.metrics.Settled(env.Kind, state == store.Dead, reason)
	g.notifyRecords()
	if quiet(env.Kind) {
		return
	}
	if env.Sender.Host == g.cfg.Host || env.Sender.Gid == "" {
		if state == store.Dead {
			g.bounce(env.MsgID, env.TraceID, env.Sender.Gid, env.Recipient.String(), reason)
		}
		return
	}
	if g.br == nil {
		return
	}
	body, _ := json.Marshal(receiptBody{MsgID: env.MsgID, State: state, Reason: reason, Attempts: attempts, At: time.Now().UTC()})
	// from the recipient, so the sender's gateway can check that the
	// receipt comes from where its message went
	r := envelope.New(envelope.Receipt,
		envelope.Party{Gid: env.Recipient.Gid, Name: env.Recipient.Name, Host: g.cfg.Host},
		envelope.Party{Gid: env.Sender.Gid, Name: env.Sender.Name, Host: env.Sender.Host}, string(body))
	r.TraceID, r.InReplyTo = env.TraceID, env.MsgID
	go func() {
		if err := g.br.Publish(g.runCtx, env.Sender.Gid, r, false); err != nil {
			g.log.Warn("receipt not sent", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		}
	}()
}

// onReceipt moves a local outbound record forward. A receipt is believed
// only from the host its message went to: its sender is the message's
// recipient (on the signing host, admit.go), and the message was sent from
// here to that recipient by the entity the receipt is addressed to.
func (g *Gateway) onReceipt(env *envelope.Envelope) error {
	var rb receiptBody
	if err := json.Unmarshal([]byte(env.Body), &rb); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "receipt body: %v", err)
	}
	if rb.MsgID != env.InReplyTo {
		return broker.Refuse(broker.ReasonMalformed, "a receipt for %q in reply to %q", rb.MsgID, env.InReplyTo)
	}
	if rb.State == "answered" {
		return g.answerReceipt(rb.MsgID, env.Sender.Host)
	}
	if rb.State != store.Delivered && rb.State != store.Dead {
		return broker.Refuse(broker.ReasonMalformed, "a receipt with state %q", rb.State)
	}
	if orig, err := g.st.Record(rb.MsgID); err == nil && (orig.Recipient != env.Sender.Gid || orig.Sender != env.Recipient.Gid) {
		return broker.Refuse(broker.ReasonWrongHost, "a receipt for message %s from %s, which is not its recipient", rb.MsgID, env.Sender.String())
	}
	rb.Reason = clipReason(rb.Reason)
	rec, err := g.st.SettleOutbound(rb.MsgID, rb.State, rb.Reason, rb.Attempts, rb.At)
	if err != nil {
		g.log.Info("receipt for a message this host does not know", "msg_id", rb.MsgID, "trace_id", env.TraceID)
		return nil
	}
	g.audit.Write(audit.Line{Event: "receipt", TraceID: env.TraceID, MsgID: rb.MsgID, Kind: string(env.Kind), Reason: rb.State,
		Entity: env.Recipient.Name, Sender: env.Sender.Gid, Recipient: env.Recipient.Gid})
	g.notifyRecords()
	if rb.State == store.Dead && rec.State == store.Dead {
		to := env.Sender.Host
		g.bounce(rb.MsgID, env.TraceID, rec.Sender, rec.Recipient+"@"+to, rb.Reason)
	}
	return nil
}

// bounce tells the sender of a dead message why, in its inbox.
func (g *Gateway) bounce(msgID, traceID, senderGid, to, reason string) {
	b := g.box(senderGid)
	if b == nil {
		return
	}
	e := b.snapshot()
	env := envelope.New(envelope.Bounce,
		envelope.Party{Name: "fleet", Host: g.cfg.Host},
		envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host},
		fmt.Sprintf("your message %s to %s was dead-lettered: %s", msgID, to, reason))
	env.TraceID, env.InReplyTo = traceID, msgID
	if _, err := g.accept(env); err != nil {
		g.log.Warn("bounce not stored", "msg_id", msgID, "trace_id", traceID, "err", err)
		return
	}
	g.audit.Write(audit.Line{Event: "bounced", TraceID: traceID, MsgID: msgID, Entity: e.Name, Sender: e.Gid, Reason: reason})
}

// waitState blocks until msgID's record reaches state (or dies, which is
// final), or the timeout passes: then TempFail naming the state reached.
func (g *Gateway) waitState(req *api.Request) (*api.Response, error) {
	b, err := g.caller(req)
	if err != nil {
		return nil, err
	}
	gid := b.snapshot().Gid
	deadline := time.Now().Add(time.Duration(req.TimeoutMS) * time.Millisecond)
	for {
		changed := g.recordsChanged()
		r, err := g.st.Record(req.MsgID)
		if err != nil || (r.Sender != gid && r.Recipient != gid) {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent or received by you", req.MsgID)
		}
		rec := g.apiRecord(r)
		if r.State == req.Until || r.State == store.Dead {
			if r.State != req.Until {
				return &api.Response{Record: &rec}, fault.New(fault.TempFail, fault.KindTimeout,
					"message %s is dead, not %s: %s", r.MsgID, req.Until, r.Reason)
			}
			return &api.Response{Record: &rec}, nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return &api.Response{Record: &rec}, fault.New(fault.TempFail, fault.KindTimeout,
				"message %s is still %s, not %s, after %v", r.MsgID, r.State, req.Until, time.Duration(req.TimeoutMS)*time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-g.runCtx.Done():
			t.Stop()
			return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
		}
		t.Stop()
	}
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
