package broker

import (
	"context"
	"log/slog"
	"strings"
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

// publisher owns one confirm-mode channel. Publishes are serialized by a
// turn of one (amqp091-go channels are not safe for concurrent RPCs): the
// caller holding it writes its publish itself, so a publish costs no
// hand-off to another goroutine and back; returns and confirms are read by
// one events goroutine from unbuffered channels, so a basic.return is
// always matched before the basic.ack of the same message (the broker
// sends the return first, and the library hands them over in order) — and
// a slow reader can never make the library drop a return.
type publisher struct {
	ch      *amqp.Channel
	turn    chan struct{} // holds one token while a publish is written
	log     *slog.Logger
	observe func(outcome string, took time.Duration) // Observer.Confirmed; nil: none

	done     chan struct{} // closed when the channel closes
	mu       sync.Mutex
	byTag    map[uint64]*pubReq
	byMsgID  map[string]*pubReq
	closed   bool
	closeErr *amqp.Error // why the broker closed the channel (nil: the connection went, or we closed it)
}

type pubReq struct {
	msgID    string
	returned bool
	done     chan result
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
		ch: ch, turn: make(chan struct{}, 1), log: log, observe: observe, done: make(chan struct{}),
		byTag: map[uint64]*pubReq{}, byMsgID: map[string]*pubReq{},
	}
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go p.events(returns, confirms, closed)
	return p, nil
}

// write publishes r's message while holding the turn: only one goroutine
// writes on the channel at a time, and the tag it reads is its publish's.
func (p *publisher) write(ctx context.Context, r *pubReq, exchange, key string, mandatory bool, msg amqp.Publishing) error {
	select {
	case p.turn <- struct{}{}:
	case <-p.done:
		return amqp.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.turn }()
	// The tag is read before p.mu is taken, never under it: the library
	// holds the lock GetNextPublishSeqNo needs while it hands a confirm
	// to the events goroutine, which needs p.mu to match it — asking
	// for the tag under p.mu deadlocked every later publish of the
	// gateway. Only the turn's holder publishes, so the tag cannot move
	// in between.
	tag := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return amqp.ErrClosed
	}
	p.byTag[tag] = r
	if mandatory {
		p.byMsgID[r.msgID] = r
	}
	p.mu.Unlock()
	err := p.ch.PublishWithContext(ctx, exchange, key, mandatory, false, msg)
	if err != nil {
		p.mu.Lock()
		delete(p.byTag, tag)
		delete(p.byMsgID, r.msgID)
		p.mu.Unlock()
	}
	return err
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
				delete(p.byMsgID, r.msgID)
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
		case err := <-closed:
			// the cause is set before done closes: whoever sees done,
			// or a publish cut short, reads why
			p.mu.Lock()
			p.closed, p.closeErr = true, err
			pending := p.byTag
			p.byTag, p.byMsgID = map[uint64]*pubReq{}, map[string]*pubReq{}
			p.mu.Unlock()
			close(p.done)
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

// cause is why the broker closed the channel: a channel exception (a
// publish it refused), nil while open or when the connection went.
func (p *publisher) cause() *amqp.Error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closeErr
}

// refused reports whether the broker closed the channel refusing a
// publish with key: ACCESS_REFUSED naming that routing key (RabbitMQ:
// "write access to topic 'KEY' in exchange ..."). Publishing it again
// would only close the next channel too; the other publishes the close
// cut short are unknown outcomes, published again.
func (p *publisher) refused(key string) (reason string, ok bool) {
	e := p.cause()
	if e == nil || e.Code != amqp.AccessRefused || !strings.Contains(e.Reason, "'"+key+"'") {
		return "", false
	}
	return e.Reason, true
}

// publishWritten publishes msg, mandatory, and says whether it was
// written on the channel: a publish written and then not confirmed (resClosed,
// resTimeout) may be on the broker; one never written is not.
func (p *publisher) publishWritten(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time) (written bool, res result) {
	start := time.Now()
	written, wait := p.start(ctx, exchange, key, msg, deadline, true)
	res = wait()
	if p.observe != nil {
		p.observe(outcomes[res], time.Since(start))
	}
	return written, res
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

// start writes one publish on the channel and returns once it is
// written, or could not be; wait returns its outcome.
func (p *publisher) start(ctx context.Context, exchange, key string, msg amqp.Publishing, deadline time.Time, mandatory bool) (written bool, wait func() result) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	r := &pubReq{msgID: msg.MessageId, done: make(chan result, 1)}
	if err := p.write(ctx, r, exchange, key, mandatory, msg); err != nil {
		// timed out only if the deadline passed before cancel: read after
		// it, every write refused by a closed channel read as a timeout
		res := resClosed
		if ctx.Err() != nil {
			res = resTimeout
		}
		cancel()
		return false, func() result { return res }
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
