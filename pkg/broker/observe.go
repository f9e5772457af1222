package broker

import (
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Observer hears what the transport does, for fleet-gw's metrics
// (pkg/metrics, wired in pkg/gateway/metrics.go). The transport knows
// nothing of how they are counted. A nil field is not called; the others
// are called inline, on publishing and consuming paths, so they must not
// block.
type Observer struct {
	// Confirmed: one confirmed publish ended, with its outcome — "ack",
	// "returned" (unroutable), "nack" (reject-publish: an inbox is full),
	// "closed" (the channel closed first) or "timeout" — and how long it
	// took from the hand-over to the publishing goroutine to the outcome.
	Confirmed func(outcome string, took time.Duration)
	// InboxFull: a message of kind was refused because its inbox (or one
	// broadcast member's) is at its length cap: the sender is told 75.
	InboxFull func(kind envelope.Kind)
	// Refused: a delivery from the broker was refused, with one of the
	// Reason constants.
	Refused func(reason string)
	// Reconnected: a connection came up again after one was lost.
	Reconnected func()
}

// Observe sets the observer; call before Run.
func (b *Broker) Observe(o Observer) { b.observe = o }

// ReasonPoison is Observer.Refused's reason for a delivery the host
// failed to take Config.Attempts times: rejected without requeue. It is
// not a fleet-reason header: the inbox dead-letters such a delivery to
// bridge.dlq itself, without one.
const ReasonPoison = "poison"

// outcomes names publish results for Observer.Confirmed.
var outcomes = [...]string{resAck: "ack", resReturned: "returned", resNack: "nack", resClosed: "closed", resTimeout: "timeout"}
