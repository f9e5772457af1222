package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// consumer owns one channel with one exclusive, manual-ack consumer on one
// local inbox. Deliveries are acked on the channel they came from, by this
// goroutine, and only after the handler has the message durably.
type consumer struct {
	gid  string
	quit chan struct{}
	done chan struct{}
}

var errRemoved = errors.New("inbox removed")

func (c *consumer) stop() {
	close(c.quit)
	<-c.done
}

func (b *Broker) startConsumer(gen *generation, gid string, groups []string) {
	gen.mu.Lock()
	if _, ok := gen.consumers[gid]; ok {
		gen.mu.Unlock()
		return
	}
	c := &consumer{gid: gid, quit: make(chan struct{}), done: make(chan struct{})}
	gen.consumers[gid] = c
	gen.mu.Unlock()
	gen.wg.Add(1)
	go func() {
		defer gen.wg.Done()
		defer close(c.done)
		b.consume(gen, c, groups)
	}()
}

// rivalGrace is how long a 403 "exclusive use" right after our own
// reconnect is taken for our own half-dead old connection (which the broker
// reaps after missed heartbeats) rather than a rival gateway.
func (b *Broker) rivalGrace() time.Duration { return 3*b.cfg.Heartbeat + 2*time.Second }

func (b *Broker) consume(gen *generation, c *consumer, groups []string) {
	q := InboxQueue(c.gid)
	log := b.log.With("queue", q)
	started := time.Now()
	reported := false
	for {
		select {
		case <-c.quit:
			return
		case <-gen.ctx.Done():
			return
		default:
		}
		ch, deliveries, err := b.openInbox(gen, c.gid, groups)
		if errors.Is(err, errRemoved) {
			return
		}
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
				b.mu.Lock()
				since := b.reconnected
				b.mu.Unlock()
				ours := !since.IsZero() && time.Since(since) < b.rivalGrace()
				if !ours && !reported {
					log.Error("inbox is consumed by another gateway: refusing to split its stream",
						"err", err.Error(), "waited", time.Since(started).Round(time.Second).String())
					reported = true
				} else if ours {
					log.Info("inbox still held by our previous connection: retrying until the broker reaps it")
				}
				if !wait(c, gen, time.Second) {
					return
				}
				continue
			}
			if gen.ctx.Err() == nil {
				log.Error("cannot consume inbox", "err", err)
			}
			if !wait(c, gen, 2*time.Second) {
				return
			}
			continue
		}
		if reported {
			log.Info("inbox claimed: consuming")
			reported = false
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if !b.drain(gen, c, ch, deliveries, closed) {
			ch.Close()
			return
		}
		// channel closed under us (not the connection): open a new one
	}
}

func wait(c *consumer, gen *generation, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.quit:
		return false
	case <-gen.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// openInbox declares, binds and consumes an inbox on a fresh channel. A
// queue that exists with other limits than configured (406 inequivalent
// arg) is not redeclared in a loop: it is used as it is and the mismatch is
// logged loudly, once per connection.
func (b *Broker) openInbox(gen *generation, gid string, groups []string) (*amqp.Channel, <-chan amqp.Delivery, error) {
	b.mu.Lock()
	_, wanted := b.inboxes[gid]
	b.mu.Unlock()
	if !wanted { // removed meanwhile: never declare it again
		return nil, nil, errRemoved
	}
	q := InboxQueue(gid)
	ch, err := gen.subConn.Channel()
	if err != nil {
		return nil, nil, err
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, inboxArgs(b.cfg.Limits)); err != nil {
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return nil, nil, err
		}
		b.log.Error("inbox queue exists with other arguments than configured: keeping its current limits",
			"queue", q, "err", ae.Reason,
			"fix", "the new limits apply to inboxes declared from now on; to change this one, delete it while empty or set a broker policy")
		if ch, err = gen.subConn.Channel(); err != nil {
			return nil, nil, err
		}
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			return nil, nil, err
		}
	}
	for _, k := range InboxKeys(gid, groups) {
		if err := ch.QueueBind(q, k, ExMsg, false, nil); err != nil {
			return nil, nil, err
		}
	}
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return nil, nil, err
	}
	tag := fmt.Sprintf("fleet-gw/%s/%s", b.cfg.Host, gid)
	d, err := ch.Consume(q, tag, false, true, false, false, nil)
	if err != nil {
		return nil, nil, err
	}
	return ch, d, nil
}

// drain hands deliveries to the handler until the channel closes (true:
// reopen) or the consumer or generation stops (false).
func (b *Broker) drain(gen *generation, c *consumer, ch *amqp.Channel, deliveries <-chan amqp.Delivery, closed <-chan *amqp.Error) bool {
	for {
		select {
		case <-c.quit:
			ch.Close() // unacked deliveries go back to the queue
			return false
		case <-gen.ctx.Done():
			return false
		case err := <-closed:
			if gen.ctx.Err() == nil && err != nil {
				b.log.Warn("inbox channel closed: reopening", "queue", InboxQueue(c.gid), "err", err.Error())
			}
			return gen.ctx.Err() == nil
		case d, ok := <-deliveries:
			if !ok {
				return gen.ctx.Err() == nil
			}
			b.take(d, c.gid)
		}
	}
}

// take hands one delivery to the handler and settles it on its own channel.
// Undecodable, not authentic, or refused by the handler (a *Refusal):
// refused at once to bridge.dlq with the reason, loudly. Other handler
// failures: requeued, then rejected without requeue after the configured
// attempts.
func (b *Broker) take(d amqp.Delivery, gid string) {
	q := InboxQueue(gid)
	env, err := envelope.Decode(d.Body, b.cfg.MaxBody)
	if err != nil {
		b.refuse(d, q, nil, asRefusal(err, ReasonMalformed), true)
		return
	}
	if env.Recipient.Group != "" {
		env.Recipient.Gid = gid // a broadcast copy: this inbox's (membership is the handler's check)
	} else if env.Recipient.Gid != gid {
		b.refuse(d, q, env, Refuse(ReasonMisrouted, "addressed to %s, found in the inbox of %s", env.Recipient.Gid, gid), true)
		return
	}
	// an ack that fails (the channel died after the host took it) means a
	// redelivery, which the host's dedup by msg id drops
	b.hand(d, q, env, b.handle, "could not take a message into the host store", 200*time.Millisecond)
}

// hand checks that a decoded delivery is authentic, gives it to handler
// and settles it: refused (not authentic, or the handler's *Refusal) to
// bridge.dlq at once; otherwise acked, or requeued on failure (see settle).
func (b *Broker) hand(d amqp.Delivery, q string, env *envelope.Envelope, handler func(*envelope.Envelope) error, what string, pause time.Duration) {
	if err := b.authentic(d, env); err != nil {
		// unsigned, forged, replayed or from the wrong host: never taken in
		b.refuse(d, q, env, asRefusal(err, ReasonForged), true)
		return
	}
	err := handler(env)
	var r *Refusal
	if errors.As(err, &r) {
		b.refuse(d, q, env, r, true)
		return
	}
	b.settle(d, env, err, b.log.With("msg_id", env.MsgID, "trace_id", env.TraceID, "queue", q), what, pause)
}

// settle acks a delivery its handler took (err == nil), or requeues it
// after pause, or — after the configured attempts — rejects it without
// requeue (to bridge.dlq). It runs on the delivery's own channel's goroutine.
func (b *Broker) settle(d amqp.Delivery, env *envelope.Envelope, err error, log *slog.Logger, what string, pause time.Duration) {
	if err != nil {
		n := b.noteFailure(env.MsgID)
		if n >= b.cfg.Attempts {
			log.Error(what+": rejected", "attempts", n, "err", err)
			_ = d.Nack(false, false)
			b.forget(env.MsgID)
			return
		}
		log.Warn(what+": requeued", "attempt", n, "err", err)
		time.Sleep(pause)
		_ = d.Nack(false, true)
		return
	}
	b.forget(env.MsgID)
	if err := d.Ack(false); err != nil {
		log.Warn("ack failed; the redelivery will be recognised by its msg id", "err", err)
	}
}

func (b *Broker) noteFailure(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails[id]++
	return b.fails[id]
}

func (b *Broker) forget(id string) {
	b.mu.Lock()
	delete(b.fails, id)
	b.mu.Unlock()
}
