package gateway_test

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/fault"
)

// The cluster tests run three gateways against the private three-node
// RabbitMQ cluster (scripts/rabbitmq-cluster.sh), each gateway connected
// to another node first, with quorum inboxes. They kill and stop nodes, so
// they run one at a time, and alone beside this package's tests of the
// single node (its three nodes beside them starved the node in CI),
// started first: the node-loss test is this package's longest.

// clusterGWs starts h1..h3 on the cluster in a fresh vhost, enrolled, h_i
// connected to node i first.
func clusterGWs(t *testing.T, vhost string) []*testGW {
	t.Helper()
	testsched.Take(t, testsched.Need{Group: "node", Alone: true, Long: 2 * time.Minute}) // the cluster's three nodes beside the node tests starved them
	if _, err := testnode.Cluster(); err != nil {
		t.Fatal(err)
	}
	unlock, err := testnode.ClusterLock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	hosts := []string{"h1", "h2", "h3"}
	logins, err := testnode.ClusterLogins(vhost, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnode.ClusterCmd("ctl", "1", "delete_vhost", vhost) })
	dir := t.TempDir()
	var gws []*testGW
	for i, host := range hosts {
		gws = append(gws, &testGW{t: t, Host: host, logs: &syncBuffer{}, Cfg: newConfig(t, dir, host, settings{
			"broker": logins[i], "inbox-queue-type": "quorum", "heartbeat": "2s", "publish-timeout": "5s",
		})})
	}
	enrol(t, gws...)
	for _, g := range gws {
		g.start()
		t.Cleanup(func() {
			g.stop()
			g.noPermissionErrors()
		})
	}
	return gws
}

// restoredRE finds the node a gateway reconnected to.
var restoredRE = regexp.MustCompile(`"msg":"broker connection restored".*"node":"amqp://([^/"]+)/`)

// urls are the cluster's node URLs.
func urls(t *testing.T) []string {
	u, err := testnode.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// leaderOf is the cluster node (1-3) leading queue q in vhost.
func leaderOf(t *testing.T, vhost, q string) int {
	t.Helper()
	out, err := testnode.ClusterCmd("ctl", "1", "list_queues", "-p", vhost, "--quiet", "--no-table-headers", "name", "type", "leader")
	if err != nil {
		t.Fatalf("list_queues: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == q {
			if f[1] != "quorum" {
				t.Fatalf("%s is a %s queue, want quorum", q, f[1])
			}
			n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSuffix(f[2], "@localhost"), "fleet-c"))
			if err != nil {
				t.Fatalf("leader %q of %s", f[2], q)
			}
			return n
		}
	}
	t.Fatalf("no queue %s in:\n%s", q, out)
	return 0
}

// outcome is what one send was told.
type outcome struct {
	seq  int
	code fault.Code // 0: sent
	at   time.Time
}

// TestClusterNodeLoss: senders on every host, each to an entity on the
// next host; the node leading the busiest inbox is killed with SIGKILL
// mid-stream, then started again. Every send that succeeded is received
// exactly once, in order per pair; sends during the election fail only
// with 69 (not sent: never received), 74 or 75 (outcome unknown: received
// at most once); the roster converges again. Then the whole cluster stops and starts with
// messages queued for a gateway that is down: none is lost.
func TestClusterNodeLoss(t *testing.T) {
	const vhost = "t-cluster-loss"
	gws := clusterGWs(t, vhost)
	var senders, receivers []entity
	for i, g := range gws {
		senders = append(senders, g.join(fmt.Sprintf("s%d", i+1)))
		receivers = append(receivers, g.join(fmt.Sprintf("r%d", i+1)))
	}
	for _, g := range gws {
		for _, o := range gws {
			if o != g {
				for _, r := range receivers {
					if r.gw == o {
						g.resolves(r.Name + "@" + o.Host)
					}
				}
			}
		}
	}
	// s_i sends to r_(i+1), on the next host
	target := func(i int) entity { return receivers[(i+1)%len(receivers)] }
	var mu sync.Mutex
	results := make([][]outcome, len(senders))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 1; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.send(target(i).Gid, fmt.Sprintf("%s-%06d", s.Name, seq))
				o := outcome{seq: seq, at: time.Now()}
				if err != nil {
					var fe *fault.Error
					if !errors.As(err, &fe) {
						t.Errorf("%s message %d: %v", s.Name, seq, err)
						return
					}
					o.code = fe.Code
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				results[i] = append(results[i], o)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	busy := broker.InboxQueue(target(0).Gid)
	leader := leaderOf(t, vhost, busy)
	t.Logf("killing node %d, leader of %s", leader, busy)
	if out, err := testnode.ClusterCmd("kill", strconv.Itoa(leader)); err != nil {
		t.Fatalf("kill: %v\n%s", err, out)
	}
	killed := time.Now()
	time.Sleep(8 * time.Second)
	restarted := time.Now()
	if out, err := testnode.ClusterCmd("start-node", strconv.Itoa(leader)); err != nil {
		t.Fatalf("start node %d: %v\n%s", leader, err, out)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if nl := leaderOf(t, vhost, busy); nl == leader {
		t.Logf("leadership of %s came back to node %d", busy, nl)
	}

	// the gateway that was on the killed node moved to another one, and
	// every sender got messages through while the node was down
	moved := gws[leader-1]
	killedPort := strings.TrimPrefix(urls(t)[leader-1], "amqp://guest:guest@")
	restored := false
	for _, m := range restoredRE.FindAllStringSubmatch(moved.logs.String(), -1) {
		if m[1] != killedPort {
			restored = true
		}
	}
	if !restored {
		t.Errorf("%s did not reconnect to another node than %s:\n%s", moved.Host, killedPort, moved.logs)
	}
	for i, s := range senders {
		ok := 0
		for _, o := range results[i] {
			if o.code == 0 && o.at.After(killed.Add(3*time.Second)) && o.at.Before(restarted) {
				ok++
			}
		}
		if ok == 0 {
			t.Errorf("%s got nothing through while node %d was down", s.Name, leader)
		}
	}

	// every send that succeeded, once each, in order; failures only 69/75
	for i, s := range senders {
		r := target(i)
		sent, unknown, notSent := map[int]bool{}, map[int]bool{}, map[int]bool{}
		failed := 0
		for _, o := range results[i] {
			switch o.code {
			case 0:
				sent[o.seq] = true
			case fault.OutcomeUnknown, fault.TempFail:
				unknown[o.seq] = true // 74: written, not confirmed; 75: may have gone
				failed++
			case fault.Unavailable:
				notSent[o.seq] = true // 69: no attempt reached the broker
				failed++
			default:
				t.Errorf("%s message %d: exit %d, want 0, 69, 74 or 75", s.Name, o.seq, o.code)
			}
		}
		var got []int
		eventuallyWithin(t, time.Minute, fmt.Sprintf("%s has all %d of %s's sent messages", r.Name, len(sent), s.Name), func() error {
			for _, b := range bodies(r.recv()) {
				n, err := strconv.Atoi(strings.TrimPrefix(b, s.Name+"-"))
				if err != nil {
					t.Fatalf("%s got %q", r.Name, b)
				}
				got = append(got, n)
			}
			have := 0
			for _, n := range got {
				if sent[n] {
					have++
				}
			}
			if have < len(sent) {
				return fmt.Errorf("%d of %d", have, len(sent))
			}
			return nil
		})
		seen := map[int]bool{}
		for j, n := range got {
			if seen[n] {
				t.Errorf("%s got %s-%d twice", r.Name, s.Name, n)
			}
			seen[n] = true
			if notSent[n] {
				t.Errorf("%s got %s-%d, whose send exited 69 (not sent)", r.Name, s.Name, n)
			} else if !sent[n] && !unknown[n] {
				t.Errorf("%s got %s-%d, which was never sent", r.Name, s.Name, n)
			}
			if j > 0 && n < got[j-1] {
				t.Errorf("%s got %s-%d after %s-%d: out of order", r.Name, s.Name, n, s.Name, got[j-1])
			}
		}
		t.Logf("%s → %s: %d sent, %d failed during the election (69/74/75), %d received", s.Name, r.Name, len(sent), failed, len(got))
		if len(sent) == 0 {
			t.Errorf("%s sent nothing", s.Name)
		}
	}
	// the roster converges: every gateway sees the other hosts' entities
	for _, g := range gws {
		eventuallyWithin(t, time.Minute, g.Host+" sees every entity again", func() error {
			resp, err := g.call("", &api.RosterRequest{})
			if err != nil {
				return err
			}
			var bad []string
			n := 0
			for _, e := range resp.Entities {
				n++
				if e.Status == "unknown" || e.Status == "stale" {
					bad = append(bad, e.Name+"@"+e.Host+" "+e.Status)
				}
			}
			if n != 6 || len(bad) > 0 {
				sort.Strings(bad)
				return fmt.Errorf("%d entities, %v", n, bad)
			}
			return nil
		})
	}

	// a whole cluster stop and start, with mail queued for a gateway that
	// is down: none of it lost
	h2, r2 := gws[1], receivers[1]
	h2.stop()
	for k := 1; k <= 20; k++ {
		senders[0].mustSend(r2.Gid, fmt.Sprintf("queued-%02d", k))
	}
	if out, err := testnode.ClusterCmd("stop"); err != nil {
		t.Fatalf("cluster stop: %v\n%s", err, out)
	}
	if out, err := testnode.ClusterCmd("start"); err != nil {
		t.Fatalf("cluster start: %v\n%s", err, out)
	}
	h2.start()
	var queued []string
	eventuallyWithin(t, 2*time.Minute, "r2 gets the 20 queued messages", func() error {
		for _, b := range bodies(r2.recv()) {
			if strings.HasPrefix(b, "queued-") {
				queued = append(queued, b)
			}
		}
		if len(queued) < 20 {
			return fmt.Errorf("%d of 20", len(queued))
		}
		return nil
	})
	for k, b := range queued {
		if want := fmt.Sprintf("queued-%02d", k+1); b != want {
			t.Errorf("queued message %d is %s, want %s", k+1, b, want)
		}
	}
}
