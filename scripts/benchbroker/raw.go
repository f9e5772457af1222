// The raw amqp091-go baselines, measured in the same run beside fleet's
// figures: the two-hop round trip (beside the ask) and the fan-out to N
// queues (beside the broadcast).

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleet/scripts/internal/benchkit"
	amqp "github.com/rabbitmq/amqp091-go"
)

// rawPair is the raw baseline: two parties like two gateways (a publishing
// and a consuming connection each), two durable classic queues bound to a
// topic exchange with arguments like an inbox's, non-persistent messages,
// mandatory publishes with confirms, manual acks.
type rawPair struct {
	conns    []*amqp.Connection
	aPub     *amqp.Channel
	aConf    chan amqp.Confirmation
	arrivals chan rawArrival // at A, from queue b
	bRecv    chan time.Time  // when B had the message from queue a
	body     []byte
	n        int
}

type rawArrival struct {
	id string
	at time.Time
}

const (
	rawExchange = "bench.raw"
	rawQA       = "bench.raw.a"
	rawQB       = "bench.raw.b"
)

func rawInboxArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type":  "classic",
		"x-overflow":    "reject-publish",
		"x-max-length":  int64(10000),
		"x-message-ttl": int64(7 * 24 * time.Hour / time.Millisecond),
	}
}

func newRawPair(vhostURL string, body []byte) (*rawPair, error) {
	r := &rawPair{arrivals: make(chan rawArrival, 16), bRecv: make(chan time.Time, 16), body: body}
	dialRole := func(role string) (*amqp.Connection, error) {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName("benchbroker raw " + role)
		c, err := amqp.DialConfig(vhostURL, amqp.Config{Heartbeat: 5 * time.Second, Properties: props, Locale: "en_US"})
		if err != nil {
			return nil, err
		}
		r.conns = append(r.conns, c)
		return c, nil
	}
	fail := func(err error) (*rawPair, error) {
		r.close()
		return nil, fmt.Errorf("raw baseline: %w", err)
	}
	aPubConn, err := dialRole("A publish")
	if err != nil {
		return fail(err)
	}
	aSubConn, err := dialRole("A consume")
	if err != nil {
		return fail(err)
	}
	bPubConn, err := dialRole("B publish")
	if err != nil {
		return fail(err)
	}
	bSubConn, err := dialRole("B consume")
	if err != nil {
		return fail(err)
	}
	setup, err := aSubConn.Channel()
	if err != nil {
		return fail(err)
	}
	if err := setup.ExchangeDeclare(rawExchange, "topic", true, false, false, false, nil); err != nil {
		return fail(err)
	}
	for q, key := range map[string]string{rawQA: "raw.a", rawQB: "raw.b"} {
		if _, err := setup.QueueDeclare(q, true, false, false, false, rawInboxArgs()); err != nil {
			return fail(err)
		}
		if err := setup.QueueBind(q, key, rawExchange, false, nil); err != nil {
			return fail(err)
		}
	}
	setup.Close()

	confirmed := func(conn *amqp.Connection) (*amqp.Channel, chan amqp.Confirmation, error) {
		ch, err := conn.Channel()
		if err != nil {
			return nil, nil, err
		}
		if err := ch.Confirm(false); err != nil {
			return nil, nil, err
		}
		conf := ch.NotifyPublish(make(chan amqp.Confirmation, 64))
		rets := ch.NotifyReturn(make(chan amqp.Return, 64))
		go func() {
			for range rets { // unroutable: the round trip times out and says so
			}
		}()
		return ch, conf, nil
	}
	consume := func(conn *amqp.Connection, q string) (<-chan amqp.Delivery, error) {
		ch, err := conn.Channel()
		if err != nil {
			return nil, err
		}
		if err := ch.Qos(64, 0, false); err != nil {
			return nil, err
		}
		return ch.Consume(q, "benchbroker-"+q, false, true, false, false, nil)
	}
	if r.aPub, r.aConf, err = confirmed(aPubConn); err != nil {
		return fail(err)
	}
	bPub, bConf, err := confirmed(bPubConn)
	if err != nil {
		return fail(err)
	}
	bIn, err := consume(bSubConn, rawQA)
	if err != nil {
		return fail(err)
	}
	aIn, err := consume(aSubConn, rawQB)
	if err != nil {
		return fail(err)
	}
	// B: take from queue a, publish the answer to queue b (confirmed), then ack
	go func() {
		for d := range bIn {
			select {
			case r.bRecv <- time.Now():
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), rawWait)
			err := bPub.PublishWithContext(ctx, rawExchange, "raw.b", true, false, amqp.Publishing{
				ContentType: "application/json", MessageId: d.MessageId + "-answer", Body: d.Body,
				Expiration: d.Expiration, DeliveryMode: amqp.Transient,
			})
			cancel()
			if err == nil {
				select {
				case <-bConf:
				case <-time.After(rawWait):
				}
			}
			_ = d.Ack(false)
		}
	}()
	// A: the answer arrives
	go func() {
		for d := range aIn {
			at := time.Now()
			_ = d.Ack(false)
			select {
			case r.arrivals <- rawArrival{id: strings.TrimSuffix(d.MessageId, "-answer"), at: at}:
			default:
			}
		}
	}()
	return r, nil
}

func (r *rawPair) close() {
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// once does one raw round trip: publish to queue a (confirmed), B answers
// to queue b, A has it. It returns the round trip and the first leg.
func (r *rawPair) once() (rt, leg1 time.Duration, err error) {
	r.n++
	id := fmt.Sprintf("raw-%d-%d", os.Getpid(), r.n)
drain: // stale timestamps of an earlier timed-out round
	for {
		select {
		case <-r.bRecv:
		default:
			break drain
		}
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), rawWait)
	defer cancel()
	if err := r.aPub.PublishWithContext(ctx, rawExchange, "raw.a", true, false, amqp.Publishing{
		ContentType: "application/json", MessageId: id, Body: r.body,
		Expiration: strconv.FormatInt(askTTL.Milliseconds(), 10), DeliveryMode: amqp.Transient,
	}); err != nil {
		return 0, 0, err
	}
	timer := time.NewTimer(rawWait)
	defer timer.Stop()
	select {
	case c := <-r.aConf:
		if !c.Ack {
			return 0, 0, errors.New("raw publish nacked")
		}
	case <-timer.C:
		return 0, 0, errors.New("raw publish: no confirm")
	}
	for {
		select {
		case a := <-r.arrivals:
			if a.id != id {
				continue // a late answer of an earlier round
			}
			var b time.Time
			select {
			case b = <-r.bRecv:
			default:
				b = a.at
			}
			return a.at.Sub(t0), b.Sub(t0), nil
		case <-timer.C:
			return 0, 0, errors.New("raw round trip: no answer")
		}
	}
}

// rawFanout is the broker's floor for a broadcast: n durable classic
// queues with an inbox's arguments, bound to a topic exchange with one key,
// each consumed (manual ack, its own channel, like a gateway's inbox
// consumer) over one connection per host; one persistent, mandatory,
// confirmed publish per round, as fleet-bcast publishes.
type rawFanout struct {
	conns []*amqp.Connection
	pub   *amqp.Channel
	conf  chan amqp.Confirmation
	tr    *tracker
	body  []byte
	n     int
}

const rawFanoutExchange = "bench.fanout"

func newRawFanout(vhostURL string, n, hosts int, body []byte) (*rawFanout, error) {
	r := &rawFanout{tr: &tracker{n: n, rounds: map[string]*bround{}}, body: body}
	fail := func(err error) (*rawFanout, error) {
		r.close()
		return nil, fmt.Errorf("raw fan-out baseline: %w", err)
	}
	dialOne := func() (*amqp.Connection, error) {
		c, err := amqp.DialConfig(vhostURL, amqp.Config{Heartbeat: 5 * time.Second, Locale: "en_US"})
		if err == nil {
			r.conns = append(r.conns, c)
		}
		return c, err
	}
	pc, err := dialOne()
	if err != nil {
		return fail(err)
	}
	if r.pub, err = pc.Channel(); err != nil {
		return fail(err)
	}
	if err := r.pub.ExchangeDeclare(rawFanoutExchange, "topic", true, false, false, false, nil); err != nil {
		return fail(err)
	}
	if err := r.pub.Confirm(false); err != nil {
		return fail(err)
	}
	r.conf = r.pub.NotifyPublish(make(chan amqp.Confirmation, 16))
	rets := r.pub.NotifyReturn(make(chan amqp.Return, 16))
	go func() {
		for range rets {
		}
	}()
	var subs []*amqp.Connection
	for h := 0; h < hosts; h++ {
		c, err := dialOne()
		if err != nil {
			return fail(err)
		}
		subs = append(subs, c)
	}
	for i := 0; i < n; i++ {
		ch, err := subs[i%hosts].Channel()
		if err != nil {
			return fail(err)
		}
		q := fmt.Sprintf("bench.fanout.%03d", i)
		if _, err := ch.QueueDeclare(q, true, false, false, false, rawInboxArgs()); err != nil {
			return fail(err)
		}
		if err := ch.QueueBind(q, "broadcast.all", rawFanoutExchange, false, nil); err != nil {
			return fail(err)
		}
		if err := ch.Qos(64, 0, false); err != nil {
			return fail(err)
		}
		d, err := ch.Consume(q, "", false, true, false, false, nil)
		if err != nil {
			return fail(err)
		}
		go func(i int) {
			for m := range d {
				at := time.Now()
				_ = m.Ack(false)
				r.tr.arrive(m.MessageId, i, at)
			}
		}(i)
	}
	return r, nil
}

func (r *rawFanout) close() {
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// once publishes one persistent message and returns the time to the
// confirm and the time until every queue's consumer had it.
func (r *rawFanout) once() (conf, all time.Duration, err error) {
	r.n++
	id := fmt.Sprintf("fanout-%d-%d", os.Getpid(), r.n)
	round := r.tr.get(id)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), roundWait)
	defer cancel()
	if err := r.pub.PublishWithContext(ctx, rawFanoutExchange, "broadcast.all", true, false, amqp.Publishing{
		ContentType: "application/json", MessageId: id, Body: r.body, DeliveryMode: amqp.Persistent,
	}); err != nil {
		return 0, 0, err
	}
	timer := time.NewTimer(roundWait)
	defer timer.Stop()
	select {
	case c := <-r.conf:
		if !c.Ack {
			return 0, 0, errors.New("raw fan-out publish nacked")
		}
		conf = time.Since(t0)
	case <-timer.C:
		return 0, 0, errors.New("raw fan-out publish: no confirm")
	}
	select {
	case <-round.done:
	case <-timer.C:
		return 0, 0, errors.New("raw fan-out: not in every queue in time")
	}
	r.tr.mu.Lock()
	defer r.tr.mu.Unlock()
	for _, at := range round.at {
		if d := at.Sub(t0); d > all {
			all = d
		}
	}
	return conf, all, nil
}

// rawTP is the floor of the throughput phase: raw amqp091-go with the
// guarantees fleet gives a remote message. Durable classic queues with an
// inbox's arguments, one per recipient, bound to a topic exchange;
// persistent, mandatory publishes with publisher confirms, one channel per
// sender on one publishing connection (as a gateway has one); one
// consumer per queue, each on its own channel of one consuming connection,
// prefetch 64 (a gateway's default), a manual ack of each delivery once
// the consumer has it.
type rawTP struct {
	conns []*amqp.Connection
	pubs  []*amqp.Channel
	sink  atomic.Pointer[tpSink]
	stale atomic.Int64
	rets  atomic.Int64 // returned unroutable

	// durable: each consumer writes what it takes to its file and
	// fdatasyncs it before the ack, as a gateway's store makes a message
	// durable before it acks (the CPU floor of the same work)
	durable atomic.Bool
	files   []*os.File
}

func newRawTP(vhostURL, dir string, senders, rcpts int) (*rawTP, error) {
	r := &rawTP{}
	fail := func(err error) (*rawTP, error) {
		r.close()
		return nil, fmt.Errorf("raw throughput baseline: %w", err)
	}
	dial := func(role string) (*amqp.Connection, error) {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName("benchbroker raw throughput " + role)
		c, err := amqp.DialConfig(vhostURL, amqp.Config{Heartbeat: 5 * time.Second, Properties: props, Locale: "en_US"})
		if err == nil {
			r.conns = append(r.conns, c)
		}
		return c, err
	}
	pc, err := dial("publish")
	if err != nil {
		return fail(err)
	}
	sc, err := dial("consume")
	if err != nil {
		return fail(err)
	}
	setup, err := sc.Channel()
	if err != nil {
		return fail(err)
	}
	if err := setup.ExchangeDeclare(tpRawPrefix, "topic", true, false, false, false, nil); err != nil {
		return fail(err)
	}
	for i := 0; i < rcpts; i++ {
		q := fmt.Sprintf("%s.%02d", tpRawPrefix, i)
		if _, err := setup.QueueDeclare(q, true, false, false, false, rawInboxArgs()); err != nil {
			return fail(err)
		}
		if err := setup.QueueBind(q, q, tpRawPrefix, false, nil); err != nil {
			return fail(err)
		}
		ch, err := sc.Channel()
		if err != nil {
			return fail(err)
		}
		if err := ch.Qos(64, 0, false); err != nil {
			return fail(err)
		}
		d, err := ch.Consume(q, "benchbroker-"+q, false, true, false, false, nil)
		if err != nil {
			return fail(err)
		}
		f, err := os.CreateTemp(dir, "raw-durable-*")
		if err != nil {
			return fail(err)
		}
		r.files = append(r.files, f)
		go func(i int, f *os.File) {
			for m := range d {
				if r.durable.Load() {
					if _, err := f.Write(m.Body); err == nil {
						_ = syscall.Fdatasync(int(f.Fd()))
					}
				}
				if s := r.sink.Load(); s != nil {
					s.arrive(string(m.Body), i, &r.stale)
				} else {
					r.stale.Add(1)
				}
				_ = m.Ack(false)
			}
		}(i, f)
	}
	setup.Close()
	for i := 0; i < senders; i++ {
		ch, err := pc.Channel()
		if err != nil {
			return fail(err)
		}
		if err := ch.Confirm(false); err != nil {
			return fail(err)
		}
		rets := ch.NotifyReturn(make(chan amqp.Return, 16))
		go func() {
			for range rets {
				r.rets.Add(1)
			}
		}()
		r.pubs = append(r.pubs, ch)
	}
	return r, nil
}

func (r *rawTP) close() {
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
	for _, f := range r.files {
		f.Close()
		os.Remove(f.Name())
	}
	r.files = nil
}

// runDurable is run confirm-each with the consumers' fdatasync before
// each ack, and the CPU it cost this process (the raw client, both
// sides) and the broker.
func (r *rawTP) runDurable(c tpConfig, run string, n, bpid int) (*tpRun, error) {
	r.durable.Store(true)
	defer r.durable.Store(false)
	b0, s0 := brokerCPU(bpid), benchkit.SelfCPU()
	res, err := r.run(c, run, n, false)
	if err != nil {
		return nil, err
	}
	res.cpu = map[string]time.Duration{"raw": benchkit.SelfCPU() - s0, "broker": brokerCPU(bpid) - b0}
	return res, nil
}

// run publishes n messages as c says — each confirmed before the next, or
// pipelined with up to tpPipeline confirms outstanding per sender — and
// waits until every one was consumed.
func (r *rawTP) run(c tpConfig, run string, n int, pipelined bool) (*tpRun, error) {
	sink := newSink(run, n)
	r.sink.Store(sink)
	defer r.sink.Store(nil)
	rets0 := r.rets.Load()
	errs := make([]error, c.senders)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < c.senders; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			ch := r.pubs[i]
			var outstanding []*amqp.DeferredConfirmation
			confirmed := func(dc *amqp.DeferredConfirmation) error {
				ctx, cancel := context.WithTimeout(context.Background(), rawWait)
				defer cancel()
				ok, err := dc.WaitContext(ctx)
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("nacked")
				}
				return nil
			}
			for k := 0; k < benchkit.Split(n, c.senders, i); k++ {
				rc := c.rcptOf(i, k)
				key := fmt.Sprintf("%s.%02d", tpRawPrefix, rc)
				ctx, cancel := context.WithTimeout(context.Background(), rawWait)
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, tpRawPrefix, key, true, false, amqp.Publishing{
					ContentType: "text/plain", MessageId: fmt.Sprintf("%s-%d-%d", run, i, k), DeliveryMode: amqp.Persistent,
					Body: []byte(tpBody(run, i, rc, k, c.body)),
				})
				cancel()
				if err != nil {
					errs[i] = err
					return
				}
				outstanding = append(outstanding, dc)
				limit := 1
				if pipelined {
					limit = tpPipeline
				}
				for len(outstanding) >= limit {
					if err := confirmed(outstanding[0]); err != nil {
						errs[i] = err
						return
					}
					outstanding = outstanding[1:]
				}
			}
			for _, dc := range outstanding {
				if err := confirmed(dc); err != nil {
					errs[i] = err
					return
				}
			}
		}(i)
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	sends := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("raw %s: %w", c, err)
	}
	if n := r.rets.Load() - rets0; n > 0 {
		return nil, fmt.Errorf("raw %s: %d returned unroutable", c, n)
	}
	select {
	case <-sink.done:
	case <-time.After(tpWait):
		return nil, fmt.Errorf("raw %s: not every message consumed after %v", c, tpWait)
	}
	if err := sink.check(); err != nil {
		return nil, fmt.Errorf("raw %s: %w", c, err)
	}
	elapsed := sink.at.Sub(t0)
	return &tpRun{rate: float64(n) / elapsed.Seconds(), elapsed: elapsed, sends: sends}, nil
}
