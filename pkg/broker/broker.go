package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Config configures the transport.
type Config struct {
	URL            string // amqp:// or amqps://; several (a cluster's nodes), separated by commas
	CAFile         string // amqps: private CA to verify the broker
	CertFile       string // amqps: client certificate
	KeyFile        string // amqps: client key
	Host           string // this gateway's host id
	Heartbeat      time.Duration
	Limits         Limits
	Prefetch       int
	PublishTimeout time.Duration // bound on waiting for a confirm
	MaxBody        int
	Attempts       int // failed hand-overs of one delivery before it is rejected to bridge.dlq
}

// Handler takes one delivery into the host: nil means the host has it
// durably, and the delivery is acked.
type Handler func(env *envelope.Envelope) error

// Broker is the transport. Run owns the connections; Publish and the inbox
// calls may be used from any goroutine.
type Broker struct {
	cfg    Config
	urls   []string // the nodes' URIs (one without a cluster)
	node   int      // which of urls connect dials next (Run's goroutine only)
	log    *slog.Logger
	handle Handler
	batch  BatchHandler // consumer.go: a batch of one inbox's deliveries; nil: each to handle

	mu           sync.Mutex
	gen          *generation // nil while disconnected
	blocked      string      // non-empty while the broker blocks publishers
	since        time.Time   // when the state (up, blocked, down) last changed
	lastErr      error
	inboxes      map[string][]string // gid -> groups: the consumers we want
	reconnected  time.Time           // when the current generation came up after a loss
	lostOnce     bool
	stateSubs    []chan bool
	fails        map[string]int // msg id -> failed hand-overs
	presence     PresenceHandler
	untrusted    UntrustedHandler // presence.go: presence refused as not trusted
	control      ControlHandler   // control.go: SPAWN/STOP from control.<host>
	deaths       DeathHandler     // deaths.go: our messages dead in other inboxes
	deathsTold   bool             // a deaths queue failure was said (once until it works)
	sign         Signer           // auth.go: this gateway signs what it publishes
	verify       Verifier         // auth.go: and checks what it takes in
	sealer       Sealer           // auth.go: seals text to the hosts that deliver it, opens what comes
	onRefused    func(reason, claimedHost string)
	onRefusedMsg func(RefusedMsg)                 // auth.go: refusal notices to the sender
	onDropped    func(*envelope.Envelope, string) // auth.go: what the sealer said to drop, for the audit log
	observe      Observer                         // observe.go: for metrics
	presRefused  map[string]*refusedRun           // presence.go: refusals reported once a minute
	chanCloses   map[string]*refusedRun           // the publishing channel's closes, said once a minute per cause (Run's goroutine only)

	tried     chan struct{} // closed after the first connection attempt that was not refused the host id
	triedOnce sync.Once
	fatal     chan error // the host id stays held by another live gateway

	quiet atomic.Bool // StopConsuming: no inbox is consumed any more
}

// generation is one pair of connections and everything opened on them.
// When either connection dies the whole generation is discarded: delivery
// tags restart at 1 on new channels, so nothing from an old generation is
// ever acked on a new one.
type generation struct {
	node             string // the node's URI, without credentials
	pubConn, subConn *amqp.Connection
	pubMu            sync.Mutex
	pub              *publisher // publisher() to read: serve replaces it when the broker closes its channel
	ctx              context.Context
	cancel           context.CancelFunc
	mu               sync.Mutex
	consumers        map[string]*consumer
	wg               sync.WaitGroup
	setup            *rpcChannel // consumer.go: declarations and bindings
	chansMu          sync.Mutex
	chans            []*consumeChannel // consumer.go: shared by the inbox consumers
}

// publisher is the generation's publishing channel now.
func (gen *generation) publisher() *publisher {
	gen.pubMu.Lock()
	defer gen.pubMu.Unlock()
	return gen.pub
}

// New returns a transport; nothing is dialed until Run.
func New(cfg Config, log *slog.Logger, handle Handler) *Broker {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 64
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 5
	}
	return &Broker{cfg: cfg, urls: nodeURLs(cfg.URL), log: log.With("broker", RedactAll(cfg.URL)), handle: handle, inboxes: map[string][]string{}, fails: map[string]int{},
		tried: make(chan struct{}), fatal: make(chan error, 1), since: time.Now()}
}

// SplitURLs splits a broker setting into its node URIs (config.BrokerNodes).
func SplitURLs(raw string) []string { return config.BrokerNodes(raw) }

// nodeURLs are the node URIs of a broker setting, a node without user info
// taking the login of the first (one login, several nodes of a cluster).
func nodeURLs(raw string) []string {
	urls := SplitURLs(raw)
	first, err := url.Parse(urls[0])
	if err != nil || first.User == nil {
		return urls
	}
	for i, one := range urls[1:] {
		if u, err := url.Parse(one); err == nil && u.User == nil {
			u.User = first.User
			urls[i+1] = u.String()
		}
	}
	return urls
}

// RedactAll is Redact of every node URI in raw, comma-separated.
func RedactAll(raw string) string {
	var out []string
	for _, u := range SplitURLs(raw) {
		out = append(out, Redact(u))
	}
	return strings.Join(out, ",")
}

// Redact returns the URL without its user info: credentials never appear in
// logs or errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable broker URL)"
	}
	u.User = nil
	return u.String()
}

// InClear reports whether raw (one or several node URIs) has a plain
// amqp:// URI to a host that is not this machine: then every message
// crosses a network unencrypted. It also returns that broker's host, for
// the warning.
func InClear(raw string) (bool, string) {
	for _, one := range SplitURLs(raw) {
		if clear, h := inClear(one); clear {
			return true, h
		}
	}
	return false, ""
}

func inClear(raw string) (bool, string) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "amqp" {
		return false, ""
	}
	h := u.Hostname()
	if h == "localhost" {
		return false, h
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return false, h
	}
	return true, h
}

// Connected reports whether the transport is up (and not blocked).
func (b *Broker) Connected() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen != nil && b.blocked == ""
}

// Subscribe returns a channel that receives the connection state on every
// change (true: up).
func (b *Broker) Subscribe() <-chan bool {
	c := make(chan bool, 8)
	b.mu.Lock()
	b.stateSubs = append(b.stateSubs, c)
	b.mu.Unlock()
	return c
}

// State is the transport as fleet-gw status tells it: "connected",
// "blocked" (the broker blocks publishers: reason in detail), "connecting"
// (never connected yet) or "down" (the last error in detail), the node
// connected to, and since when.
func (b *Broker) State() (state, detail, node string, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.gen != nil && b.blocked != "":
		return "blocked", b.blocked, b.gen.node, b.since
	case b.gen != nil:
		return "connected", "", b.gen.node, b.since
	case b.lastErr == nil:
		return "connecting", "", "", b.since
	default:
		return "down", b.lastErr.Error(), "", b.since
	}
}

func (b *Broker) setState(up bool) {
	b.mu.Lock()
	b.since = time.Now()
	subs := append([]chan bool(nil), b.stateSubs...)
	b.mu.Unlock()
	for _, c := range subs {
		select {
		case c <- up:
		default:
		}
	}
}

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
	var takenSince, refusedSince time.Time
	for ctx.Err() == nil {
		gen, err := b.connect(ctx)
		if errors.Is(err, errHostTaken) {
			if takenSince.IsZero() {
				takenSince = time.Now()
				b.log.Error("another live connection holds host id "+b.cfg.Host+" on the broker: waiting for it to go",
					"queue", RosterQueue(b.cfg.Host), "bound", b.ClaimWait().String())
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
	fail := func(err error) (*generation, error) {
		pubConn.Close()
		subConn.Close()
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

// StopConsuming cancels every inbox consumer, now and after any
// reconnect, and leaves publishing (and the control, roster and deaths
// consumers) as they are: a gateway stopping takes no new mail, while the
// work it is finishing still publishes its receipts and answers. What an
// inbox consumer had received and not taken goes back to its queue.
func (b *Broker) StopConsuming() {
	b.quiet.Store(true) // before gen.mu: a consumer starting after this sees it
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return
	}
	gen.mu.Lock()
	cs := make([]*consumer, 0, len(gen.consumers))
	for gid, c := range gen.consumers {
		cs = append(cs, c)
		delete(gen.consumers, gid)
	}
	gen.mu.Unlock()
	for _, c := range cs {
		c.stop()
	}
}

// AddInbox declares, binds and consumes the inbox of a local entity, and
// keeps it consumed after every reconnect. Connected, it returns once the
// inbox is consumed — a message sent the moment join returns is routed and
// taken — or with the error that kept it from being, and then forgets it
// (nothing half-made). Disconnected, it returns nil: the inbox is declared
// and consumed when the connection comes back.
func (b *Broker) AddInbox(gid string, groups []string) error {
	b.mu.Lock()
	b.inboxes[gid] = groups
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return nil
	}
	o, err := b.openInbox(gen, gid)
	if err != nil {
		b.mu.Lock()
		delete(b.inboxes, gid)
		b.mu.Unlock()
		// a queue declared and bound but never consumed would collect
		// broadcast copies for nobody until it is full — and a full inbox
		// bound to broadcast.all refuses every broadcast: delete it
		var nd *notDeclared
		if errors.As(err, &nd) {
			// nothing was made
		} else if derr := gen.setup.do(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(InboxQueue(gid), false, false, false)
			return err
		}); derr != nil {
			b.log.Error("a join failed and its half-made inbox could not be deleted: delete it by hand",
				"queue", InboxQueue(gid), "err", derr)
		}
		return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "could not declare and consume the inbox %s on the broker", InboxQueue(gid)).
			WithHint("check the broker and the gateway's log; the entity was not registered")
	}
	b.startConsumer(gen, gid, o)
	return nil
}

// KeepInbox makes gid's inbox one this gateway consumes, now in the
// background if connected, and after every reconnect: for the entities
// loaded at start, whose inboxes exist already.
func (b *Broker) KeepInbox(gid string, groups []string) {
	b.mu.Lock()
	b.inboxes[gid] = groups
	gen := b.gen
	b.mu.Unlock()
	if gen != nil {
		b.startConsumer(gen, gid, nil)
	}
}

// SetGroups rebinds gid's inbox to its new groups' broadcast keys at once
// (and on every reconnect after).
func (b *Broker) SetGroups(gid string, old, groups []string) error {
	b.mu.Lock()
	if _, ok := b.inboxes[gid]; ok {
		b.inboxes[gid] = groups
	}
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return errors.New("broker unreachable")
	}
	ch, err := gen.subConn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q := InboxQueue(gid)
	for _, gr := range groups {
		if err := ch.QueueBind(q, "broadcast."+gr, ExMsg, false, nil); err != nil {
			return err
		}
	}
	for _, gr := range old {
		if !slices.Contains(groups, gr) {
			if err := ch.QueueUnbind(q, "broadcast."+gr, ExMsg, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// RemoveInbox stops consuming gid's inbox, unbinds it so nothing new
// arrives, hands what is still queued to the handler, and deletes the
// queue. It needs the broker; without it, the queue stays (and is found
// again when the entity is registered anew or an operator removes it).
func (b *Broker) RemoveInbox(gid string, groups []string) error {
	b.mu.Lock()
	delete(b.inboxes, gid)
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return fault.New(fault.Unavailable, fault.KindBrokerDown, "broker unreachable: inbox queue %s left in place", InboxQueue(gid))
	}
	gen.mu.Lock()
	c := gen.consumers[gid]
	delete(gen.consumers, gid)
	gen.mu.Unlock()
	if c != nil {
		c.stop()
	}
	ch, err := gen.subConn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q := InboxQueue(gid)
	for _, k := range InboxKeys(gid, groups) {
		if err := ch.QueueUnbind(q, k, ExMsg, nil); err != nil {
			return err
		}
	}
	// take in what is queued, with a consumer of its own (basic.get is
	// refused on a quorum queue with a single active consumer), until the
	// queue has nothing ready
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	tag := b.tag(gid) + "/leave"
	dl, err := ch.Consume(q, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	idle := time.NewTimer(300 * time.Millisecond)
	defer idle.Stop()
	for done := false; !done; {
		select {
		case d, ok := <-dl:
			if !ok {
				return errors.New("the channel closed while taking in the inbox")
			}
			if !b.take(d, gid, nil, nil) {
				_ = ch.Cancel(tag, false)
				_ = d.Nack(false, true)
				return errors.New("the host could not take in what waits in the inbox")
			}
		case <-idle.C:
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return err
			}
			done = st.Messages == 0
			idle.Reset(300 * time.Millisecond)
		}
	}
	if err := ch.Cancel(tag, false); err != nil {
		return err
	}
	for d := range dl { // sent before the cancel: taken in too
		if !b.take(d, gid, nil, nil) {
			_ = d.Nack(false, true)
		}
	}
	_, err = ch.QueueDelete(q, false, true, false)
	return err
}

// Publish sends env to bridge.msg with routing key key: persistent,
// mandatory, confirmed. It returns only after the broker confirmed it, and
// fails at once when the broker is unreachable or blocked:
//
//	fault.Unavailable (69)  broker down, blocked, or no confirm in time
//	fault.NoRecipient (67)  returned unroutable (no such inbox)
//	fault.TempFail (75)     nacked twice: the inbox is full (reject-publish)
//
// A confirm that is neither ack nor nack (the channel closed) is an unknown
// outcome: the same bytes, same msg id, are published again, which the
// receiver's dedup makes safe.
func (b *Broker) Publish(ctx context.Context, key string, env *envelope.Envelope, persistent bool) error {
	if g, ok := strings.CutPrefix(key, "broadcast."); ok && !ident.ValidGroup(g) {
		// the callers check every group (ident.ValidGroup); a key outside
		// the grammar never reaches the broker, which would refuse it
		return fault.New(fault.Usage, fault.KindUsage, "%q is not a valid group name: not published", g)
	}
	msg, err := b.publishing(env, persistent)
	if err != nil {
		return err
	}
	// names this host for the dead-letter route (SenderKey): the broker
	// strips BCC before delivery; signed or not, the body says who sent it
	msg.Headers["BCC"] = []any{SenderKey(b.cfg.Host)}
	nacks := 0
	deadline := time.Now().Add(b.cfg.PublishTimeout)
	maybeSent := false // an attempt was written and not confirmed
	for attempt := 1; ; attempt++ {
		gen, err := b.current("remote send refused", "local sends keep working; remote ones work again once the gateway reconnects")
		if err != nil {
			if maybeSent {
				return outcomeUnknown(env.MsgID, err)
			}
			return err
		}
		pub := gen.publisher()
		written, res := pub.publishWritten(ctx, ExMsg, key, msg, deadline)
		switch res {
		case resAck:
			return nil
		case resReturned:
			return fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient %s: the broker has no inbox for it", key)
		case resNack:
			nacks++
			if nacks >= 2 {
				if b.observe.InboxFull != nil {
					b.observe.InboxFull(env.Kind)
				}
				return fault.New(fault.TempFail, fault.KindInboxFull, "the inbox of %s is full: the broker refused the message", key)
			}
		case resTimeout:
			if !written && !maybeSent {
				return fault.New(fault.Unavailable, fault.KindBrokerDown,
					"the broker did not take the message within %v: not sent", b.cfg.PublishTimeout).
					WithHint("check the broker (a memory or disk alarm blocks publishers)")
			}
			return fault.New(fault.OutcomeUnknown, fault.KindBrokerTimeout,
				"the broker did not confirm message %s within %v; it may still deliver it", env.MsgID, b.cfg.PublishTimeout).
				WithHint("fleet-send --status %s tells once it is known; a retry with --id %s is sent at most once", env.MsgID, env.MsgID)
		case resClosed:
			if reason, ok := pub.refused(key); ok {
				return refusedFault(key, reason, b.cfg.Host)
			}
			// unknown outcome: retry with the same msg id on whatever
			// channel and connection are current, while time remains
			// (the receiving gateway keeps one copy per msg id)
			maybeSent = maybeSent || written
		}
		if time.Now().After(deadline) || attempt >= 5 {
			if maybeSent {
				return outcomeUnknown(env.MsgID, nil)
			}
			return fault.New(fault.Unavailable, fault.KindBrokerDown, "the broker connection failed before the message was written: not sent")
		}
		backoff.Sleep(ctx, 50*time.Millisecond*time.Duration(attempt))
	}
}

// outcomeUnknown is the error of a publish that was written on a channel
// whose connection was then lost before the broker confirmed it: the
// broker may have it (and deliver it) or not. cause, if any, is why the
// retries stopped.
func outcomeUnknown(msgID string, cause error) error {
	msg := "the broker connection was lost before it confirmed message " + msgID + ": the outcome is unknown"
	if cause != nil {
		msg += " (" + cause.Error() + ")"
	}
	return fault.New(fault.OutcomeUnknown, fault.KindOutcomeUnknown, "%s", msg).
		WithHint("fleet-send --status %s tells once it is known; a retry with --id %s is sent at most once", msgID, msgID)
}

// refusedFault is the error of a publish the broker refused (ACCESS_REFUSED
// naming its routing key): this host's login may not publish key. It is
// not retried.
func refusedFault(key, reason, host string) error {
	return fault.New(fault.Refused, fault.KindBrokerLogin, "the broker refused the publish to %s: %s", key, reason).
		WithHint("this host's broker login may not publish that key: fleet-gw broker-setup --host %s (on the broker) grants what fleet publishes", host)
}

// current returns the live generation, or the fault that says why there is
// none: the broker blocks publishers, or it is unreachable. Nothing waits.
func (b *Broker) current(refused, downHint string) (*generation, error) {
	b.mu.Lock()
	gen, blocked, lastErr := b.gen, b.blocked, b.lastErr
	b.mu.Unlock()
	if blocked != "" {
		return nil, fault.New(fault.Unavailable, fault.KindBrokerBlocked, "the broker is blocking publishers (%s): %s", blocked, refused).
			WithHint("free the broker's memory or disk; local sends keep working")
	}
	if gen == nil {
		msg := "broker unreachable"
		if lastErr != nil {
			msg += ": " + lastErr.Error()
		}
		return nil, fault.New(fault.Unavailable, fault.KindBrokerDown, "%s", msg).WithHint("%s", downHint)
	}
	return gen, nil
}

// DeadLetter publishes a copy of env to bridge.dlq (by bridge.msg, DeadKey) with
// the reason and attempt count, for a remote message that died on this
// host. Best effort: the host's own dead letter is the record.
func (b *Broker) DeadLetter(env *envelope.Envelope, reason string, attempts int) error {
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return errors.New("broker unreachable")
	}
	env, err := b.sealed(env)
	if err != nil {
		return err
	}
	body, err := envelope.Encode(env)
	if err != nil {
		return err
	}
	msg := amqp.Publishing{
		ContentType: "application/json", MessageId: env.MsgID, Type: string(env.Kind),
		DeliveryMode: amqp.Persistent, Body: body,
		Headers: amqp.Table{
			"fleet-reason": reason, "fleet-attempts": int64(attempts),
			"fleet-host": b.cfg.Host, "fleet-trace-id": env.TraceID,
		},
	}
	b.signHeaders(&msg)
	return b.copyDead(gen, msg)
}
