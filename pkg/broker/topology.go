// Package broker is the cross-host transport over AMQP 0-9-1 (RabbitMQ,
// LavinMQ): the topology, publishing with confirms and mandatory returns,
// one exclusive manual-ack consumer per local inbox, and reconnection.
//
// It never buffers on the broker's behalf: a publish while disconnected or
// blocked fails at once. Each AMQP channel has one owning goroutine.
package broker

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Exchange and queue names, as in the design's §3, §4 and §8.
const (
	ExMsg     = "bridge.msg"     // topic: key = recipient gid, broadcast.all, broadcast.<group>, fleet.dead.<host>
	ExRoster  = "bridge.roster"  // topic: roster.<host>.<gid>
	ExControl = "bridge.control" // topic: key = host id (topic, so a login's binding keys can be confined)
	ExDead    = "bridge.dead"    // topic: the inboxes' dead-letter exchange; keys as published (gid, and the sender's SenderKey)
	QDLQ      = "bridge.dlq"     // the dead-letter queue, itself bounded
)

// A death in a broker inbox reaches its sender's gateway (issue: "a death
// anywhere is a death at the sender"). Every message is published with a
// BCC header naming its sending host, SenderKey: at publish time nothing on
// bridge.msg is bound to it, and the broker strips BCC before delivery, so
// the recipient never sees it. An inbox dead-letters (expired, rejected) to
// bridge.dead with no routing key of its own, so RabbitMQ routes the dead
// letter by the keys it was published with — the recipient's gid and the
// BCC SenderKey — to bridge.dlq (bound as DLQDeadKey: the operators' full copy) and
// to the sending host's DeathsQueue (bound as its SenderKey). The sender's
// gateway believes a death only for a message it signed itself, dead in
// the inbox it was addressed to (gateway/deaths.go).
//
// Why not a dead-letter key per queue: it is fixed by the recipient's
// queue, so it can name the recipient's host but never the sender's; a
// queue every sender reads would show each host everyone's dead mail.

// DLQDeadKey binds bridge.dlq to bridge.dead: two words, as every gid and
// broadcast key is. Not #: a login may bind bridge.dead to bridge.roster
// (it may write to the one and bind roster.# on the other), and heartbeats,
// whose keys have three words or more, would flood the operators' queue.
const DLQDeadKey = "*.*"

// SenderKey is the bridge.dead key of the dead letters of messages
// published by host: three words, so no gid or broadcast key matches it.
func SenderKey(host string) string { return "fleet.sender." + host }

// DeathsQueue is where a gateway finds the deaths of its own messages in
// other hosts' inboxes.
func DeathsQueue(host string) string { return "deaths." + host }

// DeadKey is the bridge.msg key of the dead letters a gateway copies to
// bridge.dlq itself (refusals, deaths on its host), bound there as
// fleet.dead.* — three words, so no gid (host.uuid) or broadcast key
// (broadcast.name) can match it, whatever a host is called.
// Inboxes dead-letter there too (inboxArgs). No exchange of its own
// (there was a bridge.dlx): a login that may write to an exchange may also
// bind it to another (exchange.bind), and one that could write to an
// exchange bound to bridge.dlq could copy every heartbeat and broadcast
// into the operators' queue; a copy bound into bridge.msg keeps its
// roster.* or host-id key, which no queue there is bound to.
func DeadKey(host string) string { return "fleet.dead." + host }

// InboxQueue is the queue of a local entity: agent.<host>.<uuid>.inbox, as
// a gid is <host>.<uuid> (see provision.go for why the host is in it).
func InboxQueue(gid string) string { return "agent." + gid + ".inbox" }

// ControlQueue is a gateway's control queue.
func ControlQueue(host string) string { return "control." + host }

// RosterQueue is a gateway's presence queue.
func RosterQueue(host string) string { return "roster." + host }

// RosterQueueArgs are the arguments of a roster queue (non-durable,
// exclusive, auto-delete, bound to bridge.roster as roster.#): what is
// not taken within a minute is stale anyway.
func RosterQueueArgs() amqp.Table { return amqp.Table{"x-message-ttl": int64(60000)} }

// Limits are the caps of every inbox, and its queue type.
type Limits struct {
	MaxLength int           // x-max-length
	TTL       time.Duration // x-message-ttl
	DLQLength int           // x-max-length of bridge.dlq
	// QueueType is "classic" (one node) or "quorum" (replicated on a
	// cluster, with a single active consumer: see queueArgs).
	QueueType string
}

// queueArgs are the type arguments of a durable fleet queue (an inbox,
// control.<host>, bridge.dlq). A quorum queue does not enforce exclusive
// consumers (RabbitMQ 3.10 accepts "exclusive" and ignores it), so it gets
// x-single-active-consumer: a second consumer waits as a silent standby
// instead of splitting the stream. One consumer per inbox then rests on
// one gateway per host id (the exclusive roster.<host> queue), and the
// gateway checks the consumer count around every consume.
func queueArgs(queueType string) amqp.Table {
	if queueType == "quorum" {
		return amqp.Table{"x-queue-type": "quorum", "x-single-active-consumer": true}
	}
	return amqp.Table{"x-queue-type": "classic"}
}

// inboxArgs are an inbox's queue arguments. A classic queue: on quorum
// queues RabbitMQ 3.10 does not enforce exclusive consumers. Overflow is
// reject-publish, so the publisher is nacked and told; never drop-head
// (which acks the sender and silently drops someone else's oldest mail) and
// never reject-publish-dlx (LavinMQ and quorum queues treat it as drop-head).
// Its dead letters (expired, rejected) go to bridge.dead by the keys they
// were published with: to bridge.dlq and to their sender's DeathsQueue.
// RabbitMQ wants write permission on a queue's dead-letter exchange, and a
// login that may write to an exchange may bind others to it: the topic
// permissions let no login publish to bridge.dead, and bind bridge.msg
// only by its own keys (provision.go), so such a copy reaches bridge.dlq
// (noise for operators) or a sender's deaths queue without the x-death
// the sender requires — never another host's mail.
//
// On a quorum queue (Limits.QueueType) the length cap is approximate:
// RabbitMQ may accept a message or so beyond x-max-length before it
// rejects publishes.
//
// A classic inbox has two priorities (x-max-priority 1): urgent mail is
// published with UrgentPriority, so what the broker holds for a
// back-pressured entity goes out urgent first, FIFO within each priority
// (a requeued delivery goes back to its place in its own priority). A
// quorum queue takes no x-max-priority: RabbitMQ 4 gives it two
// priorities by the same property (above 4 is high); RabbitMQ 3.10's is
// FIFO, urgent or not.
func inboxArgs(l Limits) amqp.Table {
	t := inboxArgsBeforeUrgent(l)
	if l.QueueType != "quorum" {
		t["x-max-priority"] = int64(1)
	}
	return t
}

// UrgentPriority is the AMQP priority of urgent mail (envelope.Urgent):
// above 4, the high one of a RabbitMQ 4 quorum queue; a classic inbox
// (x-max-priority 1) takes it as its maximum.
const UrgentPriority = 5

// inboxArgsBeforeUrgent are the arguments of an inbox made before urgent
// mail had a priority at the broker: declare keeps using such a queue,
// FIFO, as it is.
func inboxArgsBeforeUrgent(l Limits) amqp.Table {
	t := queueArgs(l.QueueType)
	t["x-dead-letter-exchange"] = ExDead
	t["x-overflow"] = "reject-publish"
	if l.MaxLength > 0 {
		t["x-max-length"] = int64(l.MaxLength)
	}
	if l.TTL > 0 {
		t["x-message-ttl"] = int64(l.TTL / time.Millisecond)
	}
	return t
}

var sharedExchanges = []struct{ name, kind string }{
	{ExMsg, "topic"}, {ExRoster, "topic"}, {ExControl, "topic"}, {ExDead, "topic"},
}

// errNoTopology is declareShared's error when the shared topology is
// missing and this login may not make it.
var errNoTopology = errors.New("the fleet's exchanges are not on the broker, and this gateway's login may not make them")

// declareShared makes sure the shared exchanges and the dead-letter queue
// exist. A gateway with its own least-privilege login may not declare
// them (fleet-gw broker-setup does), so it looks first with passive
// declares, which need no permission; only when something is missing does
// it declare everything, as a login with full rights (a single-user
// broker) may. conn gives a fresh channel after a refusal closed one.
func declareShared(conn *amqp.Connection, l Limits) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	missing := false
	for _, ex := range sharedExchanges {
		if err := ch.ExchangeDeclarePassive(ex.name, ex.kind, true, false, false, false, nil); err != nil {
			missing = true
			break
		}
	}
	if !missing {
		if _, err := ch.QueueDeclarePassive(QDLQ, true, false, false, false, nil); err != nil {
			missing = true
		}
	}
	if !missing {
		return ch, nil
	}
	if !ch.IsClosed() {
		ch.Close()
	}
	if ch, err = conn.Channel(); err != nil {
		return nil, err
	}
	for _, ex := range sharedExchanges {
		if err := ch.ExchangeDeclare(ex.name, ex.kind, true, false, false, false, nil); err != nil {
			return nil, topologyErr(err)
		}
	}
	args := queueArgs(l.QueueType)
	if l.DLQLength > 0 {
		args["x-max-length"] = int64(l.DLQLength)
	}
	if _, err := ch.QueueDeclare(QDLQ, true, false, false, false, args); err != nil {
		return nil, topologyErr(err)
	}
	if err := ch.QueueBind(QDLQ, "fleet.dead.*", ExMsg, false, nil); err != nil {
		return nil, topologyErr(err)
	}
	if err := ch.QueueBind(QDLQ, DLQDeadKey, ExDead, false, nil); err != nil {
		return nil, topologyErr(err)
	}
	return ch, nil
}

func topologyErr(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
		return fmt.Errorf("%w (%v)", errNoTopology, err)
	}
	return err
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
