package broker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type result int

const (
	resAck      result = iota // confirmed, routed
	resReturned               // confirmed but returned unroutable (mandatory)
	resNack                   // nacked: with reject-publish, the queue is full
	resClosed                 // the channel closed first: outcome unknown
	resTimeout                // no confirm in time
)

// publisher owns one confirm-mode channel. Publishes are serialized through
// its owner goroutine (amqp091-go channels are not safe for concurrent
// RPCs); returns and confirms are read by one events goroutine from
// unbuffered channels, so a basic.return is always matched before the
// basic.ack of the same message (the broker sends the return first, and
// the library hands them over in order) — and a slow reader can never make
// the library drop a return.
type publisher struct {
	ch      *amqp.Channel
	reqs    chan *pubReq
	log     *slog.Logger
	observe func(outcome string, took time.Duration) // Observer.Confirmed; nil: none

	done    chan struct{} // closed when the channel closes: the owner stops
	mu      sync.Mutex
	byTag   map[uint64]*pubReq
	byMsgID map[string]*pubReq
	closed  bool
}

type pubReq struct {
	exchange, key string
	mandatory     bool
	msg           amqp.Publishing
	ctx           context.Context
	returned      bool
	done          chan result
	published     chan error
}

func newPublisher(conn *amqp.Connection, log *slog.Logger, observe func(string, time.Duration)) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &publisher{
		ch: ch, reqs: make(chan *pubReq), log: log, observe: observe, done: make(chan struct{}),
		byTag: map[uint64]*pubReq{}, byMsgID: map[string]*pubReq{},
	}
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go p.events(returns, confirms, closed)
	go p.owner(closed)
	return p, nil
}

// owner is the only goroutine that publishes on the channel.
func (p *publisher) owner(closed <-chan *amqp.Error) {
	for {
		var r *pubReq
		select {
		case r = <-p.reqs:
		case <-p.done:
			return
		}
		// The tag is read before p.mu is taken, never under it: the library
		// holds the lock GetNextPublishSeqNo needs while it hands a confirm
		// to the events goroutine, which needs p.mu to match it — asking
		// for the tag under p.mu deadlocked every later publish of the
		// gateway. Only this goroutine publishes, so the tag cannot move
		// in between.
		tag := p.ch.GetNextPublishSeqNo()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			r.published <- amqp.ErrClosed
			continue
		}
		p.byTag[tag] = r
		if r.mandatory {
			p.byMsgID[r.msg.MessageId] = r
		}
		p.mu.Unlock()
		err := p.ch.PublishWithContext(r.ctx, r.exchange, r.key, r.mandatory, false, r.msg)
		if err != nil {
			p.mu.Lock()
			delete(p.byTag, tag)
			delete(p.byMsgID, r.msg.MessageId)
			p.mu.Unlock()
		}
		r.published <- err
	}
}

// events matches returns and confirms to their requests.
func (p *publisher) events(returns <-chan amqp.Return, confirms <-chan amqp.Confirmation, closed <-chan *amqp.Error) {
	for {
		select {
		case ret, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.mu.Lock()
			if r := p.byMsgID[ret.MessageId]; r != nil {
				r.returned = true
			}
			p.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			p.mu.Lock()
			r := p.byTag[c.DeliveryTag]
			delete(p.byTag, c.DeliveryTag)
			if r != nil {
				delete(p.byMsgID, r.msg.MessageId)
			}
			p.mu.Unlock()
			if r == nil {
				continue
			}
			switch {
			case !c.Ack:
				r.done <- resNack
			case r.returned:
				r.done <- resReturned
			default:
				r.done <- resAck
			}
		case <-closed:
			close(p.done)
			p.mu.Lock()
			p.closed = true
			pending := p.byTag
			p.byTag, p.byMsgID = map[uint64]*pubReq{}, map[string]*pubReq{}
			p.mu.Unlock()
			for _, r := range pending {
				r.done <- resClosed
			}
			// keep draining so the library never blocks on us
			go func() {
				for range returns {
				}
			}()
			go func() {
				for range confirms {
				}
			}()
			return
		}
	}
}

func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time) result {
	return p.publishTo(ctx, exchange, key, msg, deadline, true)
}

func (p *publisher) publishTo(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time, mandatory bool) result {
	if p.observe == nil {
		return p.publishOnce(ctx, exchange, key, msg, deadline, mandatory)
	}
	start := time.Now()
	res := p.publishOnce(ctx, exchange, key, msg, deadline, mandatory)
	p.observe(outcomes[res], time.Since(start))
	return res
}

func (p *publisher) publishOnce(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time, mandatory bool) result {
	_, wait := p.start(ctx, exchange, key, msg, deadline, mandatory)
	return wait()
}

// publishOrdered is publishTo in two halves: it returns once the publish
// is written on the channel (written false: it was not, and wait reports
// why), and wait then waits for its confirm. Only the owner goroutine
// writes on the channel, taking requests one at a time, so publishes
// written one after another by one caller reach the broker in that order
// without each waiting for the confirm of the one before (presence.go:
// a host's presence messages form a chain in that order).
func (p *publisher) publishOrdered(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time) (written bool, wait func() result) {
	start := time.Now()
	written, w := p.start(ctx, exchange, key, msg, deadline, false)
	return written, func() result {
		res := w()
		if p.observe != nil {
			p.observe(outcomes[res], time.Since(start))
		}
		return res
	}
}

// start hands one publish to the owner goroutine and returns once it is
// written on the channel, or could not be; wait returns its outcome.
func (p *publisher) start(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time, mandatory bool) (written bool, wait func() result) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	failed := func(res result) (bool, func() result) {
		cancel()
		return false, func() result { return res }
	}
	r := &pubReq{
		exchange: exchange, key: key, mandatory: mandatory, msg: msg, ctx: ctx,
		done: make(chan result, 1), published: make(chan error, 1),
	}
	select {
	case p.reqs <- r:
	case <-p.done:
		return failed(resClosed)
	case <-ctx.Done():
		return failed(resTimeout)
	}
	if err := <-r.published; err != nil {
		if ctx.Err() != nil {
			return failed(resTimeout)
		}
		return failed(resClosed)
	}
	return true, func() result {
		defer cancel()
		select {
		case res := <-r.done:
			return res
		case <-ctx.Done():
			return resTimeout
		}
	}
}
