// The run's setup: the vhost on the private node, the gateway sets, and
// the small helpers every phase uses.

package main

import (
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

// ---- the private node: vhost ----

// ---- the gateway processes ----

// startSet starts one gateway per host, one after the other, each in
// root/tag-host through the shared launcher, and waits for its socket and
// its broker connection. As deployed (design decision 6), every gateway
// checks every other one's signature against a trust file of all the
// run's hosts.
func startSet(bin, root, tag string, hosts []string, brokerURL, conf string, interval time.Duration) ([]*benchkit.Gateway, error) {
	var gws []*benchkit.Gateway
	for i, h := range hosts {
		env := []string{
			"FLEET_BROKER=" + brokerURL,
			"FLEET_PRESENCE_INTERVAL=" + interval.String(),
			"FLEET_PAIR_RATE=0", // a run measures throughput, not pair-rate (fleet(7), LOOPS AND RATES)
		}
		if *flagPprof > 0 && tag == "a" {
			env = append(env, fmt.Sprintf("FLEET_PPROF_ADDR=127.0.0.1:%d", *flagPprof+i))
		}
		if conf != "" {
			env = append(env, "FLEET_CONFIG="+conf)
		}
		pidfile := ""
		if *flagPiddir != "" {
			pidfile = filepath.Join(*flagPiddir, "gw-"+tag+"-"+h+".pid")
		}
		g, err := benchkit.StartGateway(benchkit.GatewayConfig{
			Bin: bin, Dir: filepath.Join(root, tag+"-"+h), Host: h, Env: env,
			TrustFile: filepath.Join(root, "trust"), Pidfile: pidfile,
			Ready: readyTimeout, WaitBroker: true,
		})
		if err != nil {
			return nil, err
		}
		gws = append(gws, g)
	}
	return gws, nil
}

// brokerCPU is the CPU time of the RabbitMQ node (beam.smp) so far, found
// through its pid file; 0 when unknown.
func brokerCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	return benchkit.ProcCPU(pid)
}

// ---- helpers ----

// waitRoster polls g's roster view until ok says so, at most d.
func waitRoster(g *benchkit.Gateway, d time.Duration, what string, ok func([]api.EntityRow) bool) error {
	c, err := g.Dial("")
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		resp, err := c.Call(&api.RosterRequest{})
		if err != nil {
			return err
		}
		if ok(resp.Entities) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: roster view of %s not there after %v (%d rows)", what, g.Host, d, len(resp.Entities))
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
