// Phase 3: presence traffic on bridge.roster and the gateways' memory with
// many entities.

package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
	amqp "github.com/rabbitmq/amqp091-go"
)

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
	defer benchkit.StopGateways(gws)
	res := &presenceResult{hosts: hosts, idle: map[string]benchkit.Memory{}, full: map[string]benchkit.Memory{},
		byHost: map[string]*rosterTraffic{}, gwCPU: map[string]time.Duration{}}
	time.Sleep(2 * rssSettle)
	for _, g := range gws {
		m, err := g.Memory()
		if err != nil {
			return nil, err
		}
		res.idle[g.Host] = m
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
		go func(gi int, g *benchkit.Gateway) {
			defer wg.Done()
			_, errs[gi] = benchkit.JoinMany(g, names, 8)
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
		cpu0[g.Host] = g.CPU()
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
		res.gwCPU[g.Host] = g.CPU() - cpu0[g.Host]
	}
	res.brokerCPU = brokerCPU(bpid) - b0
	for _, g := range gws {
		m, err := g.Memory()
		if err != nil {
			return nil, err
		}
		res.full[g.Host] = m
		if err := g.Alive(); err != nil {
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
		id, fu := res.idle[g.Host], res.full[g.Host]
		fmt.Printf("%s VmRSS: idle %s -> %d entities %s (anon %s, file %s; threads %d; VmHWM %s; +%.1f KiB/entity); CPU %v in the window (%.1f%% of a core)\n",
			g.Host, benchkit.MiB(id.RSS), res.perHost[i], benchkit.MiB(fu.RSS), benchkit.MiB(fu.Anon), benchkit.MiB(fu.File), fu.Threads, benchkit.MiB(fu.HWM),
			float64(fu.RSS-id.RSS)/float64(max(1, res.perHost[i])), res.gwCPU[g.Host].Round(10*time.Millisecond), 100*res.gwCPU[g.Host].Seconds()/secs)
	}
	if bpid > 0 {
		fmt.Printf("broker (beam.smp) CPU in the window: %v (%.1f%% of a core)\n", res.brokerCPU.Round(10*time.Millisecond), 100*res.brokerCPU.Seconds()/secs)
	}
	fmt.Println()
	return res, nil
}

// printSummary prints the phase's lines of the summary.
func (r *presenceResult) printSummary() {
	secs := r.window.Seconds()
	var mem []string
	for i, h := range r.hosts {
		mem = append(mem, fmt.Sprintf("%s %s (%d entities; idle %s)", h, benchkit.MiB(r.full[h].RSS), r.perHost[i], benchkit.MiB(r.idle[h].RSS)))
	}
	fmt.Printf("3. presence, %d entities, interval %v: %.2f msgs/s, %.1f KiB/s on bridge.roster (%d msgs, %d bytes in %.1fs)\n",
		*flagEntities, *flagInterval, float64(r.msgs)/secs, float64(r.bytes)/1024/secs, r.msgs, r.bytes, secs)
	fmt.Printf("   gateway VmRSS: %s\n", strings.Join(mem, "; "))
}
