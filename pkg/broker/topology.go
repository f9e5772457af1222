// Package broker is the cross-host transport over AMQP 0-9-1 (RabbitMQ,
// LavinMQ): the topology, publishing with confirms and mandatory returns,
// one exclusive manual-ack consumer per local inbox, and reconnection.
//
// It never buffers on the broker's behalf: a publish while disconnected or
// blocked fails at once. Each AMQP channel has one owning goroutine.
package broker

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Exchange and queue names, as in the design's §3, §4 and §8.
const (
	ExMsg     = "bridge.msg"     // topic: key = recipient gid, broadcast.all, broadcast.<group>
	ExRoster  = "bridge.roster"  // topic: roster.<host>.<gid>
	ExControl = "bridge.control" // direct: key = host id
	ExDLX     = "bridge.dlx"     // fanout: dead letters of every inbox
	QDLQ      = "bridge.dlq"     // the dead-letter queue, itself bounded
)

// InboxQueue is the queue of a local entity.
func InboxQueue(gid string) string { return "agent." + gid + ".inbox" }

// ControlQueue is a gateway's control queue.
func ControlQueue(host string) string { return "control." + host }

// RosterQueue is a gateway's presence queue.
func RosterQueue(host string) string { return "roster." + host }

// Limits are the caps of every inbox.
type Limits struct {
	MaxLength int           // x-max-length
	TTL       time.Duration // x-message-ttl
	DLQLength int           // x-max-length of bridge.dlq
}

// inboxArgs are an inbox's queue arguments. A classic queue: on quorum
// queues RabbitMQ 3.10 does not enforce exclusive consumers. Overflow is
// reject-publish, so the publisher is nacked and told; never drop-head
// (which acks the sender and silently drops someone else's oldest mail) and
// never reject-publish-dlx (LavinMQ and quorum queues treat it as drop-head).
func inboxArgs(l Limits) amqp.Table {
	t := amqp.Table{
		"x-queue-type":           "classic",
		"x-dead-letter-exchange": ExDLX,
		"x-overflow":             "reject-publish",
	}
	if l.MaxLength > 0 {
		t["x-max-length"] = int64(l.MaxLength)
	}
	if l.TTL > 0 {
		t["x-message-ttl"] = int64(l.TTL / time.Millisecond)
	}
	return t
}

// declareShared declares the shared exchanges and the dead-letter queue.
// Idempotent; redone on every reconnect.
func declareShared(ch *amqp.Channel, l Limits) error {
	for _, ex := range []struct{ name, kind string }{
		{ExMsg, "topic"}, {ExRoster, "topic"}, {ExControl, "direct"}, {ExDLX, "fanout"},
	} {
		if err := ch.ExchangeDeclare(ex.name, ex.kind, true, false, false, false, nil); err != nil {
			return err
		}
	}
	args := amqp.Table{"x-queue-type": "classic"}
	if l.DLQLength > 0 {
		args["x-max-length"] = int64(l.DLQLength)
	}
	if _, err := ch.QueueDeclare(QDLQ, true, false, false, false, args); err != nil {
		return err
	}
	return ch.QueueBind(QDLQ, "", ExDLX, false, nil)
}

// InboxKeys are the binding keys of an inbox: its gid, broadcast.all and
// broadcast.<group> for each of its groups.
func InboxKeys(gid string, groups []string) []string {
	keys := []string{gid, "broadcast.all"}
	for _, g := range groups {
		keys = append(keys, "broadcast."+g)
	}
	return keys
}
