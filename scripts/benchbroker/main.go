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
//     new entity's first message delivered through OpRecv;
//  5. throughput: senders on h1 to pull recipients on h2 (bodies of 512 B
//     and 4 KiB, 1 and 8 senders, 1 and 8 recipients), beside raw
//     amqp091-go with the same guarantees, confirm-each and pipelined,
//     interleaved and repeated in the same run.
//
// It creates the vhost (and refuses one that exists), and always stops every
// gateway (SIGTERM, then SIGKILL), every spawned process group and deletes
// the vhost again: on success, on error, on SIGINT/SIGTERM and when the
// overall -timeout passes. Pid files go to -piddir for a wrapper's cleanup
// (scripts/bench-broker.sh). Missed targets are reported, never turned into
// a failing exit status.
//
// One file per phase: ask.go, bcast.go, presence.go, spawn.go and
// throughput.go; the raw
// amqp091-go baselines beside them in raw.go; the vhost, the gateway sets
// (started through the launcher in scripts/internal/benchkit) and the
// shared helpers in setup.go.
//
//	scripts/bench-broker.sh [-asks 300] [-inboxes 200] [-entities 1000] [-tp-msgs 2000] [-phases ask,throughput,bcast,spawn,presence]
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

// Targets and bounds.
const (
	targetAskRatio = 2.5                    // fleet ask round trip / raw two-hop, at p50 (issue 13 point 6)
	readyTimeout   = 20 * time.Second       // gateway socket and broker connection
	rssSettle      = 500 * time.Millisecond // before reading VmRSS
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
	flagPhases   = flag.String("phases", "ask,throughput,bcast,spawn,presence", "comma-separated phases to run")
	flagTPMsgs   = flag.Int("tp-msgs", 2000, "throughput: messages per measurement")
	flagTPRounds = flag.Int("tp-rounds", 3, "throughput: rounds (each measures every configuration, fleet and raw, interleaved)")
	flagTPBodies = flag.String("tp-bodies", "512,4096", "throughput: body sizes in bytes")
	flagTPSend   = flag.String("tp-senders", "1,8", "throughput: numbers of senders")
	flagTPRcpt   = flag.String("tp-recipients", "1,8", "throughput: numbers of pull recipients")
	flagPprof    = flag.Int("pprof-port", 0, "give gateway i FLEET_PPROF_ADDR=127.0.0.1:PORT+i (served only by a fleet-gw built with -tags pprof); 0: none")
	flagDir      = flag.String("dir", "", "parent of the temporary folder (default $TMPDIR); keep it short: sockets live there")
	flagPiddir   = flag.String("piddir", "", "write gw-*.pid (gateways), spawned.pids (spawned process groups) and vhost (while it exists) here, for a wrapper's cleanup")
	flagKeep     = flag.Bool("keep", false, "keep the temporary folder (gateway logs, state)")
	flagTimeout  = flag.Duration("timeout", 20*time.Minute, "overall bound: clean up and exit 3 when it passes")
)

func main() {
	flag.Parse()
	benchkit.Main("benchbroker", "cleaning up (gateways, spawned processes, vhost)", *flagTimeout, run)
}

func run() error {
	phases := map[string]bool{}
	for _, p := range strings.Split(*flagPhases, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains([]string{"ask", "throughput", "bcast", "spawn", "presence"}, p) {
			return fmt.Errorf("-phases: unknown phase %q (ask, throughput, bcast, spawn, presence)", p)
		}
		phases[p] = true
	}
	if *flagAsks <= 0 || *flagWarmup < 0 || *flagInboxes <= 0 || *flagBcasts <= 0 || *flagEntities <= 0 || *flagSpawns <= 0 || *flagWindow <= 0 ||
		*flagTPMsgs <= 0 || *flagTPRounds <= 0 {
		return errors.New("-asks, -inboxes, -bcasts, -entities, -spawns, -window, -tp-msgs and -tp-rounds must be positive, -warmup not negative")
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
		out, err := node().Run("url")
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
	if out, err := node().Run("ctl", "eval", "list_to_integer(os:getpid())."); err == nil {
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
	if err := node().CreateVhost(*flagVhost); err != nil {
		return err
	}

	host, _ := os.Hostname()
	fmt.Printf("fleet broker benchmark — %s, %s/%s, %d CPUs, GOMAXPROCS %d, %s\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), time.Now().Format(time.RFC3339))
	fmt.Printf("broker %s (vhost %s, created for this run; node pid %d); state under %s (%s); load average at start: %s\n",
		broker.Redact(vhostURL), *flagVhost, bpid, tmp, benchkit.FSType(tmp), benchkit.Loadavg())
	fmt.Printf("every gateway, the broker and this benchmark share the machine's %d CPUs\n\n", runtime.NumCPU())

	var (
		askRes   *askResult
		bcastRes *bcastResult
		spawnRes []*spawnSeries
		presRes  *presenceResult
		tpRes    *tpResult
	)
	if phases["ask"] || phases["throughput"] || phases["bcast"] || phases["spawn"] {
		spawnPids := filepath.Join(tmp, "spawned.pids")
		if *flagPiddir != "" {
			spawnPids = filepath.Join(*flagPiddir, "spawned.pids")
		}
		benchkit.AtCleanup(func() { killSpawned(spawnPids) }) // after the gateways stop (cleanups run last first)
		conf := filepath.Join(tmp, "gw.conf")
		if err := writeProfiles(conf, spawnPids); err != nil {
			return err
		}
		gws, err := startSet(bin, tmp, "a", []string{"h1", "h2", "h3"}, vhostURL, conf, *flagInterval)
		if err != nil {
			return err
		}
		for _, g := range gws {
			fmt.Printf("fleet-gw %s (version %s) pid %d, socket %s\n", g.Host, g.Version, g.Pid(), g.Socket)
		}
		fmt.Println()
		if phases["ask"] {
			if askRes, err = askPhase(gws, vhostURL, bpid); err != nil {
				return err
			}
		}
		if phases["throughput"] {
			if tpRes, err = throughputPhase(gws, vhostURL, bpid); err != nil {
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
			if err := g.Alive(); err != nil {
				return err
			}
		}
		benchkit.StopGateways(gws)
		killSpawned(spawnPids)
	}
	if phases["presence"] {
		if presRes, err = presencePhase(bin, tmp, vhostURL, bpid); err != nil {
			return err
		}
	}

	fmt.Println("==================== summary ====================")
	if askRes != nil {
		askRes.printSummary()
	}
	if bcastRes != nil {
		bcastRes.printSummary()
	}
	if presRes != nil {
		presRes.printSummary()
	}
	for _, s := range spawnRes {
		s.printSummary()
	}
	if tpRes != nil {
		tpRes.printSummary()
	}
	fmt.Printf("load average at end: %s (other work on this machine skews every figure)\n", benchkit.Loadavg())
	return nil
}

// node is the private node, through -rmq.
func node() benchkit.Node {
	return benchkit.Node{Script: *flagRMQ, Prog: "benchbroker", Piddir: *flagPiddir}
}
