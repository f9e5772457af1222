package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/private"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/store"
	"github.com/fleetd/fleet/pkg/trust"
)

// Gateway is one host's fleet-gw: a composition of parts, each of which
// owns its state behind its own lock and small API. The Gateway wires them
// together (open), runs and stops them (Run, shutdown), and answers the
// requests that are not a part's (the handlers in entities.go, ask.go,
// broadcast.go, recv.go, rendezvous.go); it holds no feature state of its
// own:
//
//	reg    registry.go    the live entities, by gid and name (mailbox: one entity, mailbox.go)
//	st     pkg/store      everything durable: entities, inboxes, records
//	boxes  inbox.go       entities made live (mailbox.go) and delivered to: pastes, commands, nudges
//	route  route.go       the routing fork: a send resolved, stored here or published; its record told
//	in     intake.go      a message into its inbox: broker deliveries and local sends
//	rcpt   receipt.go     records settled across hosts, receipts, bounces
//	rdv    rendezvous.go  open sends (--wait), the replies handed to them, its claim rule
//	asks   ask.go         open asks, asks delivered here, answers sent
//	ctl    control_request.go  fleet-spawn, fleet-stop: asked of a host, calls waiting for answers
//	exec   control_exec.go     the SPAWN and STOP asked of this host, carried out once per id
//	tracer trace.go       fleet-trace: queries waiting for answers, searches for other hosts
//	dlq    dlq.go         fleet-dlq: dead letters replayed (once) and purged
//	peers  peers.go       what was heard of the other hosts (the remote roster, by name)
//	said   announcer.go   this host's presence chain: what it announced of its entities
//	watch  watch.go       the watch stream: every audit line and change of state, to its watchers
//	keys   sealkeys.go    this host's sealing keys: rotation announced, retired keys destroyed
//	admit  admit.go       what a message from the broker must prove
//	seal   sealing.go     text sealed to the hosts that deliver it, opened once admitted
//	names  names.go       a name is one entity: conflicts told, untrusted hosts' names
//	wake   wake.go        the wake notices typed for hook entities with a pane
//	caps   inboxcap.go    local inboxes held to inbox-max-length and inbox-ttl
//	pairs  pairrate.go    pair-rate: the sends of each sender→recipient pair a minute
//	urgent urgent.go      urgent-rate: each sender's urgent messages a minute
//	br     pkg/broker     the cross-host transport (nil: single-host mode)
//	metrics pkg/metrics   counted events (nil: off)
//	scrape metrics.go     the /metrics endpoint and what a scrape reads
type Gateway struct {
	cfg   *config.Config
	log   *slog.Logger
	st    *store.Store
	audit *audit.Log
	br    *broker.Broker // nil: single-host mode

	reg     *registry
	rdv     *rendezvous
	asks    *asks
	peers   *peerView
	admits  *admitsView  // admits.go: which hosts each other host admits
	pairs   *pairRates   // pairrate.go: the sends of each sender→recipient pair a minute
	urgent  *urgentRate  // urgent.go: each sender's urgent messages a minute
	heardMu sync.Mutex   // one save of peers' last words at a time (presence.go saveHeard)
	said    *announcer   // announcer.go: this host's presence chain
	watch   *watchers    // watch.go: the watch stream (fleet-roster --watch, fleet-top)
	notes   changes      // watch.go: who is told of a change of an entity's state (said, watch)
	keys    *sealKeys    // sealkeys.go: this host's sealing keys (nil: single-host mode)
	admit   *admission   // nil: single-host mode
	seal    *sealing     // sealing.go: text sealed to the hosts that deliver it (nil: single-host mode)
	names   *nameBook    // names.go
	wake    *wakes       // wake.go: set once the store is open
	follow  *followers   // follow.go: who reads the pull entities; set once the store is open
	caps    *inboxCaps   // inboxcap.go: set once the store is open
	in      *intake      // intake.go: a message into its inbox; set once the store is open
	policy  *policy      // policy.go: who may reach an entity of this host; set once the store is open
	boxes   *inboxes     // inbox.go: entities made live, their delivery workers, dead-lettering; set once the store is open
	route   *router      // route.go: the routing fork, sends, what became of them; set once the store is open
	rcpt    *receipts    // receipt.go: records settled across hosts, bounces; set once the store is open
	tracer  *tracer      // trace.go: fleet-trace; set once the store is open
	dlq     *deadLetters // dlq.go: fleet-dlq replay and purge; set once the store is open

	ctl  *controlRequests // control_request.go: spawn/stop asked of a host; set once the store is open
	exec *controlExec     // control_exec.go: spawn/stop asked of this host; set once the store is open

	metrics *metrics.Metrics // the events counted (nil: metrics-listen is off)
	scrape  *scrapes         // metrics.go: the /metrics endpoint

	crash crashpoint // test hook: FLEET_CRASHPOINT

	lock    *os.File
	ln      net.Listener
	conns   sync.WaitGroup
	workers sync.WaitGroup
	side    tasks // tasks.go: receipts, notices, publishes started on the side of the work

	brCtx  context.Context // the broker's life: cancelled after the drain, when what it produced was published
	stopBr context.CancelFunc
	brDone chan struct{} // closed when the broker's Run returned

	runCtx   context.Context // cancelled when shutdown starts: take no new work
	stopRun  context.CancelFunc
	hardCtx  context.Context // cancelled when the drain bound passes: abort in-flight work
	stopHard context.CancelFunc
	ready    chan struct{}
	started  time.Time // when Run began serving (fleet-gw status)

	hostTaken bool // the broker gave this host id to another gateway: say nothing as it
}

// New returns a gateway for cfg. Nothing is opened until Run.
func New(cfg *config.Config, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	g := &Gateway{
		cfg:    cfg,
		log:    log.With("host", cfg.Host),
		rdv:    newRendezvous(),
		peers:  newPeerView(cfg.PresenceInterval, log.With("host", cfg.Host)),
		admits: newAdmitsView(cfg.Host, cfg.PresenceTTL),
		pairs:  newPairRates(cfg.PairRate),
		names:  newNameBook(log.With("host", cfg.Host), cfg.PresenceTTL),
		reg:    newRegistry(),
		crash:  crashpoint(os.Getenv("FLEET_CRASHPOINT")),
		asks:   newAsks(),
		ready:  make(chan struct{}),
		scrape: &scrapes{log: log.With("host", cfg.Host)},
	}
	g.watch = newWatchers(cfg.Host, g.log, g.reg, g.peers, cfg.PresenceTTL)
	g.said = newAnnouncer(cfg.Host, cfg.PresenceInterval, cfg.PresenceTTL, g.log, announceHooks{
		row: func(gid string) (api.EntityRow, bool) {
			b := g.reg.Get(gid)
			if b == nil {
				return api.EntityRow{}, false
			}
			return g.row(b.snapshot(), nil, nil), true
		},
		rows: g.localRows,
		cert: func() string {
			cert, _ := g.admit.certified().Present()
			return cert
		},
		sealKey: func() string { return g.keys.Public() },
		extras: func() (revoked, admits []string, certified bool) {
			g.admit.certified().Refresh() // a certificate installed, a revocation list imported
			_, revoked = g.admit.certified().Present()
			return revoked, admitsList(g.admit.trustedHosts()), g.admit.admitsCertified()
		},
		publish: func(env *envelope.Envelope, what string, ttl time.Duration) (func() error, error) {
			return g.br.PublishPresence(env, what, ttl)
		},
		up: func() bool { return g.br.Connected() },
		// a name more than one trusted host has, told once (names.go)
		told: func() { g.names.TellAll(g.cfg.Host, append(g.reg.Rows(), g.remoteRows()...)) },
	})
	g.notes = changes{g.said, g.watch}
	return g
}

// Ready is closed once the gateway listens on its socket.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Run opens the state folder and the store, starts delivery and serves the
// socket until ctx is cancelled; then it drains in-flight work within the
// configured bound and returns.
func (g *Gateway) Run(ctx context.Context) error {
	m, lerr := g.scrape.Listen(g.cfg.MetricsListen, g.cfg.Host) // metrics.go
	if lerr != nil {
		return lerr
	}
	g.metrics = m
	if err := g.open(); err != nil {
		g.closeState()
		return err
	}
	g.runCtx, g.stopRun = context.WithCancel(context.Background())
	g.hardCtx, g.stopHard = context.WithCancel(context.Background())
	g.brCtx, g.stopBr = context.WithCancel(context.Background())
	g.brDone = make(chan struct{})
	close(g.brDone) // no broker: nothing to wait for
	// stopping before serving: nothing is in flight, the broker goes too
	abort := func() {
		g.stopRun()
		g.stopBr()
		<-g.brDone
		g.workers.Wait()
	}

	if err := g.recoverInflight(); err != nil {
		g.closeState()
		return err
	}
	if g.cfg.Broker != "" {
		// what was heard of other hosts before: their names resolve
		// before they are heard again (peers.go)
		heard, err := g.st.Heard()
		if err != nil {
			g.closeState()
			return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot read the remote entities kept in the state folder")
		}
		g.peers.Remember(heard)
		g.br = broker.New(broker.Config{
			URL: g.cfg.Broker, CAFile: g.cfg.BrokerCA, CertFile: g.cfg.BrokerCert, KeyFile: g.cfg.BrokerKey,
			Host: g.cfg.Host, Heartbeat: g.cfg.Heartbeat, PublishTimeout: g.cfg.PublishTimeout,
			MaxBody: g.cfg.MaxBody, Attempts: g.cfg.DeliveryAttempts,
			Limits: broker.Limits{MaxLength: g.cfg.InboxMaxLength, TTL: g.cfg.InboxTTL, DLQLength: broker.DLQLength, QueueType: g.cfg.InboxQueueType},
		}, g.log, g.in.Take) // intake.go: a delivery to a local inbox, to the store or its part
		g.rcpt.br = g.br             // receipts cross hosts from now on
		g.watch.Link(g.br)           // watch.go: the peers' states follow the connection
		g.br.OnBatch(g.in.TakeBatch) // intake.go: what an inbox's consumer had waiting, runs of mail stored at once
		g.br.OnPresence(g.onPresence)
		// names.go: what an untrusted host announces is named in a 67, never believed
		g.br.OnUntrustedPresence(g.names.Heard)
		g.br.Observe(g.scrape.Observer()) // metrics.go
		if clear, where := broker.InClear(g.cfg.Broker); clear {
			// sealing.go seals the text; the login and what routes it do not
			g.log.Warn("the broker URI is amqp://, not amqps://: the broker login's password, entity names, ids and routing cross the network to "+where+" in clear, readable by anyone on the path (message text is sealed, except to hosts with no sealing key that plaintext-hosts or seal-fallback = clear allows)",
				"fix", "use amqps:// (man 7 fleet-broker: TLS)")
		}
		// sealkeys.go: the keys that open what is sealed to this host
		if g.keys, err = openSealKeys(g.cfg.StateDir, g.log); err != nil {
			g.closeState()
			if fe := fault.NotPrivate(err); fe != nil {
				return fe
			}
			return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot read this host's sealing keys").
				WithHint("see what is wrong with: fleet-gw seal keys")
		}
		// admit.go: the signer, the admission check and sealing (with
		// the keyring the watcher rereads, so a rotation reaches both)
		if err := g.setupAuth(g.keys.Keyring()); err != nil {
			g.closeState()
			if fe := fault.NotPrivate(err); fe != nil {
				return fe
			}
			return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot set up this host's signing key")
		}
		g.rcpt.own = g.admit.own    // refusal notices name bytes this key signed
		g.br.OnControl(g.exec.Take) // control_exec.go: SPAWN/STOP for this host
		g.br.OnDeath(g.onDeath)     // deaths.go: our messages dead in other hosts' inboxes
		// One gateway per host id: nothing is delivered and no client is
		// served until the broker has given this host id to us (or cannot
		// be reached: then the claim is made when it can, and a lost claim
		// stops the gateway).
		// the broker outlives the drain (shutdown): what the work in
		// flight produces is published and confirmed before it closes
		g.brDone = make(chan struct{})
		go func() {
			defer close(g.brDone)
			g.br.Run(g.brCtx)
		}()
		select {
		case <-g.br.Tried():
		case err := <-g.br.Fatal():
			g.hostTaken = true // say nothing on the broker on this host id's behalf
			g.log.Error("not serving", "err", err)
			abort()
			g.closeState()
			return err
		case <-ctx.Done():
			abort()
			g.closeState()
			return nil
		}
	}
	if err := g.loadEntities(); err != nil {
		abort()
		g.closeState()
		return err
	}
	if err := g.listen(); err != nil {
		abort()
		g.closeState()
		return err
	}
	g.workers.Add(1)
	go g.janitor()
	g.workers.Add(1)
	go func() {
		defer g.workers.Done()
		g.follow.Run(g.runCtx) // follow.go
	}()
	g.workers.Add(1)
	go func() {
		defer g.workers.Done()
		g.caps.Run(g.runCtx) // inboxcap.go: mail past inbox-ttl dies
	}()
	var fatal <-chan error
	if g.br != nil {
		g.said.Start(g.runCtx.Done(), g.br.Subscribe()) // announcer.go: presence, until the leaving notice
		g.keys.Start(g.said.Rekey)                      // sealkeys.go: a rotated key announced at once
		fatal = g.br.Fatal()
	}
	g.scrape.Serve(g.st, g.reg, g.asks, func() string { // metrics.go
		if g.br == nil {
			return "none"
		}
		state, _, _, _ := g.br.State()
		return state
	}, g.remoteRows)
	g.log.Info("gateway ready", "socket", g.cfg.Socket, "state_dir", g.cfg.StateDir, "entities", g.reg.Len())
	g.started = time.Now()
	close(g.ready)

	serveErr := make(chan error, 1)
	go func() { serveErr <- g.serve() }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	case err = <-fatal:
		// another gateway holds this host id now: stop serving at once,
		// and say nothing on its behalf (no leaving notice)
		g.hostTaken = true
		g.log.Error("stopping: this host id is held by another live gateway", "err", err)
	}
	g.shutdown()
	return err
}

// shutdown stops the gateway in the order that loses nothing the work in
// flight produces:
//
//  1. no new work: the socket stops accepting, runCtx is cancelled (the
//     delivery loops stop after the delivery they are in), and the broker
//     stops consuming inboxes (what it had not handed over goes back);
//  2. the drain: in-flight deliveries, client requests and the side tasks
//     they start (receipts, answers, TOO_LATE, bounces) finish and are
//     published and confirmed, within the drain bound; past it, hardCtx
//     aborts them;
//  3. the leaving notice, the last word on the broker;
//  4. the broker's channels and connections close, then the store.
func (g *Gateway) shutdown() {
	g.log.Info("gateway stopping: draining in-flight work", "bound", g.cfg.DrainTimeout.String())
	g.stopRun()
	if g.ln != nil {
		g.ln.Close()
	}
	if g.br != nil {
		g.br.StopConsuming()
	}
	drained := make(chan struct{})
	go func() {
		g.workers.Wait()
		g.conns.Wait()
		_ = g.side.Wait(g.hardCtx) // what the work started on its side: published
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(g.cfg.DrainTimeout):
		g.log.Warn("drain bound passed: aborting in-flight work")
		g.stopHard()
		select {
		case <-drained:
		case <-time.After(2 * time.Second):
			g.log.Error("in-flight work did not stop; closing anyway")
		}
	}
	g.side.Close() // a timer firing from now on starts nothing
	if g.keys != nil {
		g.keys.Stop()
	}
	if g.hostTaken {
		g.said.Stop() // say nothing on the broker on this host id's behalf
	} else {
		// the notices the drain made, then the leaving notice, the chain's
		// last link: other hosts drop us now, not after the TTL
		g.said.Leave(2 * g.cfg.PublishTimeout)
	}
	g.stopHard()
	g.stopBr()
	select {
	case <-g.brDone:
	case <-time.After(g.cfg.PublishTimeout + 2*time.Second):
		g.log.Error("the broker connection did not close; closing anyway")
	}
	_ = os.Remove(g.cfg.Socket)
	_ = os.Remove(config.SocketRecord(g.cfg.StateDir))
	g.closeState()
	g.log.Info("gateway stopped")
}

func (g *Gateway) closeState() {
	g.scrape.Close() // metrics.go: no scrape reads a closing store
	if g.st != nil {
		// the closed store stays in place: a straggler past the drain bound
		// gets "store closed", not a nil pointer
		if err := g.st.Close(); err != nil {
			g.log.Error("closing store", "err", err)
		}
	}
	if g.audit != nil {
		g.audit.Close()
		g.audit = nil
	}
	if g.lock != nil {
		g.lock.Close()
		g.lock = nil
	}
}

// open prepares the state folder, takes its lock and opens the store.
func (g *Gateway) open() error {
	dir := g.cfg.StateDir
	if err := private.MakeDir(dir); err != nil {
		if fe := fault.NotPrivate(err); fe != nil {
			return fe // another user's, or writable by others
		}
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot create state folder %s", dir).
			WithHint("choose another with --state-dir or FLEET_STATE_DIR")
	}
	// the files that make this host itself, checked at every start, with a
	// broker or not: a key or a trust line another user planted is named
	// now, not the day a broker is added
	if err := private.CheckFile("host key", filepath.Join(dir, "host.key"), true); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if _, err := trust.Read(g.cfg.TrustFile); fault.NotPrivate(err) != nil {
		return err
	}
	probe, err := private.OpenFile(filepath.Join(dir, ".write-test"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		if fe := fault.NotPrivate(err); fe != nil {
			return fe
		}
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "state folder %s is not writable", dir).
			WithHint("fix its permissions, or choose another with --state-dir")
	}
	probe.Close()
	os.Remove(probe.Name())

	lock, err := private.OpenFile(filepath.Join(dir, "gw.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		if fe := fault.NotPrivate(err); fe != nil {
			return fe
		}
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot open the lock in %s", dir)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		data := make([]byte, 32)
		n, _ := lock.ReadAt(data, 0)
		lock.Close()
		pid := strings.TrimSpace(string(data[:n]))
		return fault.New(fault.Conflict, fault.KindGatewayLocked,
			"another gateway (pid %s) is running on state folder %s", pid, dir).
			WithHint("stop it first, or give this one its own --state-dir")
	}
	lock.Truncate(0)
	lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	g.lock = lock

	st, err := store.Open(filepath.Join(dir, "fleet.db"))
	if err != nil {
		if fe := fault.NotPrivate(err); fe != nil {
			return fe
		}
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot open the store in %s", dir)
	}
	g.st = st
	g.watch.st = st // watch.go: a watcher's own mail, for its text
	switch host := st.Meta("host"); host {
	case "":
		if err := st.SetMeta("host", g.cfg.Host); err != nil {
			return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the store in %s", dir)
		}
	case g.cfg.Host:
	default:
		return fault.New(fault.Usage, fault.KindStateDir,
			"state folder %s belongs to host %q, not %q", dir, host, g.cfg.Host).
			WithHint("run with --host %s, or give host %s its own --state-dir", host, g.cfg.Host)
	}
	a, err := audit.Open(filepath.Join(dir, "audit.log"), g.cfg.Host,
		audit.Options{MaxSize: int64(g.cfg.AuditMaxSize), Files: g.cfg.AuditFiles})
	if err != nil {
		if fe := fault.NotPrivate(err); fe != nil {
			return fe
		}
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot open the audit log in %s", dir)
	}
	g.audit = a
	a.SetTap(g.watch)
	changed := g.notes.Change // a change of an entity's state: announced, and watched
	g.wake = newWakes(g.cfg, st, g.log, a, changed)
	g.follow = newFollowers(st, g.log, changed)
	g.caps = newInboxCaps(st, g.cfg.InboxMaxLength, g.cfg.InboxTTL, g.log, a, g.metrics, capHooks{
		held: func(gid, key string) bool {
			b := g.reg.Get(gid)
			return b == nil || b.handing() || g.rdv.Claimed(key)
		},
		bounce: func(env *envelope.Envelope, reason string) {
			g.rcpt.Notify()
			g.rcpt.Bounce(env.MsgID, env.TraceID, env.Sender.Gid, env.Recipient.String(), reason)
		},
		dead: func(env *envelope.Envelope, reason string) { g.boxes.Kill(env, reason, -1) },
	})
	g.rcpt = &receipts{host: g.cfg.Host, st: st, log: g.log, audit: a, metrics: g.metrics, reg: g.reg, side: &g.side,
		ctx:        func() context.Context { return g.hardCtx },
		answered:   g.asks.Landed,
		refusedAsk: g.asks.Refused,
		named:      func(r *store.Record) string { return g.route.Record(r).Recipient },
	}
	g.rdv.wire(st, g.reg, g.log, a, g.metrics, g.rcpt.Settled)
	g.boxes = &inboxes{cfg: g.cfg, st: st, log: g.log, audit: a, metrics: g.metrics,
		reg: g.reg, rdv: g.rdv, wake: g.wake, rcpt: g.rcpt, crash: g.crash, workers: &g.workers,
		peers: g.peers, names: g.names, follow: g.follow, caps: g.caps,
		interrupt: &urgentInterrupt{cfg: g.cfg, log: g.log, audit: a, metrics: g.metrics}, // urgent.go
		change:    changed,
		br:        func() *broker.Broker { return g.br },
		admit:     func() *admission { return g.admit },
		run:       func() context.Context { return g.runCtx },
		ctx:       func() context.Context { return g.hardCtx },
	}
	g.exec = &controlExec{cfg: g.cfg, st: st, log: g.log, audit: a, reg: g.reg, follow: g.follow, crash: g.crash,
		ctx: func() context.Context { return g.hardCtx },
		answer: func(ctx context.Context, gid string, env *envelope.Envelope) error {
			return g.br.Publish(ctx, gid, env, true)
		},
		trace: func(env *envelope.Envelope) error { return g.tracer.Query(env) }, // tracer is made below
		free: func(name string) error {
			if g.br == nil {
				return nil
			}
			return g.names.Free(name, g.peers.ByName(name, "", g.admit.trusted), nil)
		},
		register: func(e *store.Entity) error {
			_, _, err := g.boxes.Register(e)
			return err
		},
		unregister: g.boxes.Unregister,
	}
	g.ctl = &controlRequests{host: g.cfg.Host, log: g.log, audit: a, peers: g.peers, interval: g.cfg.PresenceInterval, exec: g.exec,
		caller: g.caller, resolve: func(to string) (target, error) { return g.route.Resolve(to) }, remote: g.remoteRows, heard: g.saveHeard,
		linked: func() bool { return g.br != nil },
		send: func(ctx context.Context, host string, env *envelope.Envelope) error {
			return g.br.PublishControl(ctx, host, env)
		},
		ctx:     func() context.Context { return g.hardCtx },
		closing: func() <-chan struct{} { return g.runCtx.Done() },
	}
	g.policy = newPolicy(g.cfg.Host, g.cfg.AcceptDefault, st, g.reg, g.peers, a, g.metrics) // policy.go
	g.exec.policy = g.policy
	loops := &loopGuard{max: g.cfg.MaxHops, log: g.log, audit: a, metrics: g.metrics, st: st, tell: g.rcpt} // hops.go
	g.urgent = newUrgentRate(g.cfg.UrgentRate, g.log, g.metrics)                                            // urgent.go
	g.in = &intake{
		host: g.cfg.Host, stateDir: dir, st: st, log: g.log, audit: a, metrics: g.metrics,
		reg: g.reg, rdv: g.rdv, caps: g.caps, crash: g.crash, policy: g.policy, loops: loops,
		urgent:        newUrgentArrivals(g.cfg.UrgentRate, g.log, g.metrics),
		kill:          g.boxes.Kill,
		receipt:       g.rcpt.Take,
		answer:        g.onAnswer,
		tooLate:       g.onTooLate,
		ask:           g.liveAdd,
		controlResult: g.ctl.Take,
		traceResult:   func(env *envelope.Envelope) error { return g.tracer.Result(env) },
	}
	g.rcpt.in = g.in // a bounce is stored like any message
	g.route = &router{cfg: g.cfg, st: st, log: g.log, audit: a, metrics: g.metrics,
		reg: g.reg, peers: g.peers, names: g.names, admits: g.admits, caps: g.caps, in: g.in, rcpt: g.rcpt, policy: g.policy,
		loops: loops, pairs: g.pairs, urgent: g.urgent,
		br:     func() *broker.Broker { return g.br },
		admit:  func() *admission { return g.admit },
		caller: g.caller, remote: g.remoteRows, heard: g.saveHeard,
		ctx:     func() context.Context { return g.hardCtx },
		closing: func() <-chan struct{} { return g.runCtx.Done() },
	}
	// fleet-trace and fleet-dlq (trace.go, dlq.go): the broker and the
	// admission are read at each use, set in Run after this
	g.tracer = newTracer(g.cfg.Host, g.log, a, g.reg, g.peers, &g.workers)
	g.tracer.caller = func(token string) (store.Entity, error) {
		b, err := g.caller(token)
		if err != nil {
			return store.Entity{}, err
		}
		return b.snapshot(), nil
	}
	g.tracer.br = func() *broker.Broker { return g.br }
	g.tracer.trusted = func() []string { return g.admit.trustedHosts() }
	g.tracer.ctx = func() context.Context { return g.hardCtx }
	g.tracer.done = func() <-chan struct{} { return g.runCtx.Done() }
	g.dlq = &deadLetters{host: g.cfg.Host, stateDir: dir, maxBody: g.cfg.MaxBody,
		st: st, log: g.log, audit: a, reg: g.reg, caps: g.caps, in: g.in,
		br:    func() *broker.Broker { return g.br },
		admit: func() *admission { return g.admit },
		ctx:   func() context.Context { return g.hardCtx },
		keys: func() *seal.Keyring {
			if g.keys == nil {
				return nil
			}
			return g.keys.Keyring()
		},
		keyHost: func(id string) string { return sealKeyHost(id, g.peers, g.admit) },
	}
	return nil
}

// recoverInflight handles messages whose injection was begun and never
// recorded: the gateway died between pasting and recording. What reached the
// entity is unknowable, so by default ("hold") they are dead-lettered with
// reason "uncertain" for an operator to replay or drop; "reinject" delivers
// them again, accepting a possible duplicate.
func (g *Gateway) recoverInflight() error {
	ids, err := g.st.Inflight()
	if err != nil {
		return err
	}
	for _, id := range ids {
		rec, err := g.st.Record(id)
		if err != nil {
			continue
		}
		if g.cfg.Uncertain == "reinject" {
			g.log.Warn("re-injecting a message whose delivery was cut by a crash", "msg_id", id, "trace_id", rec.TraceID)
			if err := g.st.ClearInflight(id); err != nil {
				return err
			}
			continue
		}
		reason := "uncertain: the gateway stopped while injecting; the entity may or may not have it"
		g.log.Warn("holding a message whose delivery was cut by a crash", "msg_id", id, "trace_id", rec.TraceID)
		if err := g.st.Kill(id, reason, -1); err != nil {
			return err
		}
		g.audit.Write(audit.Line{Event: "dead", TraceID: rec.TraceID, MsgID: id, Recipient: rec.Recipient, Reason: reason})
		g.metrics.Dead(rec.Kind, reason)
	}
	return nil
}

func (g *Gateway) loadEntities() error {
	ents, err := g.st.Entities()
	if err != nil {
		return err
	}
	var foreign []string
	for _, e := range ents {
		if ident.GidHost(e.Gid) != g.cfg.Host {
			foreign = append(foreign, e.Name)
		}
		b := g.boxes.Add(e)
		if e.Mode == "pull" {
			raw, _ := g.st.Launched(e.Gid) // spawned: its process is watched
			g.follow.Load(b, raw)
		}
	}
	if len(foreign) > 0 {
		g.log.Error("entities whose gid does not name this host (made before gids named their host): not on the broker, and their credentials are refused",
			"entities", strings.Join(foreign, ","), "fix", "for each: fleet-roster leave NAME, then join it again")
	}
	return nil
}

// listen opens the socket: private to this user (0600 in a 0700 folder), a
// live gateway on the same path refused, a stale file removed.
func (g *Gateway) listen() error {
	path := g.cfg.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot create the socket folder")
	}
	if err := private.SocketDir(filepath.Dir(path)); err != nil {
		return err
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return fault.New(fault.Conflict, fault.KindGatewayLocked, "another gateway is listening on %s", path).
				WithHint("stop it first, or give this one its own --socket")
		}
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot listen on %s", path)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot make %s private", path)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	g.ln = ln
	// where commands that guess another default socket find this one
	// (config.RecordedSocket); best effort: a command can still be told
	abs, _ := filepath.Abs(path)
	if err := private.WriteFile(config.SocketRecord(g.cfg.StateDir), []byte(abs+"\n"), 0o600); err != nil {
		g.log.Warn("socket path not recorded in the state folder: commands without XDG_RUNTIME_DIR need FLEET_SOCKET", "err", err)
	}
	return nil
}

// janitor prunes the dedup window once an hour.
func (g *Gateway) janitor() {
	defer g.workers.Done()
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		n, err := g.st.Prune(time.Now().Add(-g.cfg.DedupWindow))
		if err != nil {
			g.log.Error("pruning the dedup window", "err", err)
		} else if n > 0 {
			g.log.Info("pruned delivery records past the dedup window", "count", n)
		}
		g.exec.Prune() // control_exec.go
		// dead letters past dead-retention; their records go with the
		// dedup window (the next pass's Prune), never sooner
		if n, err := g.st.PruneDead(time.Now().Add(-g.cfg.DeadRetention)); err != nil {
			g.log.Error("pruning dead letters", "err", err)
		} else if n > 0 {
			g.log.Info("pruned dead letters past dead-retention", "count", n)
		}
		select {
		case <-g.runCtx.Done():
			return
		case <-t.C:
		}
	}
}

// caller returns the entity whose credential (a request's Token) is token.
func (g *Gateway) caller(token string) (*mailbox, error) {
	if token == "" {
		return nil, fault.New(fault.Refused, fault.KindNoCredential, "no credential: this command acts as an entity").
			WithHint("set FLEET_TOKEN, or pass --as NAME for an entity registered on this host")
	}
	gid, secret, err := ident.Parse(token)
	if err != nil {
		return nil, err
	}
	if h := ident.GidHost(gid); h != g.cfg.Host {
		// the credential names its host: say so, rather than "not valid"
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "the credential is one of host %s, not of this host (%s)", h, g.cfg.Host).
			WithHint("run the command on %s, where its entity lives; here, use a credential fleet-roster join printed on %s (or --as NAME)", h, g.cfg.Host)
	}
	b := g.reg.Get(gid)
	if b == nil || !ident.Check(secret, b.snapshot().TokenHash) {
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "credential is not valid on this gateway").
			WithHint("a credential is issued by fleet-roster join and dies with fleet-roster leave")
	}
	return b, nil
}

// crashpoint is the FLEET_CRASHPOINT test hook: at kills the process with
// SIGKILL when it names point. It exists for the kill -9 tests of the
// delivery windows and does nothing otherwise.
type crashpoint string

func (c crashpoint) at(log *slog.Logger, point string) {
	if c != "" && string(c) == point {
		log.Warn("FLEET_CRASHPOINT reached: killing myself", "point", point)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	}
}

func (g *Gateway) String() string { return fmt.Sprintf("gateway %s", g.cfg.Host) }
