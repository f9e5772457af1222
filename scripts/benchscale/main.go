// benchscale measures one gateway with many entities on the private
// RabbitMQ node: how long a join takes (its inbox declared, bound and
// consumed before it returns) beside raw amqp091-go doing the same for one
// queue, in the same run; that every inbox is consumed on the broker; and
// the gateway's resident memory per entity beyond idle.
//
//	go run ./scripts/benchscale -bin bin -broker amqp://guest:guest@127.0.0.1:5699/ -n 10000
//
// scripts/bench-scale.sh builds the binaries and passes the node's URL.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
	amqp "github.com/rabbitmq/amqp091-go"
)

var (
	flagBin    = flag.String("bin", "bin", "folder with the fleet binaries")
	flagBroker = flag.String("broker", "", "the private node's URL (amqp://user:pass@host:port/)")
	flagRMQ    = flag.String("rmq", "scripts/rabbitmq-node.sh", "the node script (for rabbitmqctl)")
	flagN      = flag.Int("n", 10000, "entities joined on the gateway")
	flagRaw    = flag.Int("raw", 1000, "queues declared, bound and consumed by the raw baseline")
	flagDir    = flag.String("dir", "", "work folder (default: a temporary one)")
)

func main() {
	flag.Parse()
	benchkit.Main("benchscale", "stopping", 2*time.Hour, run)
}

func rmq(args ...string) (string, error) {
	out, err := exec.Command(*flagRMQ, append([]string{"ctl"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func run() error {
	if *flagBroker == "" {
		return fmt.Errorf("-broker is required (scripts/rabbitmq-node.sh url)")
	}
	dir := *flagDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "fleet-benchscale-"); err != nil {
			return err
		}
		benchkit.AtCleanup(func() { os.RemoveAll(dir) })
	}
	vhost := fmt.Sprintf("benchscale-%d", os.Getpid())
	if _, err := rmq("add_vhost", vhost); err != nil {
		return err
	}
	benchkit.AtCleanup(func() { rmq("delete_vhost", vhost) })
	if _, err := rmq("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"); err != nil {
		return err
	}
	url := strings.TrimSuffix(*flagBroker, "/") + "/" + vhost
	bin, err := filepath.Abs(*flagBin)
	if err != nil {
		return err
	}
	fmt.Printf("benchscale: %d entities on one gateway, raw baseline %d queues; broker %s; load %s\n",
		*flagN, *flagRaw, broker.Redact(url), strings.TrimSpace(benchkit.Loadavg()))

	// the raw baseline: what a join must do on the broker, for one queue;
	// interleaved with the joins, so both see the same load
	rj, err := newRawJoiner(url)
	if err != nil {
		return err
	}
	defer rj.conn.Close()
	var raw []time.Duration
	every := max(1, *flagN/max(1, *flagRaw))

	g, err := benchkit.StartGateway(benchkit.GatewayConfig{
		Bin: bin, Dir: filepath.Join(dir, "h1"), Host: "h1",
		Env:   []string{"FLEET_BROKER=" + url, "FLEET_PRESENCE_INTERVAL=1h", "FLEET_PAIR_RATE=0"},
		Ready: time.Minute, WaitBroker: true,
	})
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	idle, err := g.Memory()
	if err != nil {
		return err
	}
	c, err := g.Dial("")
	if err != nil {
		return err
	}
	defer c.Close()
	joins := make([]time.Duration, 0, *flagN)
	start := time.Now()
	var rawTook time.Duration
	for i := range *flagN {
		if i%every == 0 && len(raw) < *flagRaw {
			d, err := rj.one(len(raw))
			if err != nil {
				return fmt.Errorf("raw baseline: %w", err)
			}
			raw, rawTook = append(raw, d), rawTook+d
		}
		t0 := time.Now()
		if _, err := benchkit.Join(c, fmt.Sprintf("e%d", i)); err != nil {
			return fmt.Errorf("after %d joins: %w", i, err)
		}
		joins = append(joins, time.Since(t0))
	}
	took := time.Since(start) - rawTook
	time.Sleep(2 * time.Second) // let the runtime settle
	after, err := g.Memory()
	if err != nil {
		return err
	}
	out, err := rmq("list_consumers", "-q", "--no-table-headers", "-p", vhost, "queue_name")
	if err != nil {
		return err
	}
	consumed := strings.Count(out, "agent.")
	log := benchkit.ReadFile(g.Log)
	errs := strings.Count(log, `"level":"ERROR"`)
	// a message to the last one, through the store: the gateway still serves
	if _, err := c.Call(&api.RosterRequest{}); err != nil {
		return err
	}

	js, rs := benchkit.Sorted(joins), benchkit.Sorted(raw)
	perEntity := float64(after.RSS-idle.RSS) / float64(*flagN)
	ratio := float64(benchkit.Pct(js, 50)) / float64(benchkit.Pct(rs, 50))
	fmt.Printf("  joins:     %d in %v; p50 %s, p99 %s\n", *flagN, took.Round(time.Second), benchkit.Ms(benchkit.Pct(js, 50)), benchkit.Ms(benchkit.Pct(js, 99)))
	fmt.Printf("  raw amqp091-go declare + 2 binds + exclusive consume of one queue (%d, interleaved): p50 %s, p99 %s\n", len(raw), benchkit.Ms(benchkit.Pct(rs, 50)), benchkit.Ms(benchkit.Pct(rs, 99)))
	fmt.Printf("  join p50 / raw p50: %.2fx (target 1.5x) %s\n", ratio, benchkit.Met(ratio <= 1.5))
	fmt.Printf("  inboxes consumed on the broker: %d of %d %s; ERROR lines in the gateway's log: %d\n", consumed, *flagN, benchkit.Met(consumed == *flagN), errs)
	fmt.Printf("  resident memory: idle %s, with %d entities %s: %.1f KiB per entity (target 20 KiB) %s\n",
		benchkit.MiB(idle.RSS), *flagN, benchkit.MiB(after.RSS), perEntity, benchkit.Met(perEntity <= 20))
	return nil
}

// rawJoiner declares (durable, with an inbox's arguments), binds (gid and
// broadcast.all, as a join does) and consumes (exclusive, manual ack)
// queues with amqp091-go, one at a time: the least a join costs on the
// broker. The queues go with the run's vhost.
type rawJoiner struct {
	conn      *amqp.Connection
	setup, ch *amqp.Channel
}

func newRawJoiner(url string) (*rawJoiner, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	r := &rawJoiner{conn: conn}
	if r.setup, err = conn.Channel(); err != nil {
		return nil, err
	}
	if err := r.setup.ExchangeDeclare("raw.msg", "topic", true, false, false, false, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// one declares, binds and consumes queue i, and says how long it took.
func (r *rawJoiner) one(i int) (time.Duration, error) {
	var err error
	if i%200 == 0 { // as the gateway shares channels
		if r.ch, err = r.conn.Channel(); err != nil {
			return 0, err
		}
	}
	q := fmt.Sprintf("raw.%d", i)
	t0 := time.Now()
	if _, err := r.setup.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-dead-letter-exchange": "raw.dlx", "x-overflow": "reject-publish",
		"x-max-length": int64(10000), "x-message-ttl": int64(7 * 24 * time.Hour / time.Millisecond),
	}); err != nil {
		return 0, err
	}
	for _, k := range []string{q, "broadcast.all"} {
		if err := r.setup.QueueBind(q, k, "raw.msg", false, nil); err != nil {
			return 0, err
		}
	}
	if _, err := r.ch.ConsumeWithContext(context.Background(), q, q, false, true, false, false, nil); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}
