// Command benchbroker measures fleet across hosts: real fleet-gw gateways
// on the private RabbitMQ node (scripts/rabbitmq-node.sh), each in its own
// temporary state folder with its own socket, all in one dedicated vhost.
//
//  1. ask: the cross-host ask→answer round trip (asker on h1, an automatic
//     answerer on h2), beside a raw amqp091-go two-hop round trip between two
//     queues (non-persistent, confirms on, manual ack) and a same-host ask
//     (no broker), measured in the same run, in alternating blocks;
//  2. bcast: one fleet-bcast reaching every one of N pull inboxes spread
//     over h1, h2, h3, each held by an OpRecv follow stream, beside a raw
//     persistent confirmed publish to N queues bound to one key;
//  3. presence: heartbeat traffic on bridge.roster (a temporary queue of our
//     own bound with roster.#) and the gateways' resident memory, with 1,000
//     entities on three fresh gateways;
//  4. spawn: fleet-spawn (exec launcher, pull entity) from h1 onto h2, to the
//     new entity's first message delivered through OpRecv.
//
// It creates the vhost (and refuses one that exists), and always stops every
// gateway (SIGTERM, then SIGKILL), every spawned process group and deletes
// the vhost again: on success, on error, on SIGINT/SIGTERM and when the
// overall -timeout passes. Pid files go to -piddir for a wrapper's cleanup
// (scripts/bench-broker.sh). Missed targets are reported, never turned into
// a failing exit status.
//
//	scripts/bench-broker.sh [-asks 300] [-inboxes 200] [-entities 1000] [-phases ask,bcast,spawn,presence]
package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Targets and bounds.
const (
	targetAskRatio = 1.5                    // fleet ask round trip / raw two-hop, at p50 and p99
	maxSocketPath  = 107                    // sun_path minus the NUL
	stopGrace      = 5 * time.Second        // SIGTERM to SIGKILL
	readyTimeout   = 20 * time.Second       // gateway socket and broker connection
	rssSettle      = 500 * time.Millisecond // before reading VmRSS
	ctlTimeout     = 90 * time.Second       // one rabbitmqctl call
	convergeWait   = 90 * time.Second       // roster views and warm-ups
	roundWait      = 30 * time.Second       // one broadcast reaching every inbox
	askTTL         = 5 * time.Second        // one measured ask
	rawWait        = 5 * time.Second        // one raw confirm or delivery
	askBlock       = 25                     // fleet and raw round trips alternate in blocks of this many
	spawnTimeout   = 30 * time.Second       // one fleet-spawn or fleet-stop
	spawnSleep     = 120                    // seconds a spawned command lives at most
)

var (
	flagBin      = flag.String("bin", "bin", "folder holding the fleet-gw binary")
	flagBroker   = flag.String("broker", "", "AMQP URL of the private node, without a vhost (default: the output of -rmq url)")
	flagRMQ      = flag.String("rmq", "scripts/rabbitmq-node.sh", "the private node's script: its url and ctl (add_vhost, set_permissions, delete_vhost) are used")
	flagVhost    = flag.String("vhost", "bench", "vhost to create for the run and delete after it (refused if it exists)")
	flagAsks     = flag.Int("asks", 300, "measured ask round trips (and as many raw two-hop round trips)")
	flagWarmup   = flag.Int("warmup", 20, "unmeasured ask and raw round trips first")
	flagInboxes  = flag.Int("inboxes", 200, "pull inboxes a broadcast must reach, spread over h1, h2, h3")
	flagBcasts   = flag.Int("bcasts", 7, "measured broadcasts (after one warm-up)")
	flagEntities = flag.Int("entities", 1000, "entities over p1, p2, p3 for the presence figures")
	flagInterval = flag.Duration("presence-interval", 5*time.Second, "FLEET_PRESENCE_INTERVAL of every gateway")
	flagWindow   = flag.Duration("window", 30*time.Second, "how long bridge.roster traffic is counted")
	flagSpawns   = flag.Int("spawns", 10, "spawns per profile (one with the default 500ms grace, one with grace 0)")
	flagPhases   = flag.String("phases", "ask,bcast,spawn,presence", "comma-separated phases to run")
	flagDir      = flag.String("dir", "", "parent of the temporary folder (default $TMPDIR); keep it short: sockets live there")
	flagPiddir   = flag.String("piddir", "", "write gw-*.pid (gateways), spawned.pids (spawned process groups) and vhost (while it exists) here, for a wrapper's cleanup")
	flagKeep     = flag.Bool("keep", false, "keep the temporary folder (gateway logs, state)")
	flagTimeout  = flag.Duration("timeout", 20*time.Minute, "overall bound: clean up and exit 3 when it passes")
)

func main() {
	flag.Parse()
	benchkit.Main("benchbroker", "cleaning up (gateways, spawned processes, vhost)", *flagTimeout, run)
}

// ---- the private node: vhost ----

// rmq runs the node script with args (bounded; its whole process group is
// killed on timeout or when we die).
func rmq(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, *flagRMQ, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // a daemon (epmd) keeping our pipe open
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", *flagRMQ, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// createVhost creates the run's vhost (refusing one that exists: it may be
// someone else's) and registers its deletion.
func createVhost(name string) error {
	out, err := rmq("ctl", "list_vhosts", "name")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == name {
			return fmt.Errorf("vhost %q exists already (left by an earlier run, or someone else's): delete it with %s ctl delete_vhost %s, or pass another -vhost",
				name, *flagRMQ, name)
		}
	}
	if _, err := rmq("ctl", "add_vhost", name); err != nil {
		return err
	}
	marker := ""
	if *flagPiddir != "" {
		marker = filepath.Join(*flagPiddir, "vhost")
		_ = os.WriteFile(marker, []byte(name+"\n"), 0o600)
	}
	benchkit.AtCleanup(func() {
		if _, err := rmq("ctl", "delete_vhost", name); err != nil {
			fmt.Fprintf(os.Stderr, "benchbroker: deleting vhost %s: %v\n", name, err)
			return // the wrapper tries again from the marker
		}
		if marker != "" {
			_ = os.Remove(marker)
		}
	})
	_, err = rmq("ctl", "set_permissions", "-p", name, "guest", ".*", ".*", ".*")
	return err
}

// ---- the gateway processes ----

type gateway struct {
	host    string
	dir     string
	state   string
	socket  string
	env     []string
	cmd     *exec.Cmd
	exited  chan struct{}
	log     string
	pidfile string
	version string // fleet-gw's, from its hello
}

// baseEnv is the environment minus anything that would point a fleet
// command at another gateway or config file.
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLEET_") || k == "XDG_CONFIG_HOME" || k == "XDG_RUNTIME_DIR" || k == "XDG_STATE_HOME" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startGateway starts fleet-gw run for host in root/tag-host and waits for
// its socket and its broker connection.
func startGateway(bin, root, tag, host, brokerURL, conf string, interval time.Duration) (*gateway, error) {
	dir := filepath.Join(root, tag+"-"+host)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	g := &gateway{
		host:   host,
		dir:    dir,
		state:  filepath.Join(dir, "state"),
		socket: filepath.Join(dir, "gw.sock"),
		log:    filepath.Join(dir, "gw.log"),
		exited: make(chan struct{}),
	}
	if len(g.socket) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is too long for a unix socket; use a shorter -dir", g.socket)
	}
	g.env = append(baseEnv(),
		"FLEET_HOST="+host,
		"FLEET_STATE_DIR="+g.state,
		"FLEET_SOCKET="+g.socket,
		"FLEET_BROKER="+brokerURL,
		"FLEET_PRESENCE_INTERVAL="+interval.String(),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "no-config"),
	)
	if conf != "" {
		g.env = append(g.env, "FLEET_CONFIG="+conf)
	}
	// As deployed (design decision 6): every gateway checks every other
	// one's signature against a trust file of all the run's hosts.
	trustFile := filepath.Join(root, "trust")
	g.env = append(g.env, "FLEET_TRUST_FILE="+trustFile)
	key := exec.Command(filepath.Join(bin, "fleet-gw"), "key")
	key.Env = g.env
	line, err := key.Output()
	if err != nil {
		return nil, fmt.Errorf("fleet-gw key for %s: %w", host, err)
	}
	tf, err := os.OpenFile(trustFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = tf.Write(line)
	if cerr := tf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(g.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	g.cmd = exec.Command(filepath.Join(bin, "fleet-gw"), "run")
	g.cmd.Env = g.env
	g.cmd.Dir = dir
	g.cmd.Stdout = logf
	g.cmd.Stderr = logf
	// If this process dies without cleaning up, the kernel kills the gateway.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		g.cmd.Wait()
		logf.Close()
		close(g.exited)
	}()
	benchkit.AtCleanup(g.stop)
	if *flagPiddir != "" {
		g.pidfile = filepath.Join(*flagPiddir, "gw-"+tag+"-"+host+".pid")
		if err := os.WriteFile(g.pidfile, []byte(strconv.Itoa(g.cmd.Process.Pid)+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		c, err := api.Dial(g.socket)
		if err == nil {
			g.version = c.Hello.Version
			c.Close()
			break
		}
		if err := g.alive(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fleet-gw %s not ready after %v: %v; its log:\n%s", host, readyTimeout, err, benchkit.Tail(g.log))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for !strings.Contains(readFile(g.log), "broker connected") {
		if err := g.alive(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fleet-gw %s: no broker connection after %v; its log:\n%s", host, readyTimeout, benchkit.Tail(g.log))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return g, nil
}

func (g *gateway) pid() int { return g.cmd.Process.Pid }

// stop sends SIGTERM, waits for the drain, then SIGKILLs. Idempotent.
func (g *gateway) stop() {
	select {
	case <-g.exited:
	default:
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.exited:
		case <-time.After(stopGrace):
			_ = g.cmd.Process.Kill()
			<-g.exited
		}
	}
	if g.pidfile != "" {
		_ = os.Remove(g.pidfile)
	}
}

func (g *gateway) alive() error {
	select {
	case <-g.exited:
		return fmt.Errorf("fleet-gw %s exited; its log:\n%s", g.host, benchkit.Tail(g.log))
	default:
		return nil
	}
}

// startSet starts one gateway per host, one after the other.
func startSet(bin, root, tag string, hosts []string, brokerURL, conf string, interval time.Duration) ([]*gateway, error) {
	var gws []*gateway
	for _, h := range hosts {
		g, err := startGateway(bin, root, tag, h, brokerURL, conf, interval)
		if err != nil {
			return nil, err
		}
		gws = append(gws, g)
	}
	return gws, nil
}

// stopSet stops gateways in parallel.
func stopSet(gws []*gateway) {
	var wg sync.WaitGroup
	for _, g := range gws {
		wg.Add(1)
		go func() { defer wg.Done(); g.stop() }()
	}
	wg.Wait()
}

func (g *gateway) memory() (benchkit.Memory, error) { return benchkit.ReadMemory(g.pid()) }

// cpu returns the gateway's user+system CPU time so far (/proc/PID/stat).
func (g *gateway) cpu() time.Duration { return benchkit.ProcCPU(g.pid()) }

// brokerCPU is the CPU time of the RabbitMQ node (beam.smp) so far, found
// through its pid file; 0 when unknown.
func brokerCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	return benchkit.ProcCPU(pid)
}

func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// ---- helpers ----

func dial(g *gateway, token string) (*api.Client, error) {
	c, err := api.Dial(g.socket)
	if err != nil {
		return nil, err
	}
	c.Token = token
	return c, nil
}

func join(c *api.Client, name string) (string, error) {
	resp, err := c.Call(&api.Request{Op: api.OpJoin, Name: name, Mode: "pull"})
	if err != nil {
		return "", fmt.Errorf("join %s: %w", name, err)
	}
	if resp.Token == "" {
		return "", fmt.Errorf("join %s: no credential in the reply", name)
	}
	return resp.Token, nil
}

// joinMany registers names on g as pull entities over `conns` connections
// and returns their credentials, in the order of names.
func joinMany(g *gateway, names []string, conns int) ([]string, error) {
	toks := make([]string, len(names))
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl, err := dial(g, "")
			if err != nil {
				errs[c] = err
				return
			}
			defer cl.Close()
			for i := c; i < len(names); i += conns {
				if toks[i], err = join(cl, names[i]); err != nil {
					errs[c] = err
					return
				}
			}
		}(c)
	}
	wg.Wait()
	return toks, errors.Join(errs...)
}

// waitRoster polls g's roster view until ok says so, at most d.
func waitRoster(g *gateway, d time.Duration, what string, ok func([]api.EntityRow) bool) error {
	c, err := dial(g, "")
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		resp, err := c.Call(&api.Request{Op: api.OpRoster})
		if err != nil {
			return err
		}
		if ok(resp.Entities) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: roster view of %s not there after %v (%d rows)", what, g.host, d, len(resp.Entities))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func hasEntity(name, host string) func([]api.EntityRow) bool {
	return func(rows []api.EntityRow) bool {
		for _, r := range rows {
			if r.Name == name && r.Host == host {
				return true
			}
		}
		return false
	}
}

func p5099(d []time.Duration) string {
	s := benchkit.Sorted(d)
	return fmt.Sprintf("p50 %s  p99 %s", benchkit.Ms(benchkit.Pct(s, 50)), benchkit.Ms(benchkit.Pct(s, 99)))
}

// ---- 1. ask round trip, and the raw two-hop baseline ----

// answerer answers every ASK delivered to it: a recv --follow stream hands
// the asks to workers (each with its own connection) and acks at once.
type answerer struct {
	mu      sync.Mutex
	arrived map[string]time.Time // ask msg id -> when the recv stream delivered it
	ids     chan string
	lat     []time.Duration // answer send round trips (until the asker's gateway said "answered")
	states  map[string]int
	errs    []error
	other   int // deliveries that were not asks
	dropped int
	done    sync.WaitGroup
}

func startAnswerer(g *gateway, token string, workers int) (*answerer, func(), error) {
	a := &answerer{arrived: map[string]time.Time{}, ids: make(chan string, 4096), states: map[string]int{}}
	rc, err := dial(g, token)
	if err != nil {
		return nil, nil, err
	}
	if err := rc.Send(&api.Request{Op: api.OpRecv, Follow: true}); err != nil {
		rc.Close()
		return nil, nil, err
	}
	var clients []*api.Client
	for i := 0; i < workers; i++ {
		c, err := dial(g, token)
		if err != nil {
			rc.Close()
			for _, c := range clients {
				c.Close()
			}
			return nil, nil, err
		}
		clients = append(clients, c)
	}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			resp, err := rc.Read()
			if err != nil || resp.End {
				return
			}
			now := time.Now()
			acks := make([]string, 0, len(resp.Batch))
			for _, d := range resp.Batch {
				acks = append(acks, d.Envelope.MsgID)
				a.mu.Lock()
				if d.Envelope.Kind == envelope.Ask {
					a.arrived[d.Envelope.MsgID] = now
					select {
					case a.ids <- d.Envelope.MsgID:
					default:
						a.dropped++
					}
				} else {
					a.other++
				}
				a.mu.Unlock()
			}
			if err := rc.Send(&api.Request{Op: api.OpAck, Acks: acks}); err != nil {
				return
			}
		}
	}()
	for _, c := range clients {
		a.done.Add(1)
		go func(c *api.Client) {
			defer a.done.Done()
			for id := range a.ids {
				t := time.Now()
				resp, err := c.Call(&api.Request{Op: api.OpSend, AnswerTo: id, Body: "ok"})
				d := time.Since(t)
				a.mu.Lock()
				if err != nil {
					a.errs = append(a.errs, err)
				} else {
					a.lat = append(a.lat, d)
					if resp.Sent != nil {
						a.states[resp.Sent.State]++
					}
				}
				a.mu.Unlock()
			}
		}(c)
	}
	stop := func() {
		rc.Close()
		<-recvDone
		close(a.ids)
		a.done.Wait()
		for _, c := range clients {
			c.Close()
		}
	}
	return a, stop, nil
}

func (a *answerer) arrivedAt(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.arrived[id]
	return t, ok
}

// askOnce asks once, on a connection of its own (the gateway serves one ask
// per connection, as one fleet-ask), and returns the round trip from OpAsk
// to the ANSWER frame, the time to the Sent frame (the asker's gateway
// published it and the broker confirmed), the ask leg (until the
// answerer's recv stream had it) and the dial+hello before it (not in the
// round trip).
func askOnce(g *gateway, token string, a *answerer, to string) (rt, sent, leg1, dialT time.Duration, err error) {
	td := time.Now()
	c, err := dial(g, token)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer c.Close()
	t0 := time.Now()
	dialT = t0.Sub(td)
	resp, err := c.Call(&api.Request{Op: api.OpAsk, To: to, Body: "are you there?", TimeoutMS: askTTL.Milliseconds()})
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("ask: %w", err)
	}
	t1 := time.Now()
	if resp.Sent == nil {
		return 0, 0, 0, 0, errors.New("ask: no Sent frame")
	}
	ans, err := c.Read()
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("ask %s: %w", resp.Sent.MsgID, err)
	}
	t2 := time.Now()
	if len(ans.Batch) != 1 || ans.Batch[0].Envelope == nil || ans.Batch[0].Envelope.Kind != envelope.Answer ||
		ans.Batch[0].Envelope.InReplyTo != resp.Sent.MsgID {
		return 0, 0, 0, 0, fmt.Errorf("ask %s: the second frame is not its ANSWER: %+v", resp.Sent.MsgID, ans.Batch)
	}
	ta, ok := a.arrivedAt(resp.Sent.MsgID)
	if !ok {
		return 0, 0, 0, 0, fmt.Errorf("ask %s answered but never seen by the answerer", resp.Sent.MsgID)
	}
	return t2.Sub(t0), t1.Sub(t0), ta.Sub(t0), dialT, nil
}

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

type askResult struct {
	n                  int
	rt, sent, leg1     []time.Duration
	dial               []time.Duration // dial+hello before each ask (not in rt)
	raw, rawLeg1       []time.Duration
	failures           []error
	answerLat          []time.Duration
	answerStates       map[string]int
	answerOther        int
	answerErrs         int
	envBytes           int
	sign, verify       time.Duration   // p50 of crypto/ed25519 over one encoded ASK, in this process
	local              []time.Duration // ask round trips on one gateway (h2 to h2): no broker
	gwCPU              map[string]time.Duration
	fleetWall, rawWall time.Duration
}

// edTimes measures crypto/ed25519 signing and verifying n bytes here (the
// gateways sign and verify with it, once per message each way): p50 of 500.
func edTimes(n int) (sign, verify time.Duration) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return 0, 0
	}
	msg := bytes.Repeat([]byte("a"), max(n, 1))
	var st, vt []time.Duration
	for range 500 {
		t := time.Now()
		sig := ed25519.Sign(priv, msg)
		st = append(st, time.Since(t))
		t = time.Now()
		ed25519.Verify(pub, msg, sig)
		vt = append(vt, time.Since(t))
	}
	return benchkit.Pct(benchkit.Sorted(st), 50), benchkit.Pct(benchkit.Sorted(vt), 50)
}

func askPhase(gws []*gateway, vhostURL string, bpid int) (*askResult, error) {
	h1, h2 := gws[0], gws[1]
	fmt.Printf("== 1. cross-host ask -> answer round trip (asker@%s, answerer@%s, %d measured, %d warm-up), raw two-hop beside it\n",
		h1.host, h2.host, *flagAsks, *flagWarmup)
	admin1, err := dial(h1, "")
	if err != nil {
		return nil, err
	}
	defer admin1.Close()
	admin2, err := dial(h2, "")
	if err != nil {
		return nil, err
	}
	defer admin2.Close()
	askTok, err := join(admin1, "asker")
	if err != nil {
		return nil, err
	}
	ansTok, err := join(admin2, "answerer")
	if err != nil {
		return nil, err
	}
	localTok, err := join(admin2, "localasker") // asks the answerer on its own host: no broker
	if err != nil {
		return nil, err
	}
	if err := waitRoster(h1, convergeWait, "ask", hasEntity("answerer", h2.host)); err != nil {
		return nil, err
	}
	if err := waitRoster(h2, convergeWait, "ask", hasEntity("asker", h1.host)); err != nil {
		return nil, err
	}
	a, stopAns, err := startAnswerer(h2, ansTok, 2)
	if err != nil {
		return nil, err
	}
	stopAnswerer := sync.OnceFunc(stopAns)
	defer stopAnswerer()
	to := "answerer"

	// the raw baseline carries a body the size of a real ASK envelope
	sample := envelope.New(envelope.Ask, envelope.Party{Gid: envelope.NewID(), Name: "asker", Host: h1.host},
		envelope.Party{Gid: envelope.NewID(), Name: "answerer", Host: h2.host}, "are you there?")
	sample.TurnID, sample.Expires = envelope.NewID(), time.Now().Add(askTTL).UTC()
	body, err := envelope.Encode(sample)
	if err != nil {
		return nil, err
	}
	raw, err := newRawPair(vhostURL, body)
	if err != nil {
		return nil, err
	}
	defer raw.close()

	res := &askResult{n: *flagAsks, envBytes: len(body), gwCPU: map[string]time.Duration{}}
	// warm-up: the first asks may race the inbox consumers; tolerated
	okWarm, tries := 0, 0
	for okWarm < *flagWarmup {
		tries++
		if tries > *flagWarmup+50 {
			return nil, fmt.Errorf("ask warm-up: only %d of %d tries answered; h1 log:\n%s", okWarm, tries-1, benchkit.Tail(h1.log))
		}
		if _, _, _, _, err := askOnce(h1, askTok, a, to); err != nil {
			fmt.Printf("  warm-up ask failed (retried): %v\n", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if _, _, err := raw.once(); err != nil {
			fmt.Printf("  warm-up raw round trip failed (retried): %v\n", err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		okWarm++
	}
	a.mu.Lock()
	a.lat, a.states, a.other, a.errs, a.dropped = nil, map[string]int{}, 0, nil, 0
	a.mu.Unlock()

	// CPU is counted around the fleet blocks and the raw blocks apart
	var gwCPU [3]time.Duration
	var fleetBroker, fleetSelf, rawBroker, rawSelf time.Duration
	for done := 0; done < *flagAsks; {
		k := min(askBlock, *flagAsks-done)
		var c0 [3]time.Duration
		for i, g := range gws {
			c0[i] = g.cpu()
		}
		b0, s0 := brokerCPU(bpid), benchkit.SelfCPU()
		t := time.Now()
		for i := 0; i < k; i++ {
			rt, sent, leg1, dt, err := askOnce(h1, askTok, a, to)
			if err != nil {
				res.failures = append(res.failures, err)
				if len(res.failures) > *flagAsks/10+1 {
					return nil, fmt.Errorf("too many failed asks (%d): last: %w", len(res.failures), err)
				}
				continue
			}
			res.rt, res.sent, res.leg1 = append(res.rt, rt), append(res.sent, sent), append(res.leg1, leg1)
			res.dial = append(res.dial, dt)
		}
		res.fleetWall += time.Since(t)
		for i, g := range gws {
			gwCPU[i] += g.cpu() - c0[i]
		}
		fleetBroker += brokerCPU(bpid) - b0
		fleetSelf += benchkit.SelfCPU() - s0
		b0, s0 = brokerCPU(bpid), benchkit.SelfCPU()
		t = time.Now()
		for i := 0; i < k; i++ {
			rt, leg1, err := raw.once()
			if err != nil {
				return nil, fmt.Errorf("raw baseline: %w", err)
			}
			res.raw, res.rawLeg1 = append(res.raw, rt), append(res.rawLeg1, leg1)
		}
		res.rawWall += time.Since(t)
		rawBroker += brokerCPU(bpid) - b0
		rawSelf += benchkit.SelfCPU() - s0
		for i := 0; i < k; i++ {
			rt, _, _, _, err := askOnce(h2, localTok, a, to)
			if err != nil {
				return nil, fmt.Errorf("local ask: %w", err)
			}
			res.local = append(res.local, rt)
		}
		done += k
	}
	for i, g := range gws {
		res.gwCPU[g.host] = gwCPU[i]
	}
	time.Sleep(200 * time.Millisecond) // the last answer's send returns
	a.mu.Lock()
	res.answerLat = append([]time.Duration(nil), a.lat...)
	res.answerStates = copyCounts(a.states)
	res.answerOther = a.other
	res.answerErrs = len(a.errs) + a.dropped
	a.mu.Unlock()

	leg2 := make([]time.Duration, len(res.rt))
	for i := range res.rt {
		leg2[i] = res.rt[i] - res.leg1[i]
	}
	rawLeg2 := make([]time.Duration, len(res.raw))
	for i := range res.raw {
		rawLeg2[i] = res.raw[i] - res.rawLeg1[i]
	}
	fmt.Printf("fleet ask round trip (OpAsk on h1 -> ANSWER frame on h1): %s  (n=%d, failed %d)\n", p5099(res.rt), len(res.rt), len(res.failures))
	fmt.Printf("   OpAsk -> Sent frame (h1 published, broker confirmed):  %s\n", p5099(res.sent))
	fmt.Printf("   leg 1: OpAsk -> ASK in the answerer's recv stream on h2: %s\n", p5099(res.leg1))
	fmt.Printf("   leg 2: ASK in recv stream -> ANSWER frame on h1:       %s  (answerer's OpSend --answer on another connection)\n", p5099(leg2))
	fmt.Printf("   (before each ask, not in the round trip: dial+hello on a fresh connection %s)\n", p5099(res.dial))
	fmt.Printf("   answerer's OpSend --answer call (cross-host and same-host asks): %s; states %v; failed %d; non-ask deliveries %d\n",
		p5099(res.answerLat), res.answerStates, res.answerErrs, res.answerOther)
	fmt.Printf("raw two-hop (amqp091-go, %d-byte body = one encoded ASK, persistent=false, confirms, manual ack): %s  (n=%d)\n",
		res.envBytes, p5099(res.raw), len(res.raw))
	fmt.Printf("   leg 1: publish on A -> delivered to B: %s;  leg 2: B -> delivered to A: %s\n", p5099(res.rawLeg1), p5099(rawLeg2))
	rs, fs := benchkit.Sorted(res.raw), benchkit.Sorted(res.rt)
	fmt.Printf("ratio fleet/raw: p50 %.2fx  p99 %.2fx  (target <= %.1fx)\n",
		ratio(benchkit.Pct(fs, 50), benchkit.Pct(rs, 50)), ratio(benchkit.Pct(fs, 99), benchkit.Pct(rs, 99)), targetAskRatio)
	fmt.Printf("same-host ask round trip (localasker@%s -> answerer@%s, no broker; same answerer): %s  (n=%d)\n", h2.host, h2.host, p5099(res.local), len(res.local))
	res.sign, res.verify = edTimes(res.envBytes)
	crypto := 2 * (res.sign + res.verify)
	fmt.Printf("signatures on the round trip (decision 6: the ASK and the ANSWER each signed and verified): 2 x (sign p50 %s + verify p50 %s) = %s,\n",
		benchkit.Ms(res.sign), benchkit.Ms(res.verify), benchkit.Ms(crypto))
	fmt.Printf("   %.0f%% of the raw p50; raw p50 + signatures alone = %.2fx raw, before any socket hop or routing\n",
		100*float64(crypto)/float64(benchkit.Pct(rs, 50)), ratio(benchkit.Pct(rs, 50)+crypto, benchkit.Pct(rs, 50)))
	var cpus []string
	for _, g := range gws {
		cpus = append(cpus, fmt.Sprintf("%s %.0f µs", g.host, perOp(res.gwCPU[g.host], len(res.rt))))
	}
	fmt.Printf("CPU per cross-host ask (fleet blocks only; ticks of 10ms over %d asks): gateways %s; broker %.0f µs; bench process %.0f µs\n",
		len(res.rt), strings.Join(cpus, ", "), perOp(fleetBroker, len(res.rt)), perOp(fleetSelf, len(res.rt)))
	fmt.Printf("CPU per raw two-hop round trip: broker %.0f µs; bench process %.0f µs\n", perOp(rawBroker, len(res.raw)), perOp(rawSelf, len(res.raw)))
	fmt.Printf("wall: %d fleet asks in %v, %d raw round trips in %v\n\n", len(res.rt), res.fleetWall.Round(time.Millisecond), len(res.raw), res.rawWall.Round(time.Millisecond))
	// the broadcasts that follow go to "all": these three leave first
	stopAnswerer()
	for _, l := range []struct {
		c    *api.Client
		name string
	}{{admin1, "asker"}, {admin2, "answerer"}, {admin2, "localasker"}} {
		if _, err := l.c.Call(&api.Request{Op: api.OpLeave, Name: l.name}); err != nil {
			return nil, fmt.Errorf("leave %s: %w", l.name, err)
		}
	}
	return res, nil
}

func perOp(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return float64(a) / float64(b)
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// ---- 2. broadcast to every inbox ----

type bround struct {
	at   []time.Time // per receiver
	got  int
	dups int
	done chan struct{}
}

type tracker struct {
	mu     sync.Mutex
	n      int
	rounds map[string]*bround
}

func (t *tracker) get(id string) *bround {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.getLocked(id)
}

func (t *tracker) getLocked(id string) *bround {
	r := t.rounds[id]
	if r == nil {
		r = &bround{at: make([]time.Time, t.n), done: make(chan struct{})}
		t.rounds[id] = r
	}
	return r
}

func (t *tracker) arrive(id string, idx int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.getLocked(id)
	if !r.at[idx].IsZero() {
		r.dups++
		return
	}
	r.at[idx] = at
	r.got++
	if r.got == t.n {
		close(r.done)
	}
}

// missing says how many receivers of each host still lack round r.
func (t *tracker) missing(r *bround, hostOf []string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[string]int{}
	for i, at := range r.at {
		if at.IsZero() {
			m[hostOf[i]]++
		}
	}
	return fmt.Sprint(m)
}

type bcastRound struct {
	call, all time.Duration
	perHost   map[string]time.Duration
	median    time.Duration
	local     int
	dups      int
}

type bcastResult struct {
	failed  []string        // broadcasts that failed or did not reach every inbox
	rawConf []time.Duration // raw fan-out: publish -> confirm
	rawAll  []time.Duration // raw fan-out: publish -> in every queue's consumer
	rawCPU  time.Duration   // broker CPU in the raw rounds
	rounds  []bcastRound
	inboxes int
	spread  string
	gwCPU   map[string]time.Duration
	bcpu    time.Duration
	wall    time.Duration
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

func bcastPhase(gws []*gateway, vhostURL string, bpid int) (*bcastResult, error) {
	n := *flagInboxes
	var spread []string
	for i, g := range gws {
		spread = append(spread, fmt.Sprintf("%d@%s", benchkit.Split(n, len(gws), i), g.host))
	}
	fmt.Printf("== 2. fleet-bcast to %d pull inboxes (%s; sender bcaster@%s, not a member), %d measured after 1 warm-up\n",
		n, strings.Join(spread, "/"), gws[0].host, *flagBcasts)
	admin, err := dial(gws[0], "")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	btok, err := join(admin, "bcaster")
	if err != nil {
		return nil, err
	}
	hostOf := make([]string, n)
	gwOf := make([]*gateway, n)
	toks := make([]string, n)
	joinStart := time.Now()
	idx := 0
	var jerrs []error
	var jwg sync.WaitGroup
	var jmu sync.Mutex
	for gi, g := range gws {
		k := benchkit.Split(n, len(gws), gi)
		names := make([]string, k)
		base := idx
		for j := 0; j < k; j++ {
			names[j] = fmt.Sprintf("r%03d", idx)
			hostOf[idx], gwOf[idx] = g.host, g
			idx++
		}
		jwg.Add(1)
		go func() {
			defer jwg.Done()
			t, err := joinMany(g, names, 4)
			jmu.Lock()
			defer jmu.Unlock()
			if err != nil {
				jerrs = append(jerrs, err)
				return
			}
			copy(toks[base:], t)
		}()
	}
	jwg.Wait()
	if err := errors.Join(jerrs...); err != nil {
		return nil, err
	}
	fmt.Printf("registered %d receivers in %v\n", n, time.Since(joinStart).Round(time.Millisecond))

	tr := &tracker{n: n, rounds: map[string]*bround{}}
	clients := make([]*api.Client, 0, n)
	var rwg sync.WaitGroup
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		rwg.Wait()
	}()
	for i := 0; i < n; i++ {
		c, err := dial(gwOf[i], toks[i])
		if err != nil {
			return nil, fmt.Errorf("recv stream %d: %w", i, err)
		}
		clients = append(clients, c)
		if err := c.Send(&api.Request{Op: api.OpRecv, Follow: true}); err != nil {
			return nil, err
		}
		rwg.Add(1)
		go func(i int, c *api.Client) {
			defer rwg.Done()
			for {
				resp, err := c.Read()
				if err != nil || resp.End {
					return
				}
				now := time.Now()
				acks := make([]string, 0, len(resp.Batch))
				for _, d := range resp.Batch {
					acks = append(acks, d.Envelope.MsgID)
					if d.Envelope.Kind == envelope.Broadcast {
						tr.arrive(d.Envelope.MsgID, i, now)
					}
				}
				if err := c.Send(&api.Request{Op: api.OpAck, Acks: acks}); err != nil {
					return
				}
			}
		}(i, c)
	}
	bc, err := dial(gws[0], btok)
	if err != nil {
		return nil, err
	}
	defer bc.Close()

	// warm-up: every inbox bound and every stream attached; bounded
	warmStart := time.Now()
	var wr *bround
	for {
		resp, err := bc.Call(&api.Request{Op: api.OpBcast, Body: "warm-up"})
		if err == nil {
			wr = tr.get(resp.Sent.MsgID)
			break
		}
		if time.Since(warmStart) > convergeWait {
			return nil, fmt.Errorf("warm-up broadcast: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case <-wr.done:
	case <-time.After(convergeWait):
		return nil, fmt.Errorf("warm-up broadcast: not in every inbox after %v; missing per host: %s", convergeWait, tr.missing(wr, hostOf))
	}
	fmt.Printf("warm-up broadcast reached all %d in %v\n", n, time.Since(warmStart).Round(time.Millisecond))
	sample := envelope.New(envelope.Broadcast, envelope.Party{Gid: envelope.NewID(), Name: "bcaster", Host: gws[0].host},
		envelope.Party{Group: "all"}, "broadcast 0")
	body, err := envelope.Encode(sample)
	if err != nil {
		return nil, err
	}
	raw, err := newRawFanout(vhostURL, n, len(gws), body)
	if err != nil {
		return nil, err
	}
	defer raw.close()
	if _, _, err := raw.once(); err != nil { // warm-up
		return nil, err
	}

	res := &bcastResult{inboxes: n, spread: strings.Join(spread, "/"), gwCPU: map[string]time.Duration{}}
	cpu0 := map[string]time.Duration{}
	for _, g := range gws {
		cpu0[g.host] = g.cpu()
	}
	wall0 := time.Now()
	for k := 0; k < *flagBcasts; k++ {
		time.Sleep(500 * time.Millisecond) // quiet between rounds
		bc0 := brokerCPU(bpid)
		t0 := time.Now()
		resp, err := bc.Call(&api.Request{Op: api.OpBcast, Body: fmt.Sprintf("broadcast %d", k)})
		if err != nil {
			if err := res.fail(fmt.Sprintf("broadcast %d after %v: %v", k, time.Since(t0).Round(time.Millisecond), err)); err != nil {
				return nil, err
			}
			continue
		}
		call := time.Since(t0)
		r := tr.get(resp.Sent.MsgID)
		select {
		case <-r.done:
		case <-time.After(roundWait):
			if err := res.fail(fmt.Sprintf("broadcast %d: not in every inbox after %v; missing per host: %s", k, roundWait, tr.missing(r, hostOf))); err != nil {
				return nil, err
			}
			continue
		}
		res.bcpu += brokerCPU(bpid) - bc0
		tr.mu.Lock()
		br := bcastRound{call: call, perHost: map[string]time.Duration{}, local: resp.Count, dups: r.dups}
		var all []time.Duration
		for i, at := range r.at {
			d := at.Sub(t0)
			all = append(all, d)
			if d > br.perHost[hostOf[i]] {
				br.perHost[hostOf[i]] = d
			}
		}
		tr.mu.Unlock()
		all = benchkit.Sorted(all)
		br.all, br.median = all[len(all)-1], benchkit.Pct(all, 50)
		res.rounds = append(res.rounds, br)
		var ph []string
		for _, g := range gws {
			ph = append(ph, fmt.Sprintf("%s %s", g.host, benchkit.Ms(br.perHost[g.host])))
		}
		fmt.Printf("broadcast %d: all %d inboxes in %s  (OpBcast call %s, %d served locally; median inbox %s; last per host: %s; duplicates %d)\n",
			k, n, benchkit.Ms(br.all), benchkit.Ms(br.call), br.local, benchkit.Ms(br.median), strings.Join(ph, ", "), br.dups)
		time.Sleep(500 * time.Millisecond)
		c0 := brokerCPU(bpid)
		rconf, rall, err := raw.once()
		if err != nil {
			return nil, err
		}
		res.rawCPU += brokerCPU(bpid) - c0
		res.rawConf, res.rawAll = append(res.rawConf, rconf), append(res.rawAll, rall)
		fmt.Printf("   raw fan-out %d: one persistent confirmed publish to %d queues: confirmed in %s, in every queue's consumer in %s\n", k, n, benchkit.Ms(rconf), benchkit.Ms(rall))
	}
	res.wall = time.Since(wall0)
	if len(res.rounds) == 0 || len(res.rawAll) == 0 {
		return nil, errors.New("no broadcast reached every inbox")
	}
	for _, g := range gws {
		res.gwCPU[g.host] = g.cpu() - cpu0[g.host]
	}
	var cpus []string
	for _, g := range gws {
		cpus = append(cpus, fmt.Sprintf("%s %v", g.host, res.gwCPU[g.host].Round(10*time.Millisecond)))
	}
	fmt.Printf("gateway CPU over the %d rounds (%v wall, incl. the raw rounds and 500ms pauses): %s; broker CPU per fleet broadcast %v, per raw fan-out %v\n",
		*flagBcasts, res.wall.Round(time.Millisecond), strings.Join(cpus, ", "),
		(res.bcpu / time.Duration(len(res.rounds))).Round(time.Millisecond), (res.rawCPU / time.Duration(len(res.rawAll))).Round(time.Millisecond))
	alls := res.alls()
	fmt.Printf("fleet-bcast to all %d inboxes: median %s  max %s  (over %d broadcasts)\n", n, benchkit.Ms(benchkit.Pct(alls, 50)), benchkit.Ms(alls[len(alls)-1]), len(alls))
	fmt.Printf("raw fan-out to %d queues:      median %s  max %s  (confirm p50 %s)\n\n", n, benchkit.Ms(benchkit.Pct(benchkit.Sorted(res.rawAll), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(res.rawAll), 100)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(res.rawConf), 50)))
	return res, nil
}

// fail notes a failed broadcast; more than two end the phase.
func (r *bcastResult) fail(what string) error {
	r.failed = append(r.failed, what)
	fmt.Printf("   %s: FAILED\n", what)
	if len(r.failed) > 2 {
		return fmt.Errorf("%d broadcasts failed, last: %s", len(r.failed), what)
	}
	return nil
}

func (r *bcastResult) alls() []time.Duration {
	var out []time.Duration
	for _, x := range r.rounds {
		out = append(out, x.all)
	}
	return benchkit.Sorted(out)
}

// ---- 4. spawn to first delivered message ----

type spawnSeries struct {
	profile string
	grace   string
	total   []time.Duration // OpSpawn call -> first message out of OpRecv
	spawn   []time.Duration // the OpSpawn call
	deliver []time.Duration // spawn returned -> message out of OpRecv (credential read, recv opened, send, recv)
	send    []time.Duration // the OpSend call from h1
	stop    []time.Duration // the OpStop call
	failed  []string        // spawns that failed (each retried under a new name)
}

// spawnCommand is the profile's command: it notes its pid (the leader of
// its process group: the exec launcher gives it its own session) for the
// cleanup, then sleeps a bounded time.
func spawnCommand(pidfile string) string {
	return fmt.Sprintf("echo $$ >> %s; exec sleep %d", pidfile, spawnSleep)
}

// killSpawned ends the process groups listed in pidfile whose leader is
// still our sleep: SIGTERM, then SIGKILL.
func killSpawned(pidfile string) {
	var pids []int
	for _, f := range strings.Fields(readFile(pidfile)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		cmdline := strings.ReplaceAll(readFile(fmt.Sprintf("/proc/%d/cmdline", pid)), "\x00", " ")
		if strings.HasPrefix(cmdline, "sleep "+strconv.Itoa(spawnSleep)) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}

func spawnPhase(gws []*gateway) ([]*spawnSeries, error) {
	h1, h2 := gws[0], gws[1]
	fmt.Printf("== 4. fleet-spawn from %s onto %s (exec launcher, pull entity, command sleeps) -> first message out of OpRecv; %d per profile\n",
		h1.host, h2.host, *flagSpawns)
	admin, err := dial(h1, "")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	tok, err := join(admin, "boss")
	if err != nil {
		return nil, err
	}
	bc, err := dial(h1, tok)
	if err != nil {
		return nil, err
	}
	defer bc.Close()
	var out []*spawnSeries
	for _, p := range []struct{ name, grace, prefix string }{{"bench", "500ms (default)", "spa"}, {"bench0", "0", "spb"}} {
		s := &spawnSeries{profile: p.name, grace: p.grace}
		maxFailed := max(2, *flagSpawns/3)
		for i := 0; len(s.total) < *flagSpawns; i++ {
			name := fmt.Sprintf("%s%02d", p.prefix, i)
			t0 := time.Now()
			resp, err := bc.Call(&api.Request{Op: api.OpSpawn, Name: name, Host: h2.host, Profile: p.name, TimeoutMS: spawnTimeout.Milliseconds()})
			if err != nil {
				// counted, reported, and tried again under another name (a
				// SPAWN that reaches h2 late still starts a process there:
				// its pid lands in the pid file and the cleanup ends it)
				s.failed = append(s.failed, fmt.Sprintf("%s after %v: %v", name, time.Since(t0).Round(time.Millisecond), err))
				fmt.Printf("   spawn %s on %s FAILED after %v: %v\n", name, h2.host, time.Since(t0).Round(time.Millisecond), err)
				if len(s.failed) > maxFailed {
					return nil, fmt.Errorf("%d spawns failed, last: %w; %s log:\n%s", len(s.failed), err, h1.host, benchkit.Tail(h1.log))
				}
				continue
			}
			t1 := time.Now()
			if resp.Spawned == nil || resp.Spawned.Gid == "" {
				return nil, fmt.Errorf("spawn %s: no gid in the answer", name)
			}
			gid := resp.Spawned.Gid
			token := strings.TrimSpace(readFile(filepath.Join(h2.state, "credentials", name+".token")))
			if !strings.Contains(token, gid) {
				return nil, fmt.Errorf("spawn %s: credential file on %s does not hold gid %s", name, h2.host, gid)
			}
			rc, err := dial(h2, token)
			if err != nil {
				return nil, err
			}
			if err := rc.Send(&api.Request{Op: api.OpRecv, Follow: true, Max: 1}); err != nil {
				rc.Close()
				return nil, err
			}
			ts := time.Now()
			sresp, err := bc.Call(&api.Request{Op: api.OpSend, To: name, Body: "hello, " + name})
			if err != nil {
				rc.Close()
				return nil, fmt.Errorf("send to %s: %w", name, err)
			}
			tsent := time.Now()
			got, err := recvOne(rc, sresp.Sent.MsgID)
			rc.Close()
			if err != nil {
				return nil, fmt.Errorf("recv of %s: %w", name, err)
			}
			s.total = append(s.total, got.Sub(t0))
			s.spawn = append(s.spawn, t1.Sub(t0))
			s.deliver = append(s.deliver, got.Sub(t1))
			s.send = append(s.send, tsent.Sub(ts))
			tstop := time.Now()
			if _, err := bc.Call(&api.Request{Op: api.OpStop, Target: gid, TimeoutMS: spawnTimeout.Milliseconds()}); err != nil {
				return nil, fmt.Errorf("stop %s: %w", name, err)
			}
			s.stop = append(s.stop, time.Since(tstop))
		}
		fmt.Printf("profile %s (grace %s): spawn -> first delivered message %s  (OpSpawn call %s; then to delivery %s; OpSend %s; OpStop %s; failed spawns %d)\n",
			p.name, p.grace, p5099(s.total), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.spawn), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.deliver), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.send), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.stop), 50)), len(s.failed))
		out = append(out, s)
	}
	fmt.Println()
	return out, nil
}

// recvOne reads a recv --max 1 stream until the message with id, acks it
// and returns when it was read.
func recvOne(rc *api.Client, id string) (time.Time, error) {
	for i := 0; i < 100; i++ {
		resp, err := rc.Read()
		if err != nil {
			return time.Time{}, err
		}
		if resp.End {
			return time.Time{}, errors.New("recv ended before the message came")
		}
		now := time.Now()
		var acks []string
		found := false
		for _, d := range resp.Batch {
			acks = append(acks, d.Envelope.MsgID)
			found = found || d.Envelope.MsgID == id
		}
		if err := rc.Send(&api.Request{Op: api.OpAck, Acks: acks}); err != nil {
			return time.Time{}, err
		}
		if found {
			return now, nil
		}
	}
	return time.Time{}, errors.New("message never came")
}

// ---- 3. presence ----

// rosterTraffic is what one host published on bridge.roster.
type rosterTraffic struct {
	msgs  int
	bytes int64
	keys  map[string]int // routing key -> messages
}

type presenceResult struct {
	hosts     []string
	perHost   []int
	joinTook  time.Duration
	converge  time.Duration
	idle      map[string]benchkit.Memory
	full      map[string]benchkit.Memory
	msgs      int
	bytes     int64
	byHost    map[string]*rosterTraffic // the <host> of roster.<host>.<what>
	window    time.Duration
	gwCPU     map[string]time.Duration
	brokerCPU time.Duration
}

func presencePhase(bin, root, vhostURL string, bpid int) (*presenceResult, error) {
	hosts := []string{"p1", "p2", "p3"}
	n := *flagEntities
	fmt.Printf("== 3. presence: %d entities over %s (fresh gateways), presence-interval %v, bridge.roster counted for %v\n",
		n, strings.Join(hosts, ","), *flagInterval, *flagWindow)
	gws, err := startSet(bin, root, "b", hosts, vhostURL, "", *flagInterval)
	if err != nil {
		return nil, err
	}
	defer stopSet(gws)
	res := &presenceResult{hosts: hosts, idle: map[string]benchkit.Memory{}, full: map[string]benchkit.Memory{},
		byHost: map[string]*rosterTraffic{}, gwCPU: map[string]time.Duration{}}
	time.Sleep(2 * rssSettle)
	for _, g := range gws {
		m, err := g.memory()
		if err != nil {
			return nil, err
		}
		res.idle[g.host] = m
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(gws))
	idx := 0
	for gi, g := range gws {
		k := benchkit.Split(n, len(gws), gi)
		res.perHost = append(res.perHost, k)
		names := make([]string, k)
		for j := range names {
			names[j] = fmt.Sprintf("e%04d", idx)
			idx++
		}
		wg.Add(1)
		go func(gi int, g *gateway) {
			defer wg.Done()
			_, errs[gi] = joinMany(g, names, 8)
		}(gi, g)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.joinTook = time.Since(t0)
	t1 := time.Now()
	for _, g := range gws {
		if err := waitRoster(g, convergeWait, "presence", func(rows []api.EntityRow) bool { return len(rows) == n }); err != nil {
			return nil, err
		}
	}
	res.converge = time.Since(t1)
	fmt.Printf("registered %d entities (%v) in %v; every roster view showed all %d %v later\n",
		n, res.perHost, res.joinTook.Round(time.Millisecond), n, res.converge.Round(time.Millisecond))
	time.Sleep(2 * time.Second) // the join kicks are over

	// our own queue on bridge.roster
	conn, err := amqp.DialConfig(vhostURL, amqp.Config{Heartbeat: 5 * time.Second, Locale: "en_US"})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return nil, err
	}
	if err := ch.QueueBind(q.Name, "roster.#", "bridge.roster", false, nil); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(q.Name, "benchbroker-roster", true, true, false, false, nil)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	counting := false
	countDone := make(chan struct{})
	go func() {
		defer close(countDone)
		for d := range deliveries {
			mu.Lock()
			if counting {
				res.msgs++
				res.bytes += int64(len(d.Body))
				parts := strings.SplitN(d.RoutingKey, ".", 3)
				h := "?"
				if len(parts) == 3 {
					h = parts[1]
				}
				t := res.byHost[h]
				if t == nil {
					t = &rosterTraffic{keys: map[string]int{}}
					res.byHost[h] = t
				}
				t.msgs++
				t.bytes += int64(len(d.Body))
				t.keys[d.RoutingKey]++
			}
			mu.Unlock()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	cpu0 := map[string]time.Duration{}
	for _, g := range gws {
		cpu0[g.host] = g.cpu()
	}
	b0 := brokerCPU(bpid)
	mu.Lock()
	counting = true
	w0 := time.Now()
	mu.Unlock()
	time.Sleep(*flagWindow)
	mu.Lock()
	counting = false
	res.window = time.Since(w0)
	mu.Unlock()
	for _, g := range gws {
		res.gwCPU[g.host] = g.cpu() - cpu0[g.host]
	}
	res.brokerCPU = brokerCPU(bpid) - b0
	for _, g := range gws {
		m, err := g.memory()
		if err != nil {
			return nil, err
		}
		res.full[g.host] = m
		if err := g.alive(); err != nil {
			return nil, err
		}
	}
	conn.Close()
	<-countDone

	secs := res.window.Seconds()
	fmt.Printf("bridge.roster (routing key roster.#) over %.1fs: %d messages = %.2f msgs/s, %d body bytes = %.1f KiB/s\n",
		secs, res.msgs, float64(res.msgs)/secs, res.bytes, float64(res.bytes)/1024/secs)
	for _, h := range hosts {
		t := res.byHost[h]
		if t == nil {
			fmt.Printf("   roster.%s.*: nothing heard\n", h)
			continue
		}
		var per []int
		for _, c := range t.keys {
			per = append(per, c)
		}
		sort.Ints(per)
		fmt.Printf("   roster.%s.*: %d msgs (%.1f/s), %.1f KiB/s, %d distinct keys, mean body %d bytes, messages per key in the window min %d median %d max %d\n",
			h, t.msgs, float64(t.msgs)/secs, float64(t.bytes)/1024/secs, len(t.keys), t.bytes/int64(max(1, t.msgs)),
			per[0], per[len(per)/2], per[len(per)-1])
	}
	for i, g := range gws {
		id, fu := res.idle[g.host], res.full[g.host]
		fmt.Printf("%s VmRSS: idle %s -> %d entities %s (anon %s, file %s; threads %d; VmHWM %s; +%.1f KiB/entity); CPU %v in the window (%.1f%% of a core)\n",
			g.host, benchkit.MiB(id.RSS), res.perHost[i], benchkit.MiB(fu.RSS), benchkit.MiB(fu.Anon), benchkit.MiB(fu.File), fu.Threads, benchkit.MiB(fu.HWM),
			float64(fu.RSS-id.RSS)/float64(max(1, res.perHost[i])), res.gwCPU[g.host].Round(10*time.Millisecond), 100*res.gwCPU[g.host].Seconds()/secs)
	}
	if bpid > 0 {
		fmt.Printf("broker (beam.smp) CPU in the window: %v (%.1f%% of a core)\n", res.brokerCPU.Round(10*time.Millisecond), 100*res.brokerCPU.Seconds()/secs)
	}
	fmt.Println()
	return res, nil
}

// ---- main ----

func run() error {
	phases := map[string]bool{}
	for _, p := range strings.Split(*flagPhases, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains([]string{"ask", "bcast", "spawn", "presence"}, p) {
			return fmt.Errorf("-phases: unknown phase %q (ask, bcast, spawn, presence)", p)
		}
		phases[p] = true
	}
	if *flagAsks <= 0 || *flagWarmup < 0 || *flagInboxes <= 0 || *flagBcasts <= 0 || *flagEntities <= 0 || *flagSpawns <= 0 || *flagWindow <= 0 {
		return errors.New("-asks, -inboxes, -bcasts, -entities, -spawns and -window must be positive, -warmup not negative")
	}
	bin, err := filepath.Abs(*flagBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(bin, "fleet-gw")); err != nil {
		return fmt.Errorf("%s not built (go build -o DIR/ ./cmd/...): %w", filepath.Join(bin, "fleet-gw"), err)
	}
	base := *flagBroker
	if base == "" {
		out, err := rmq("url")
		if err != nil {
			return err
		}
		base = strings.TrimSpace(out)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		return fmt.Errorf("-broker %q is not an amqp:// URL", base)
	}
	u.Path, u.RawPath = "/"+*flagVhost, "/"+url.PathEscape(*flagVhost)
	vhostURL := u.String()
	// the node's pid, for its CPU time (optional)
	bpid := 0
	if out, err := rmq("ctl", "eval", "list_to_integer(os:getpid())."); err == nil {
		bpid, _ = strconv.Atoi(strings.TrimSpace(out))
	}

	tmp, err := os.MkdirTemp(*flagDir, "fbb-")
	if err != nil {
		return err
	}
	if *flagKeep {
		fmt.Printf("temporary folder kept: %s\n", tmp)
	} else {
		benchkit.AtCleanup(func() { os.RemoveAll(tmp) })
	}
	if err := createVhost(*flagVhost); err != nil {
		return err
	}

	host, _ := os.Hostname()
	fmt.Printf("fleet broker benchmark — %s, %s/%s, %d CPUs, GOMAXPROCS %d, %s\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), time.Now().Format(time.RFC3339))
	fmt.Printf("broker %s (vhost %s, created for this run; node pid %d); state under %s (%s); load average at start: %s\n",
		redact(vhostURL), *flagVhost, bpid, tmp, benchkit.FSType(tmp), benchkit.Loadavg())
	fmt.Printf("every gateway, the broker and this benchmark share the machine's %d CPUs\n\n", runtime.NumCPU())

	var (
		askRes   *askResult
		bcastRes *bcastResult
		spawnRes []*spawnSeries
		presRes  *presenceResult
	)
	if phases["ask"] || phases["bcast"] || phases["spawn"] {
		spawnPids := filepath.Join(tmp, "spawned.pids")
		if *flagPiddir != "" {
			spawnPids = filepath.Join(*flagPiddir, "spawned.pids")
		}
		benchkit.AtCleanup(func() { killSpawned(spawnPids) }) // after the gateways stop (cleanups run last first)
		conf := filepath.Join(tmp, "gw.conf")
		cmd := strconv.Quote(spawnCommand(spawnPids))
		if err := os.WriteFile(conf, []byte(strings.Join([]string{
			"# fleet-spawn profiles of the benchmark (exec launcher, pull entities)",
			"profile.bench.launcher = exec",
			"profile.bench.mode = pull",
			"profile.bench.command = " + cmd,
			"profile.bench0.launcher = exec",
			"profile.bench0.mode = pull",
			"profile.bench0.grace = 0s",
			"profile.bench0.command = " + cmd,
			"",
		}, "\n")), 0o600); err != nil {
			return err
		}
		gws, err := startSet(bin, tmp, "a", []string{"h1", "h2", "h3"}, vhostURL, conf, *flagInterval)
		if err != nil {
			return err
		}
		for _, g := range gws {
			fmt.Printf("fleet-gw %s (version %s) pid %d, socket %s\n", g.host, g.version, g.pid(), g.socket)
		}
		fmt.Println()
		if phases["ask"] {
			if askRes, err = askPhase(gws, vhostURL, bpid); err != nil {
				return err
			}
		}
		if phases["bcast"] {
			if bcastRes, err = bcastPhase(gws, vhostURL, bpid); err != nil {
				return err
			}
		}
		if phases["spawn"] {
			if spawnRes, err = spawnPhase(gws); err != nil {
				return err
			}
		}
		for _, g := range gws {
			if err := g.alive(); err != nil {
				return err
			}
		}
		stopSet(gws)
		killSpawned(spawnPids)
	}
	if phases["presence"] {
		if presRes, err = presencePhase(bin, tmp, vhostURL, bpid); err != nil {
			return err
		}
	}

	fmt.Println("==================== summary ====================")
	if r := askRes; r != nil {
		fs, rs := benchkit.Sorted(r.rt), benchkit.Sorted(r.raw)
		r50, r99 := ratio(benchkit.Pct(fs, 50), benchkit.Pct(rs, 50)), ratio(benchkit.Pct(fs, 99), benchkit.Pct(rs, 99))
		fmt.Printf("1. ask -> answer across hosts (n=%d): p50 %s  p99 %s   raw two-hop (n=%d): p50 %s  p99 %s   ratio p50 %.2fx  p99 %.2fx\n",
			len(fs), benchkit.Ms(benchkit.Pct(fs, 50)), benchkit.Ms(benchkit.Pct(fs, 99)), len(rs), benchkit.Ms(benchkit.Pct(rs, 50)), benchkit.Ms(benchkit.Pct(rs, 99)), r50, r99)
		fmt.Printf("   same-host ask (no broker) p50 %s  p99 %s\n", benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.local), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.local), 99)))
		fmt.Printf("   signatures alone (2 signs + 2 verifies): %s = %.2fx raw p50 added to the raw round trip\n",
			benchkit.Ms(2*(r.sign+r.verify)), ratio(benchkit.Pct(rs, 50)+2*(r.sign+r.verify), benchkit.Pct(rs, 50)))
		fmt.Printf("   target ask <= %.1fx raw: p50 -> %s, p99 -> %s   (failed asks: %d)\n", targetAskRatio, benchkit.Met(r50 <= targetAskRatio), benchkit.Met(r99 <= targetAskRatio), len(r.failures))
	}
	if r := bcastRes; r != nil {
		alls := r.alls()
		fmt.Printf("2. fleet-bcast to all %d inboxes (%s): median %s  max %s  over %d broadcasts (OpBcast call p50 %s)\n",
			r.inboxes, r.spread, benchkit.Ms(benchkit.Pct(alls, 50)), benchkit.Ms(alls[len(alls)-1]), len(alls), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.calls()), 50)))
		fmt.Printf("   raw fan-out baseline (one persistent confirmed publish to %d queues): median %s  max %s   (failed broadcasts: %d)\n",
			r.inboxes, benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.rawAll), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.rawAll), 100)), len(r.failed))
		for _, f := range r.failed {
			fmt.Printf("   failed: %s\n", f)
		}
	}
	if r := presRes; r != nil {
		secs := r.window.Seconds()
		var mem []string
		for i, h := range r.hosts {
			mem = append(mem, fmt.Sprintf("%s %s (%d entities; idle %s)", h, benchkit.MiB(r.full[h].RSS), r.perHost[i], benchkit.MiB(r.idle[h].RSS)))
		}
		fmt.Printf("3. presence, %d entities, interval %v: %.2f msgs/s, %.1f KiB/s on bridge.roster (%d msgs, %d bytes in %.1fs)\n",
			*flagEntities, *flagInterval, float64(r.msgs)/secs, float64(r.bytes)/1024/secs, r.msgs, r.bytes, secs)
		fmt.Printf("   gateway VmRSS: %s\n", strings.Join(mem, "; "))
	}
	for _, s := range spawnRes {
		fmt.Printf("4. fleet-spawn -> first delivered message, profile %s (grace %s), n=%d: p50 %s  p99 %s  (OpSpawn call p50 %s; failed spawns %d)\n",
			s.profile, s.grace, len(s.total), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.total), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.total), 99)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.spawn), 50)), len(s.failed))
		for _, f := range s.failed {
			fmt.Printf("   failed: %s\n", f)
		}
	}
	fmt.Printf("load average at end: %s (other work on this machine skews every figure)\n", benchkit.Loadavg())
	return nil
}

func (r *bcastResult) calls() []time.Duration {
	var out []time.Duration
	for _, x := range r.rounds {
		out = append(out, x.call)
	}
	return out
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	return u.String()
}
