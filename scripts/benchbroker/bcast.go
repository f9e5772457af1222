// Phase 2: one fleet-bcast reaching every pull inbox over h1, h2, h3 (the
// raw fan-out baseline is in raw.go).

package main

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

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

func bcastPhase(gws []*benchkit.Gateway, vhostURL string, bpid int) (*bcastResult, error) {
	n := *flagInboxes
	var spread []string
	for i, g := range gws {
		spread = append(spread, fmt.Sprintf("%d@%s", benchkit.Split(n, len(gws), i), g.Host))
	}
	fmt.Printf("== 2. fleet-bcast to %d pull inboxes (%s; sender bcaster@%s, not a member), %d measured after 1 warm-up\n",
		n, strings.Join(spread, "/"), gws[0].Host, *flagBcasts)
	admin, err := gws[0].Dial("")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	btok, err := benchkit.Join(admin, "bcaster")
	if err != nil {
		return nil, err
	}
	hostOf := make([]string, n)
	gwOf := make([]*benchkit.Gateway, n)
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
			hostOf[idx], gwOf[idx] = g.Host, g
			idx++
		}
		jwg.Add(1)
		go func() {
			defer jwg.Done()
			t, err := benchkit.JoinMany(g, names, 4)
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
		c, err := gwOf[i].Dial(toks[i])
		if err != nil {
			return nil, fmt.Errorf("recv stream %d: %w", i, err)
		}
		clients = append(clients, c)
		if err := c.Send(&api.RecvRequest{Follow: true}); err != nil {
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
				if err := c.Send(&api.AckRequest{Acks: acks}); err != nil {
					return
				}
			}
		}(i, c)
	}
	bc, err := gws[0].Dial(btok)
	if err != nil {
		return nil, err
	}
	defer bc.Close()

	// warm-up: every inbox bound and every stream attached; bounded
	warmStart := time.Now()
	var wr *bround
	for {
		resp, err := bc.Call(&api.BcastRequest{Body: "warm-up"})
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
	sample := envelope.New(envelope.Broadcast, envelope.Party{Gid: ident.NewGid(gws[0].Host), Name: "bcaster", Host: gws[0].Host},
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
		cpu0[g.Host] = g.CPU()
	}
	wall0 := time.Now()
	for k := 0; k < *flagBcasts; k++ {
		time.Sleep(500 * time.Millisecond) // quiet between rounds
		bc0 := brokerCPU(bpid)
		t0 := time.Now()
		resp, err := bc.Call(&api.BcastRequest{Body: fmt.Sprintf("broadcast %d", k)})
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
			ph = append(ph, fmt.Sprintf("%s %s", g.Host, benchkit.Ms(br.perHost[g.Host])))
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
		res.gwCPU[g.Host] = g.CPU() - cpu0[g.Host]
	}
	var cpus []string
	for _, g := range gws {
		cpus = append(cpus, fmt.Sprintf("%s %v", g.Host, res.gwCPU[g.Host].Round(10*time.Millisecond)))
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

func (r *bcastResult) calls() []time.Duration {
	var out []time.Duration
	for _, x := range r.rounds {
		out = append(out, x.call)
	}
	return out
}

// printSummary prints the phase's lines of the summary.
func (r *bcastResult) printSummary() {
	alls := r.alls()
	fmt.Printf("2. fleet-bcast to all %d inboxes (%s): median %s  max %s  over %d broadcasts (OpBcast call p50 %s)\n",
		r.inboxes, r.spread, benchkit.Ms(benchkit.Pct(alls, 50)), benchkit.Ms(alls[len(alls)-1]), len(alls), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.calls()), 50)))
	fmt.Printf("   raw fan-out baseline (one persistent confirmed publish to %d queues): median %s  max %s   (failed broadcasts: %d)\n",
		r.inboxes, benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.rawAll), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.rawAll), 100)), len(r.failed))
	for _, f := range r.failed {
		fmt.Printf("   failed: %s\n", f)
	}
}
