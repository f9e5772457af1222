package broker

import (
	"encoding/base64"
	"errors"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Deaths of this host's messages in other hosts' inboxes (see SenderKey in
// topology.go for the route): the gateway consumes its DeathsQueue and
// hands each dead letter to its DeathHandler, which decides whether to
// believe it (gateway/deaths.go). This package only reads what the broker
// wrote: x-death, and the signature headers the message was published with.

// Death is one dead letter of a message this host published, as the
// broker dead-lettered it. Everything in it came from the broker and is
// unproven until the handler checks it.
type Death struct {
	Env      *envelope.Envelope
	Body     []byte // the signed bytes
	Sig      []byte // fleet-sig
	SignedBy string // fleet-host
	Queue    string // x-death: the queue it died in
	Reason   string // x-death: expired | rejected | maxlen | delivery_limit
	Count    int    // x-death: how often it died there
	At       time.Time
}

// DeathHandler takes one death. nil means taken (or dropped on purpose)
// and the delivery is acked; an error requeues it, up to the configured
// attempts, then it is dropped (bridge.dlq holds its copy).
type DeathHandler func(d *Death) error

// OnDeath sets the death handler; call before Run. Without one, the
// deaths queue is neither made nor consumed.
func (b *Broker) OnDeath(h DeathHandler) { b.deaths = h }

// deathsMax caps a deaths queue: a sender away for long keeps the newest
// deaths of its messages (drop-head), each also in bridge.dlq.
const deathsMax = 100000

// declareDeaths makes this host's deaths queue and binds it to bridge.dead
// by its SenderKey.
func (b *Broker) declareDeaths(ch *amqp.Channel) error {
	q := DeathsQueue(b.cfg.Host)
	args := queueArgs(b.cfg.Limits.QueueType)
	args["x-max-length"] = int64(deathsMax)
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return err
	}
	return ch.QueueBind(q, SenderKey(b.cfg.Host), ExDead, false, nil)
}

// consumeDeaths declares and consumes the deaths queue until the
// generation ends. A login that may not make it (one set up before this
// queue existed) is said once: deaths then reach bridge.dlq only.
func (b *Broker) consumeDeaths(gen *generation) {
	defer gen.wg.Done()
	q := DeathsQueue(b.cfg.Host)
	log := b.log.With("queue", q)
	for gen.ctx.Err() == nil {
		ch, err := gen.subConn.Channel()
		if err != nil {
			return
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		var d <-chan amqp.Delivery
		if err = b.declareDeaths(ch); err == nil {
			if err = ch.Qos(16, 0, false); err == nil {
				d, err = ch.Consume(q, "fleet-gw/"+b.cfg.Host+"/deaths", false, true, false, false, nil)
			}
		}
		if err != nil {
			if !ch.IsClosed() {
				ch.Close()
			}
			var ae *amqp.Error
			b.mu.Lock()
			told := b.deathsTold
			b.deathsTold = true
			b.mu.Unlock()
			switch {
			case gen.ctx.Err() != nil:
			case errors.As(err, &ae) && ae.Code == amqp.AccessRefused && !told:
				log.Error("this gateway's broker login may not make or consume its deaths queue: messages of this host that die in other hosts' inboxes reach bridge.dlq but are not told to their senders",
					"err", ae.Reason, "fix", "run fleet-gw broker-setup for this host again (it keeps the login and adds the permission)")
			case !told:
				log.Error("cannot consume the deaths queue: retrying", "err", err)
			}
			backoff.Sleep(gen.ctx, 5*time.Second)
			continue
		}
		b.mu.Lock()
		b.deathsTold = false
		b.mu.Unlock()
	serve:
		for {
			select {
			case <-gen.ctx.Done():
				ch.Close() // unacked deaths go back to the queue
				return
			case <-closed:
				break serve
			case m, ok := <-d:
				if !ok {
					break serve
				}
				b.takeDeath(m)
			}
		}
	}
}

// takeDeath hands one dead letter to the handler and settles it.
func (b *Broker) takeDeath(d amqp.Delivery) {
	death := &Death{}
	death.SignedBy, _ = d.Headers["fleet-host"].(string)
	if s, ok := d.Headers["fleet-sig"].(string); ok {
		death.Sig, _ = base64.StdEncoding.DecodeString(s)
	}
	if xs, ok := d.Headers["x-death"].([]any); ok && len(xs) > 0 {
		if x, ok := xs[0].(amqp.Table); ok { // the latest death is first
			death.Queue, _ = x["queue"].(string)
			death.Reason, _ = x["reason"].(string)
			if n, ok := x["count"].(int64); ok {
				death.Count = int(n)
			}
			death.At, _ = x["time"].(time.Time)
		}
	}
	env, err := envelope.Decode(d.Body, b.cfg.MaxBody)
	if err != nil {
		b.log.Warn("a dead letter in the deaths queue is not an envelope: dropped (bridge.dlq has its copy)",
			"queue", DeathsQueue(b.cfg.Host), "msg_id", d.MessageId, "err", err)
		_ = d.Ack(false)
		return
	}
	death.Env, death.Body = env, d.Body
	if err := b.deaths(death); err != nil {
		if n := b.noteFailure("death/" + env.MsgID); n < b.cfg.Attempts {
			b.log.Warn("could not take the death of a message: requeued", "msg_id", env.MsgID, "attempt", n, "err", err)
			time.Sleep(500 * time.Millisecond)
			_ = d.Nack(false, true)
			return
		}
		b.log.Error("could not take the death of a message: dropped (bridge.dlq has its copy)", "msg_id", env.MsgID, "err", err)
	}
	b.forget("death/" + env.MsgID)
	_ = d.Ack(false)
}
