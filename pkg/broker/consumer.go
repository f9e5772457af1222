package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Inbox consumers share channels. RabbitMQ allows a connection
// channel_max channels (2,047 by default): one channel per inbox would
// silently stop at about two thousand entities. So up to
// ConsumersPerChannel exclusive, manual-ack consumers share one channel
// (consumeChannel), each read by its own goroutine, which acks on that
// channel — only after the handler has the message durably — and never on
// another. Declarations, bindings and deletions go through one setup
// channel per connection (rpcChannel). An AMQP channel is not safe for
// concurrent RPCs, so each has a lock around its RPCs.

// ConsumersPerChannel is how many inbox consumers share one AMQP channel.
const ConsumersPerChannel = 200

// rpcChannel is a channel for RPCs, one at a time, reopened after an
// error closed it.
type rpcChannel struct {
	conn *amqp.Connection
	mu   sync.Mutex
	ch   *amqp.Channel
}

// do runs f on the channel, opening it first if it is closed.
func (r *rpcChannel) do(f func(ch *amqp.Channel) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil || r.ch.IsClosed() {
		ch, err := r.conn.Channel()
		if err != nil {
			return err
		}
		r.ch = ch
	}
	return f(r.ch)
}

// consumeChannel carries up to ConsumersPerChannel inbox consumers.
type consumeChannel struct {
	mu sync.Mutex // one RPC at a time (consume, cancel)
	ch *amqp.Channel
	n  int // consumers on it (guarded by the generation's chansMu)
}

// consumeOn returns a shared channel with room for one more consumer,
// opening one when none has room.
func (b *Broker) consumeOn(gen *generation) (*consumeChannel, error) {
	gen.chansMu.Lock()
	defer gen.chansMu.Unlock()
	live := gen.chans[:0]
	for _, cc := range gen.chans {
		if !cc.ch.IsClosed() {
			live = append(live, cc)
		}
	}
	gen.chans = live
	for _, cc := range gen.chans {
		if cc.n < ConsumersPerChannel {
			cc.n++
			return cc, nil
		}
	}
	ch, err := gen.subConn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil { // per consumer
		return nil, err
	}
	cc := &consumeChannel{ch: ch, n: 1}
	gen.chans = append(gen.chans, cc)
	return cc, nil
}

// release gives back cc's place of one consumer.
func (gen *generation) release(cc *consumeChannel) {
	gen.chansMu.Lock()
	cc.n--
	gen.chansMu.Unlock()
}

// consumer is one local inbox's consumer: a goroutine reading its
// deliveries on a shared channel.
type consumer struct {
	gid  string
	tag  string
	quit chan struct{}
	done chan struct{}
}

var errRemoved = errors.New("inbox removed")

func (c *consumer) stop() {
	close(c.quit)
	<-c.done
}

// opened is an inbox consumed on a shared channel.
type opened struct {
	cc         *consumeChannel
	deliveries <-chan amqp.Delivery
}

// startConsumer runs gid's consumer, on first if the caller opened it
// already (nil: the consumer opens it).
func (b *Broker) startConsumer(gen *generation, gid string, first *opened) {
	gen.mu.Lock()
	if gen.ctx.Err() != nil { // a generation that is ending: the next one consumes it
		gen.mu.Unlock()
		if first != nil {
			gen.release(first.cc)
		}
		return
	}
	if _, ok := gen.consumers[gid]; ok {
		gen.mu.Unlock()
		if first != nil { // consumed twice: keep the running one
			b.cancel(gen, first, b.tag(gid), gid)
		}
		return
	}
	c := &consumer{gid: gid, tag: b.tag(gid), quit: make(chan struct{}), done: make(chan struct{})}
	gen.consumers[gid] = c
	gen.mu.Unlock()
	gen.wg.Add(1)
	go func() {
		defer gen.wg.Done()
		defer close(c.done)
		b.consume(gen, c, first)
	}()
}

func (b *Broker) tag(gid string) string { return fmt.Sprintf("fleet-gw/%s/%s", b.cfg.Host, gid) }

// rivalGrace is how long a 403 "exclusive use" right after our own
// reconnect is taken for our own half-dead old connection (which the broker
// reaps after missed heartbeats) rather than a rival gateway.
func (b *Broker) rivalGrace() time.Duration { return 3*b.cfg.Heartbeat + 2*time.Second }

func (b *Broker) consume(gen *generation, c *consumer, first *opened) {
	q := InboxQueue(c.gid)
	log := b.log.With("queue", q)
	started := time.Now()
	reported := false
	for {
		select {
		case <-c.quit:
			if first != nil {
				b.cancel(gen, first, c.tag, c.gid)
			}
			return
		case <-gen.ctx.Done():
			return
		default:
		}
		o := first
		first = nil
		if o == nil {
			var err error
			o, err = b.openInbox(gen, c.gid)
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
				if gen.ctx.Err() == nil && !reported {
					log.Error("cannot consume inbox: retrying", "err", err)
					reported = true
				}
				if !wait(c, gen, 2*time.Second) {
					return
				}
				continue
			}
		}
		if reported {
			log.Info("inbox claimed: consuming")
			reported = false
		}
		if !b.drain(gen, c, o) {
			return
		}
		// the shared channel closed under us: again, after a jittered
		// pause (its other consumers do the same), unless the connection
		// is going, which the next generation handles
		if gen.subConn.IsClosed() || !wait(c, gen, time.Duration(100+rand.IntN(400))*time.Millisecond) {
			return
		}
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

// declare declares and binds gid's inbox on the setup channel. A queue
// that exists with other limits than configured (406 inequivalent arg) is
// not redeclared in a loop: it is used as it is and the mismatch is logged
// loudly.
func (b *Broker) declare(gen *generation, gid string, groups []string) (consumers int, err error) {
	q := InboxQueue(gid)
	err = gen.setup.do(func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclare(q, true, false, false, false, inboxArgs(b.cfg.Limits))
		consumers = st.Consumers
		return err
	})
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		b.log.Error("inbox queue exists with other arguments than configured: keeping its current limits",
			"queue", q, "err", ae.Reason,
			"fix", "the new limits apply to inboxes declared from now on; to change this one, delete it while empty or set a broker policy")
		err = gen.setup.do(func(ch *amqp.Channel) error {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			consumers = st.Consumers
			return err
		})
	}
	if err != nil {
		return 0, err
	}
	return consumers, gen.setup.do(func(ch *amqp.Channel) error {
		for _, k := range InboxKeys(gid, groups) {
			if err := ch.QueueBind(q, k, ExMsg, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// openInbox declares, binds and consumes an inbox, on a shared channel.
func (b *Broker) openInbox(gen *generation, gid string) (*opened, error) {
	b.mu.Lock()
	groups, wanted := b.inboxes[gid] // its groups now (SetGroups may have changed them)
	b.mu.Unlock()
	if !wanted { // removed meanwhile: never declare it again
		return nil, errRemoved
	}
	consumers, err := b.declare(gen, gid, groups)
	if err != nil {
		return nil, &notDeclared{err}
	}
	if consumers > 0 {
		// consumed elsewhere (another connection): a consume would be
		// refused (403), and on a shared channel that closes the channel
		// of up to ConsumersPerChannel other inboxes. Not tried.
		return nil, &amqp.Error{Code: amqp.AccessRefused, Reason: "the inbox has a consumer on another connection"}
	}
	cc, err := b.consumeOn(gen)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	d, err := cc.ch.Consume(InboxQueue(gid), b.tag(gid), false, true, false, false, nil)
	cc.mu.Unlock()
	if err != nil {
		gen.release(cc)
		return nil, err
	}
	return &opened{cc: cc, deliveries: d}, nil
}

// notDeclared is an inbox that could not be declared and bound: nothing
// of it was made (or it existed before).
type notDeclared struct{ err error }

func (e *notDeclared) Error() string { return e.err.Error() }
func (e *notDeclared) Unwrap() error { return e.err }

// cancel stops consuming an inbox on its shared channel: what was
// delivered to it and not yet taken goes back to the queue.
func (b *Broker) cancel(gen *generation, o *opened, tag, gid string) {
	o.cc.mu.Lock()
	err := o.cc.ch.Cancel(tag, false)
	o.cc.mu.Unlock()
	gen.release(o.cc)
	if err != nil {
		return // the channel is gone: its unacked deliveries are requeued by the broker
	}
	for d := range o.deliveries {
		_ = d.Nack(false, true)
	}
}

// drain hands deliveries to the handler until the channel closes (true:
// consume again) or the consumer or generation stops (false).
func (b *Broker) drain(gen *generation, c *consumer, o *opened) bool {
	for {
		select {
		case <-c.quit:
			b.cancel(gen, o, c.tag, c.gid)
			return false
		case <-gen.ctx.Done():
			return false
		case d, ok := <-o.deliveries:
			if !ok {
				gen.release(o.cc)
				if gen.ctx.Err() == nil {
					b.log.Warn("inbox channel closed: consuming again", "queue", InboxQueue(c.gid))
				}
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
