package broker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
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
