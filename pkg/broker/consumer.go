package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
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
	got        atomic.Bool // a delivery came (the standby check, openInbox)
}

// startConsumer runs gid's consumer, on first if the caller opened it
// already (nil: the consumer opens it).
func (b *Broker) startConsumer(gen *generation, gid string, first *opened) {
	gen.mu.Lock()
	if b.quiet.Load() { // StopConsuming: the gateway is stopping
		gen.mu.Unlock()
		if first != nil {
			b.cancel(gen, first, b.tag(gid), nil)
		}
		return
	}
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
			b.cancel(gen, first, b.tag(gid), nil)
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
	reported, held := false, false
	for {
		select {
		case <-c.quit:
			if first != nil {
				b.cancel(gen, first, c.tag, nil)
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
				if errors.As(err, &ae) && ae.Code == amqp.AccessRefused && !strings.Contains(ae.Reason, "refused for user") {
					// held by another consumer: our own previous
					// connection's until the broker reaps it (after a
					// reconnect; on a restarted cluster a quorum queue
					// lists its old consumers a while), or a rival's
					if time.Since(started) > b.rivalGrace() && !reported {
						log.Error("inbox is consumed by another gateway: refusing to split its stream",
							"err", ae.Reason, "waited", time.Since(started).Round(time.Second).String())
						reported = true
					} else if !reported && !held {
						log.Info("inbox still held by another consumer (our previous connection?): retrying until the broker reaps it")
						held = true
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
	return backoff.Wait(d, c.quit, gen.ctx.Done())
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
		// made before urgent mail had a priority: kept, FIFO at the broker
		err = gen.setup.do(func(ch *amqp.Channel) error {
			st, err := ch.QueueDeclare(q, true, false, false, false, inboxArgsBeforeUrgent(b.cfg.Limits))
			consumers = st.Consumers
			return err
		})
		if err == nil {
			b.log.Info("inbox made before urgent mail had a priority at the broker: kept as it is, so urgent mail it holds waits in arrival order there (ahead of normal mail again once taken in)",
				"queue", q, "fix", "fleet-roster leave the entity and join it again: its new inbox has the priority")
		}
	}
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
		return nil, &amqp.Error{Code: amqp.AccessRefused, Reason: "the inbox has a consumer on another connection"} // not "refused for user": see consume
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
	o := &opened{cc: cc, deliveries: d}
	if b.cfg.Limits.QueueType == "quorum" {
		go b.standbyCheck(gen, gid, o)
	}
	return o, nil
}

// standbyCheck: a quorum queue takes a second consumer silently, as a
// standby (single active consumer), and counts only the active one. One
// that raced ours past the check above shows as messages ready that never
// come to us: said loudly.
func (b *Broker) standbyCheck(gen *generation, gid string, o *opened) {
	t := time.NewTimer(standbyAfter)
	defer t.Stop()
	select {
	case <-gen.ctx.Done():
		return
	case <-t.C:
	}
	if o.got.Load() {
		return
	}
	var ready int
	if gen.setup.do(func(ch *amqp.Channel) error {
		st, err := ch.QueueDeclarePassive(InboxQueue(gid), true, false, false, false, nil)
		ready = st.Messages
		return err
	}) == nil && ready > 0 && !o.got.Load() {
		b.log.Error("this gateway is a silent standby on its inbox: another consumer is active (quorum queue, single active consumer), and its mail goes there",
			"queue", InboxQueue(gid), "ready", ready, "fix", "stop the other gateway: one gateway per host id")
	}
}

// standbyAfter is how long a quorum inbox with mail ready may give us
// nothing before we call ourselves a standby.
const standbyAfter = 5 * time.Second

// notDeclared is an inbox that could not be declared and bound: nothing
// of it was made (or it existed before).
type notDeclared struct{ err error }

func (e *notDeclared) Error() string { return e.err.Error() }
func (e *notDeclared) Unwrap() error { return e.err }

// cancel stops consuming an inbox on its shared channel: what was
// delivered to it and not yet taken goes back to the queue.
//
// With held (a delivery take gave back, and those taken from the channel
// with it after it), held goes back first, then what came after it, in
// order: the consumer is cancelled before either, so no
// freed prefetch slot brings held back at once behind its successors.
func (b *Broker) cancel(gen *generation, o *opened, tag string, held []amqp.Delivery) {
	o.cc.mu.Lock()
	err := o.cc.ch.Cancel(tag, false)
	o.cc.mu.Unlock()
	gen.release(o.cc)
	if err != nil {
		return // the channel is gone: its unacked deliveries are requeued by the broker
	}
	for _, d := range held {
		_ = d.Nack(false, true)
	}
	for d := range o.deliveries {
		_ = d.Nack(false, true)
	}
}

// drain hands deliveries to the handler until the channel closes (true:
// consume again) or the consumer or generation stops (false).
func (b *Broker) drain(gen *generation, c *consumer, o *opened) bool {
	var batch []amqp.Delivery
	for {
		select {
		case <-c.quit:
			b.cancel(gen, o, c.tag, nil)
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
			o.got.Store(true)
			// with it, whatever else the broker has sent already (up to
			// the prefetch): taken in together, in order
			batch = append(batch[:0], d)
			for len(batch) < b.cfg.Prefetch {
				d, ok := next(o.deliveries)
				if !ok {
					break // none waiting (a closed channel is seen at the next receive)
				}
				batch = append(batch, d)
			}
			if held, bp := b.takeBatch(batch, c.gid, c.quit, gen.ctx.Done()); held != nil {
				b.cancel(gen, o, c.tag, held)
				if gen.ctx.Err() != nil {
					return false
				}
				if bp != nil { // back-pressure: consumed again once there is room
					return b.waitRoom(gen, c, bp)
				}
				return wait(c, gen, time.Second)
			}
		}
	}
}

// next returns a delivery the library has for us already, if any: its
// buffer goroutine hands them over one at a time through an unbuffered
// channel, so it is given a chance to run before we say there is none.
func next(ds <-chan amqp.Delivery) (amqp.Delivery, bool) {
	select {
	case d, ok := <-ds:
		return d, ok
	default:
	}
	runtime.Gosched()
	select {
	case d, ok := <-ds:
		return d, ok
	default:
		return amqp.Delivery{}, false
	}
}

// holdBound is how long an inbox's intake waits on one delivery the host
// cannot take in (a full disk, say) before giving it, and whatever the
// broker sent after it, back to the queue in order. Well under RabbitMQ's
// consumer_timeout (30 min by default; 20 s on the test node).
const holdBound = 10 * time.Second

// Hold marks a handler's error as the host's, not the message's: its store
// cannot take anything now. Such a delivery is never rejected for it; it
// is retried, and given back to the queue in order, until the host can.
func Hold(err error) error { return &holdError{err} }

type holdError struct{ err error }

func (e *holdError) Error() string { return e.err.Error() }
func (e *holdError) Unwrap() error { return e.err }

// Backpressure marks a handler's error as "no room for this inbox's mail
// now" (its local inbox is full): the delivery, and what came after it,
// go back to the queue in order at once, the inbox is not consumed until
// room says there is room again, and nothing counts against the message.
// Meanwhile the broker holds the inbox's mail, and past its own cap
// (x-max-length, reject-publish) refuses new publishes: their senders
// hear it at once. The host's other inboxes flow on.
func Backpressure(err error, room func() bool) error { return &backpressure{err, room} }

type backpressure struct {
	err  error
	room func() bool // quick: polled every roomPoll while the inbox waits
}

func (e *backpressure) Error() string { return e.err.Error() }
func (e *backpressure) Unwrap() error { return e.err }

// Room is whether the inbox has room again.
func (e *backpressure) Room() bool { return e.room() }

// roomPoll is how often an inbox held by back-pressure asks whether its
// local inbox has room again.
const roomPoll = 200 * time.Millisecond

// waitRoom waits, with the inbox not consumed, until bp says there is
// room, or the consumer or its generation stops (false).
func (b *Broker) waitRoom(gen *generation, c *consumer, bp *backpressure) bool {
	log := b.log.With("queue", InboxQueue(c.gid))
	log.Info("local inbox full: not taking from its broker inbox until it drains (the broker holds the mail)", "err", bp.err)
	if !bp.Room() && !backoff.Poll(roomPoll, time.Time{}, bp.Room, c.quit, gen.ctx.Done()) {
		return false
	}
	log.Info("local inbox has room: taking from its broker inbox again")
	return true
}

// take hands one delivery of an inbox to the handler and settles it on its
// own channel. Undecodable, not authentic, or refused by the handler (a
// *Refusal): refused at once to bridge.dlq with the reason, loudly.
//
// Order: a delivery the handler cannot take blocks this inbox's intake —
// it is retried while the later deliveries wait behind it, so none
// overtakes it — for up to holdBound (or until stop or done closes). Then
// take returns false without settling it, and the caller gives it back in
// order (cancel, with the held delivery): the consumer cancelled first (so the broker sends
// nothing more), then this delivery requeued, then what came after it, in
// the order they came — a classic queue puts requeued messages back in
// their places, a quorum queue returns them in the order they are
// requeued — and consumes again after a pause. A delivery given
// back for the handler's own reasons (not Hold) the configured number of
// times is rejected (to bridge.dlq), so no poison message blocks an inbox
// for ever.
func (b *Broker) take(d amqp.Delivery, gid string, stop, done <-chan struct{}) bool {
	env, ok := b.admit(d, gid)
	if !ok {
		return true
	}
	settled, _ := b.hold(d, env, InboxQueue(gid), stop, done)
	return settled
}

// admit decodes a delivery of gid's inbox and checks that it is
// authentic; what is not is refused at once (false).
func (b *Broker) admit(d amqp.Delivery, gid string) (*envelope.Envelope, bool) {
	q := InboxQueue(gid)
	env, err := envelope.Decode(d.Body, b.cfg.MaxBody)
	if err != nil {
		b.refuse(d, q, nil, asRefusal(err, ReasonMalformed), true)
		return nil, false
	}
	if env.Recipient.Group != "" {
		env.Recipient.Gid = gid // a broadcast copy: this inbox's (membership is the handler's check)
	} else if env.Recipient.Gid != gid {
		b.refuse(d, q, env, Refuse(ReasonMisrouted, "addressed to %s, found in the inbox of %s", env.Recipient.Gid, gid), true)
		return nil, false
	}
	if err := b.authentic(d, env); err != nil {
		// unsigned, forged, replayed or from the wrong host: never taken in
		b.refuse(d, q, env, asRefusal(err, ReasonForged), true)
		return nil, false
	}
	if err := b.open(d, env); err != nil {
		var drop *Drop
		if errors.As(err, &drop) {
			// a sealed broadcast copy whose member has it in the clear
			b.drop(d, q, env, drop.Why)
			return nil, false
		}
		// authentic, but sealed to other hosts, altered, or in the clear
		b.refuse(d, q, env, asRefusal(err, ReasonTampered), true)
		return nil, false
	}
	return env, true
}

// ErrNotTried is a batch handler's result for a message after the first
// one it could not take in: it did not try it. The broker goes on from
// that first one, one message at a time.
var ErrNotTried = errors.New("not tried: an earlier message of the batch was not taken in")

// BatchHandler takes several deliveries of one inbox into the host, in
// order, and returns each one's outcome as a Handler would. Once one is
// not taken in (an error other than a *Refusal), nothing after it may
// have been taken in: their results are ErrNotTried (or anything; they
// are handed over again).
type BatchHandler func(envs []*envelope.Envelope) []error

// OnBatch sets the handler of batches (call before Run); without one,
// each message of a batch goes to the Handler alone.
func (b *Broker) OnBatch(h BatchHandler) { b.batch = h }

func (b *Broker) handleBatch(envs []*envelope.Envelope) []error {
	if b.batch != nil {
		return b.batch(envs)
	}
	errs := make([]error, len(envs))
	for i, env := range envs {
		var r *Refusal
		if errs[i] = b.handle(env); errs[i] != nil && !errors.As(errs[i], &r) {
			for k := i + 1; k < len(envs); k++ {
				errs[k] = ErrNotTried
			}
			break
		}
	}
	return errs
}

// takeBatch is take for deliveries of one inbox that came together: the
// authentic ones go to the batch handler at once (one store operation for
// a run of messages) and are acked each once it has them. From the first
// one the handler could not take in, they are taken one at a time, with
// take's order guarantee; what take gives back, with everything after
// it, is returned (held) for the caller to give back in order; with bp if
// the handler said there is no room (Backpressure).
func (b *Broker) takeBatch(ds []amqp.Delivery, gid string, stop, done <-chan struct{}) (held []amqp.Delivery, bp *backpressure) {
	q := InboxQueue(gid)
	envs := make([]*envelope.Envelope, 0, len(ds))
	kept := make([]amqp.Delivery, 0, len(ds))
	for _, d := range ds {
		if env, ok := b.admit(d, gid); ok {
			envs, kept = append(envs, env), append(kept, d)
		}
	}
	if len(envs) == 0 {
		return nil, nil
	}
	errs := b.handleBatch(envs)
	for i, env := range envs {
		var r *Refusal
		switch err := errs[i]; {
		case err == nil:
			b.forget(env.MsgID)
			if err := kept[i].Ack(false); err != nil {
				// the channel died after the host took it: the redelivery
				// is dropped by the host's dedup by msg id
				b.log.Warn("ack failed; the redelivery will be recognised by its msg id", "msg_id", env.MsgID, "trace_id", env.TraceID, "queue", q, "err", err)
			}
		case errors.As(err, &r):
			b.refuse(kept[i], q, env, r, true)
		case errors.As(err, &bp):
			return kept[i:], bp // given back at once, in order
		default:
			for k := i; k < len(envs); k++ {
				if settled, bp := b.hold(kept[k], envs[k], q, stop, done); !settled {
					return kept[k:], bp
				}
			}
			return nil, nil
		}
	}
	return nil, nil
}

// hold hands an authentic delivery to the handler, holding the inbox's
// intake while the host cannot take it in (see take), and settles it;
// false: not settled, to be given back with what came after it (with bp:
// at once, for want of room).
func (b *Broker) hold(d amqp.Delivery, env *envelope.Envelope, q string, stop, done <-chan struct{}) (settled bool, bp *backpressure) {
	log := b.log.With("msg_id", env.MsgID, "trace_id", env.TraceID, "queue", q)
	var r *Refusal
	err := b.handle(env)
	if errors.As(err, &bp) {
		return false, bp
	}
	if err != nil && !errors.As(err, &r) {
		log.Warn("could not take a message into the host store: holding this inbox's intake, nothing behind it overtakes it", "err", err)
		deadline := time.Now().Add(holdBound)
		for delay := 100 * time.Millisecond; err != nil && !errors.As(err, &r) && time.Now().Before(deadline); delay = min(2*delay, 2*time.Second) {
			t := time.NewTimer(delay)
			select {
			case <-stop:
				t.Stop()
				return false, nil
			case <-done: // the connection is going: its deliveries go back with it
				t.Stop()
				return false, nil
			case <-t.C:
			}
			if err = b.handle(env); errors.As(err, &bp) {
				return false, bp
			}
		}
		if err == nil {
			log.Info("message taken in: the inbox's intake resumes")
		}
	}
	switch {
	case errors.As(err, &r):
		b.refuse(d, q, env, r, true)
		return true, nil
	case err == nil:
		b.forget(env.MsgID)
		if err := d.Ack(false); err != nil {
			// the channel died after the host took it: the redelivery is
			// dropped by the host's dedup by msg id
			log.Warn("ack failed; the redelivery will be recognised by its msg id", "err", err)
		}
		return true, nil
	}
	var hold *holdError
	if !errors.As(err, &hold) { // the host's failures (a full disk) never count against a message
		if n := b.noteFailure(env.MsgID); n >= b.cfg.Attempts {
			log.Error("could not take a message into the host store: rejected", "attempts", n, "err", err)
			b.refused(ReasonPoison, env.Sender.Host)
			_ = d.Nack(false, false)
			b.forget(env.MsgID)
			return true, nil
		}
	}
	log.Warn("could not take a message into the host store: given back to the broker with what came after it, in order; consuming again shortly",
		"held", holdBound.String(), "err", err)
	return false, nil
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
	if err := b.open(d, env); err != nil {
		b.refuse(d, q, env, asRefusal(err, ReasonTampered), true)
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
			b.refused(ReasonPoison, env.Sender.Host)
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
