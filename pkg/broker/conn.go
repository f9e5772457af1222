package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/fault"
)

// The connection's life: dial (TLS and login), connect to a node of
// the cluster, serve one connection (a generation) until it ends, and
// reconnect with backoff (Run).

func (b *Broker) tlsConfig(raw string) (*tls.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "amqps" {
		return nil, nil
	}
	tc := &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	if b.cfg.CAFile != "" {
		pem, err := os.ReadFile(b.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("broker CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker CA %s holds no PEM certificate", b.cfg.CAFile)
		}
		tc.RootCAs = pool
	}
	if b.cfg.CertFile != "" || b.cfg.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(b.cfg.CertFile, b.cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func (b *Broker) dial(raw, role string) (*amqp.Connection, error) {
	tc, err := b.tlsConfig(raw)
	if err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("fleet-gw " + b.cfg.Host + " " + role)
	return amqp.DialConfig(raw, amqp.Config{
		// a node that does not answer (down, partitioned) is given up
		// quickly, for the next one
		Dial:            amqp.DefaultDial(dialTimeout),
		Heartbeat:       b.cfg.Heartbeat,
		TLSClientConfig: tc,
		Properties:      props,
		Locale:          "en_US",
	})
}

// One gateway per host id (design decision 14). The gateway's roster
// queue, roster.<host>, is exclusive to one connection: it is this host
// id's claim on the broker. A connection that finds it held by another is
// refused, and retried for ClaimWait (long enough for the broker to reap
// our own connection from before a crash or a cut network); after that the
// host id is taken, and Fatal says so.

// errHostTaken is connect's error while another connection holds the claim.
var errHostTaken = errors.New("host id held by another connection")

// loginRefused reports whether err is the broker refusing who we are or
// what we may do: bad or revoked credentials, no access to the vhost, a
// permission this gateway's own queues need, or a topology it may not make.
func loginRefused(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) || errors.Is(err, amqp.ErrSASL) || errors.Is(err, errNoTopology) {
		return true
	}
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// dialTimeout bounds a connection attempt (TCP, TLS and the AMQP
// handshake), so a silent node costs seconds, not the library's 30.
const dialTimeout = 5 * time.Second

// setupBound bounds the declares and binds after the dial (connectTo).
const setupBound = 15 * time.Second

// refusedAtStart is how long a starting gateway retries a login the broker
// refuses before it stops with 77.
const refusedAtStart = 5 * time.Second

// ClaimWait is how long a held host id is retried before it counts as
// taken by another live gateway.
func (b *Broker) ClaimWait() time.Duration { return 3*b.cfg.Heartbeat + 2*time.Second }

// Tried is closed after the first connection attempt that was not refused
// the host id: connected (the host id is ours), or the broker unreachable.
func (b *Broker) Tried() <-chan struct{} { return b.tried }

// Fatal receives the error that ends this gateway at start: its host id is held by
// another live gateway past ClaimWait. Run returns after sending it.
func (b *Broker) Fatal() <-chan error { return b.fatal }

// Run connects, declares the topology, starts the consumers and keeps them
// running until ctx is cancelled, reconnecting with jittered backoff.
func (b *Broker) Run(ctx context.Context) {
	pol := backoff.Policy{Base: 200 * time.Millisecond, Max: 10 * time.Second, Jitter: true}
	failures := 0
	said := "" // the reason last logged
	var takenSince, refusedSince, takenSaid time.Time
	for ctx.Err() == nil {
		gen, err := b.connect(ctx)
		if errors.Is(err, errHostTaken) {
			if takenSince.IsZero() {
				takenSince = time.Now()
				takenSaid = takenSince
				b.log.Error("another live connection holds host id "+b.cfg.Host+" on the broker: waiting for it to go",
					"queue", RosterQueue(b.cfg.Host), "bound", b.ClaimWait().String())
			} else if time.Since(takenSaid) >= 15*time.Second {
				// after a lost connection there is no bound (it is most
				// likely our own, not yet reaped): say it is still so
				takenSaid = time.Now()
				b.log.Warn("host id "+b.cfg.Host+" still held on the broker by another connection",
					"queue", RosterQueue(b.cfg.Host), "for", time.Since(takenSince).Round(time.Second).String())
			}
			if time.Since(takenSince) > b.ClaimWait() && !b.lostOnce {
				b.fatal <- fault.New(fault.Conflict, fault.KindHostTaken,
					"host id %s is taken: another live gateway is connected to the broker as %s", b.cfg.Host, b.cfg.Host).
					WithHint("stop the other gateway, or give this one its own --host (a copied state folder keeps its host id)")
				return
			}
			backoff.Sleep(ctx, time.Second)
			continue
		}
		if err != nil && !takenSince.IsZero() && !b.lostOnce {
			// at start, after the claim was seen held: another error (a
			// dial cut, a channel closed under the declare) proves nothing
			// about who holds it now, so this gateway still does not serve
			// (a copied state folder would deliver its stored mail twice);
			// it asks again until the claim is ours or ClaimWait is out
			b.log.Warn("asking the broker again whether host id "+b.cfg.Host+" is free", "err", err)
			if time.Since(takenSince) > b.ClaimWait() {
				b.fatal <- fault.Wrap(fault.Conflict, fault.KindHostTaken, err,
					"host id %s is taken: another live gateway was connected to the broker as %s, and the broker could not be asked again", b.cfg.Host, b.cfg.Host).
					WithHint("stop the other gateway, or give this one its own --host (a copied state folder keeps its host id)")
				return
			}
			backoff.Sleep(ctx, time.Second)
			continue
		}
		takenSince = time.Time{}
		refused := loginRefused(err)
		if refused && !b.lostOnce && failures == 0 {
			// at start: a wrong, revoked or under-privileged login is the
			// operator's to fix, not something a retry mends — once it
			// has lasted refusedAtStart (amqp091-go reports a connection
			// cut during the handshake, or a vhost still starting, in the
			// same words), the gateway stops before it ever serves
			if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			if time.Since(refusedSince) < refusedAtStart {
				backoff.Sleep(ctx, time.Second)
				continue
			}
			b.fatal <- fault.Wrap(fault.Refused, fault.KindBrokerLogin, err,
				"the broker refused this gateway's login or its permissions").
				WithHint("make its login with: fleet-gw broker-setup --host %s --broker URI (on the broker), and put the URI it prints in FLEET_BROKER", b.cfg.Host)
			return
		}
		b.triedOnce.Do(func() { close(b.tried) })
		if err != nil {
			failures++
			b.mu.Lock()
			b.lastErr = err
			b.mu.Unlock()
			delay := pol.Delay(failures)
			// the first failure, every tenth, and any with a new reason
			if failures == 1 || failures%10 == 0 || err.Error() != said {
				if refused {
					b.log.Error("the broker refuses this gateway's login (revoked, or its password changed): other hosts read unknown until it is fixed",
						"err", err, "attempt", failures, "fix", "fleet-gw broker-setup --host "+b.cfg.Host+" on the broker, then restart with the new FLEET_BROKER")
				} else {
					b.log.Error("broker unreachable", "err", err, "attempt", failures)
				}
				said = err.Error()
			}
			if refused {
				delay = max(delay, 30*time.Second) // it takes an operator: knock seldom
			}
			backoff.Sleep(ctx, delay)
			continue
		}
		if failures > 0 || b.lostOnce {
			b.log.Info("broker connection restored", "node", gen.node, "after_attempts", failures)
		} else {
			b.log.Info("broker connected", "node", gen.node)
		}
		failures, said = 0, ""
		err = b.serve(ctx, gen)
		b.lostOnce = true
		b.mu.Lock()
		b.gen = nil
		b.blocked = ""
		b.lastErr = err
		b.mu.Unlock()
		b.setState(false)
		gen.cancel()
		gen.pubConn.Close()
		gen.subConn.Close()
		gen.wg.Wait()
		if ctx.Err() != nil {
			return
		}
		if len(b.urls) > 1 {
			b.node++ // the next node first: this one may be the one lost
		}
		b.log.Warn("broker connection lost: reconnecting", "node", gen.node, "err", err)
		backoff.Sleep(ctx, pol.Delay(1))
	}
}

// connect dials both connections, declares the shared topology and opens
// the publisher.
//
// With several node URIs (a cluster), both connections go to one node: the
// one after the node that last failed, so a lost node is left for the next
// live one at once, in turn.
func (b *Broker) connect(ctx context.Context) (*generation, error) {
	raw := b.urls[b.node%len(b.urls)]
	gen, err := b.connectTo(ctx, raw)
	if err != nil && !errors.Is(err, errHostTaken) {
		b.node++ // the next node, next time
		if len(b.urls) > 1 {
			err = fmt.Errorf("%s: %w", Redact(raw), err)
		}
	}
	if gen != nil {
		gen.node = Redact(raw)
	}
	return gen, err
}

func (b *Broker) connectTo(ctx context.Context, raw string) (*generation, error) {
	pubConn, err := b.dial(raw, "publish")
	if err != nil {
		return nil, err
	}
	subConn, err := b.dial(raw, "consume")
	if err != nil {
		pubConn.Close()
		return nil, err
	}
	// the set-up below is RPCs that amqp091-go never times out: a node
	// that keeps the connection alive (heartbeats) but does not answer a
	// declare would hold this gateway off the broker for good. Past
	// setupBound both connections are closed, which ends the RPC waiting.
	var stalled atomic.Bool
	watchdog := time.AfterFunc(setupBound, func() {
		stalled.Store(true)
		pubConn.CloseDeadline(time.Now().Add(time.Second))
		subConn.CloseDeadline(time.Now().Add(time.Second))
	})
	defer watchdog.Stop()
	fail := func(err error) (*generation, error) {
		watchdog.Stop()
		pubConn.Close()
		subConn.Close()
		if stalled.Load() && !errors.Is(err, errHostTaken) {
			err = fmt.Errorf("the broker did not answer this gateway's set-up within %v: %w", setupBound, err)
		}
		return nil, err
	}
	ch, err := declareShared(subConn, b.cfg.Limits)
	if err != nil {
		return fail(fmt.Errorf("declaring the shared topology: %w", err))
	}
	q := ControlQueue(b.cfg.Host)
	if _, err := ch.QueueDeclare(q, true, false, false, false, queueArgs(b.cfg.Limits.QueueType)); err != nil {
		// one made with another type (inbox-queue-type changed): used as
		// it is, said loudly; a redeclare in a loop would never connect
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return fail(err)
		}
		b.log.Error("control queue exists with other arguments than configured (another inbox-queue-type?): keeping it as it is",
			"queue", q, "err", ae.Reason, "fix", "queues keep the type they were made with: see man 7 fleet-broker, A BROKER CLUSTER")
		if ch, err = subConn.Channel(); err != nil {
			return fail(err)
		}
	}
	if err := ch.QueueBind(q, b.cfg.Host, ExControl, false, nil); err != nil {
		return fail(err)
	}
	// presence is soft state: an exclusive, auto-delete queue that lives
	// and dies with this connection, its heartbeats short-lived. Being
	// exclusive, it is also this host id's claim: held by another live
	// connection, this one is refused (405 RESOURCE_LOCKED).
	rq := RosterQueue(b.cfg.Host)
	if _, err := ch.QueueDeclare(rq, false, true, true, false, RosterQueueArgs()); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
			return fail(errHostTaken)
		}
		return fail(fmt.Errorf("declaring %s: %w", rq, err))
	}
	if err := ch.QueueBind(rq, "roster.#", ExRoster, false, nil); err != nil {
		return fail(err)
	}
	gctx, cancel := context.WithCancel(ctx)
	gen := &generation{pubConn: pubConn, subConn: subConn, ctx: gctx, cancel: cancel, consumers: map[string]*consumer{},
		setup: &rpcChannel{conn: subConn, ch: ch}}
	pub, err := newPublisher(pubConn, b.log, b.observe.Confirmed)
	if err != nil {
		cancel()
		return fail(err)
	}
	if !watchdog.Stop() { // fired as the set-up ended: the connections are closing
		cancel()
		return fail(errors.New("set-up finished as its bound closed the connections"))
	}
	gen.pub = pub
	return gen, nil
}

// serve installs gen as current, starts a consumer per inbox and waits for
// either connection to die.
func (b *Broker) serve(ctx context.Context, gen *generation) error {
	pubClosed := gen.pubConn.NotifyClose(make(chan *amqp.Error, 1))
	subClosed := gen.subConn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := gen.pubConn.NotifyBlocked(make(chan amqp.Blocking, 4))
	pubDone := gen.publisher().done

	b.mu.Lock()
	b.gen = gen
	quiet := b.quiet.Load()
	if b.lostOnce {
		b.reconnected = time.Now()
		if b.observe.Reconnected != nil {
			b.observe.Reconnected()
		}
	}
	want := make([]string, 0, len(b.inboxes))
	for gid := range b.inboxes {
		if !quiet {
			want = append(want, gid)
		}
	}
	b.mu.Unlock()
	b.setState(true)
	for _, gid := range want { // each reads its groups when it declares
		b.startConsumer(gen, gid, nil)
	}
	if b.presence != nil {
		gen.wg.Add(1)
		go b.consumeRoster(gen)
	}
	if b.control != nil { // control.go
		gen.wg.Add(1)
		go b.consumeControl(gen)
	}
	if b.deaths != nil { // deaths.go
		gen.wg.Add(1)
		go b.consumeDeaths(gen)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-pubClosed:
			return closeErr("publish connection", err)
		case err := <-subClosed:
			return closeErr("consume connection", err)
		case <-pubDone:
			// the broker closed the publishing channel (a publish it
			// refused: a routing key or exchange this login may not
			// write) and the connection lives on: a new channel takes
			// over at once, and the generation — its consumers, every
			// other send — stays. The publishes the close cut short are
			// published again (Publish); the refused one is not.
			pub, err := b.reopenPublisher(gen, pubClosed)
			if err != nil {
				return err
			}
			pubDone = pub.done
		case bl := <-blocked:
			b.mu.Lock()
			if bl.Active {
				b.blocked, b.since = bl.Reason, time.Now()
			} else {
				b.blocked, b.since = "", time.Now()
			}
			b.mu.Unlock()
			if bl.Active {
				b.log.Error("broker blocks publishers (resource alarm): remote sends fail until it clears", "reason", bl.Reason)
			} else {
				b.log.Info("broker unblocked publishers")
			}
			b.setState(!bl.Active)
		}
	}
}

// reopenPublisher replaces gen's closed publishing channel by a new one on
// the same connection, and says why the broker closed it: once a minute
// per cause, with how often since, however often a caller repeats what
// the broker refuses. An error means the connection is gone too.
func (b *Broker) reopenPublisher(gen *generation, pubClosed <-chan *amqp.Error) (*publisher, error) {
	cause := gen.publisher().cause()
	pub, err := newPublisher(gen.pubConn, b.log, b.observe.Confirmed)
	if err != nil {
		select { // the connection closed: say that, as before
		case cerr := <-pubClosed:
			return nil, closeErr("publish connection", cerr)
		case <-time.After(time.Second):
			return nil, fmt.Errorf("the publishing channel closed (%v) and no new one opened: %w", cause, err)
		}
	}
	gen.pubMu.Lock()
	gen.pub = pub
	gen.pubMu.Unlock()
	why := "closed by the broker"
	if cause != nil {
		why = cause.Error()
	}
	now := time.Now()
	if b.chanCloses == nil {
		b.chanCloses = map[string]*refusedRun{}
	}
	run := b.chanCloses[why]
	if run != nil && now.Sub(run.last) < time.Minute {
		run.quiet++
		return pub, nil
	}
	quiet := 0
	if run != nil {
		quiet = run.quiet
	}
	if len(b.chanCloses) > 64 {
		clear(b.chanCloses)
	}
	b.chanCloses[why] = &refusedRun{last: now}
	attrs := []any{"err", why}
	if quiet > 0 {
		attrs = append(attrs, "repeats", quiet)
	}
	if cause != nil && cause.Code == amqp.AccessRefused {
		attrs = append(attrs, "fix", "this host's broker login may not publish that: fleet-gw broker-setup --host "+b.cfg.Host+" (on the broker) grants what fleet publishes")
	}
	b.log.Warn("the broker closed the publishing channel: reopened it, the connection kept", attrs...)
	return pub, nil
}

func closeErr(what string, err *amqp.Error) error {
	if err == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %s", what, err.Error())
}
