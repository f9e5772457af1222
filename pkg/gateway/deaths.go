package gateway

// deaths.go — a death anywhere is a death at the sender. A message this
// host published that expires or is rejected in a broker inbox (its
// recipient's gateway away past inbox-ttl, or a delivery rejected there)
// comes back through bridge.dead to this host's deaths queue (the route is
// in broker/topology.go, SenderKey). Its outbound record becomes dead with
// the broker's reason, it is kept as a dead letter here, and its sender
// gets a BOUNCE, as for every other death.
//
// What is believed: the dead letter's body must be a message this gateway
// signed itself (so nobody else's, and not a forgery), addressed to one
// entity, and the broker's x-death must name that entity's inbox. A host
// that holds such a message — its recipient's — could stage a death of it;
// it could as well send a dead receipt, so that is no new power.

import (
	"crypto/ed25519"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
)

// Reasons of deaths in a broker inbox, as dead letters and bounces say them.
const (
	ReasonBrokerExpired  = "expired in the broker: the recipient's gateway did not take it within inbox-ttl"
	ReasonBrokerRejected = "rejected in the broker by the recipient's gateway"
	ReasonBrokerLimit    = "dropped by the broker: delivery limit reached"
	ReasonBrokerMaxlen   = "dropped by the broker: the inbox was full"
)

// deathReason says an x-death reason the way dead letters do.
func deathReason(xreason string) string {
	switch xreason {
	case "expired":
		return ReasonBrokerExpired
	case "rejected":
		return ReasonBrokerRejected
	case "delivery_limit":
		return ReasonBrokerLimit
	case "maxlen":
		return ReasonBrokerMaxlen
	}
	return "dead in the broker (" + clipReason(xreason) + ")"
}

// onDeath takes one death of a message of ours from the broker.
func (g *Gateway) onDeath(d *broker.Death) error {
	env := d.Env
	log := g.log.With("msg_id", env.MsgID, "trace_id", env.TraceID, "queue", d.Queue)
	switch {
	case d.SignedBy != g.cfg.Host || g.admit == nil || !ed25519.Verify(g.admit.own, d.Body, d.Sig):
		log.Warn("a dead letter in this host's deaths queue that this host did not sign: ignored")
		return nil
	case env.Recipient.Group != "" || env.Recipient.Gid == "" || quiet(env.Kind):
		return nil // a broadcast copy, a receipt, a presence: nobody waits for it
	case d.Queue == "":
		// a copy without the broker's death history: some login bound
		// bridge.dead to where our messages pass (see broker.DLQDeadKey)
		log.Debug("a message of ours in the deaths queue that no queue dead-lettered: ignored")
		return nil
	case d.Queue != broker.InboxQueue(env.Recipient.Gid):
		log.Warn("a dead letter of ours that the broker says died elsewhere than its recipient's inbox: ignored",
			"recipient", env.Recipient.Gid)
		return nil
	}
	at := d.At.UTC()
	if at.IsZero() || at.After(time.Now().Add(maxSkew)) {
		at = time.Now().UTC()
	}
	reason := deathReason(d.Reason)
	dead, err := g.st.KillOutbound(env.MsgID, g.seal.Plain(d.Body), reason, at) // its text opened (sealing.go)
	if err != nil {
		return err // requeued: told again shortly
	}
	if !dead {
		return nil // settled already (delivered, or this death told before), or not ours to track
	}
	log.Warn("a message of this host died in the broker: dead here, its sender told", "recipient", env.Recipient.String(), "reason", d.Reason)
	g.audit.Message("dead", env, d.Count, reason)
	g.metrics.Dead(env.Kind, reason)
	g.rcpt.Notify()
	g.rcpt.Bounce(env.MsgID, env.TraceID, env.Sender.Gid, env.Recipient.String(), reason)
	return nil
}
