// Phase 1: the cross-host ask round trip, with the same-host ask and the
// signatures' share beside it (the raw two-hop baseline is in raw.go).

package main

import (
	"bytes"
	"crypto/ed25519"
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

func startAnswerer(g *benchkit.Gateway, token string, workers int) (*answerer, func(), error) {
	a := &answerer{arrived: map[string]time.Time{}, ids: make(chan string, 4096), states: map[string]int{}}
	rc, err := g.Dial(token)
	if err != nil {
		return nil, nil, err
	}
	if err := rc.Send(&api.RecvRequest{Follow: true}); err != nil {
		rc.Close()
		return nil, nil, err
	}
	var clients []*api.Client
	for i := 0; i < workers; i++ {
		c, err := g.Dial(token)
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
			if err := rc.Send(&api.AckRequest{Acks: acks}); err != nil {
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
				resp, err := c.Call(&api.SendRequest{AnswerTo: id, Body: "ok"})
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
func askOnce(g *benchkit.Gateway, token string, a *answerer, to string) (rt, sent, leg1, dialT time.Duration, err error) {
	td := time.Now()
	c, err := g.Dial(token)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer c.Close()
	t0 := time.Now()
	dialT = t0.Sub(td)
	resp, err := c.Call(&api.AskRequest{To: to, Body: "are you there?", TimeoutMS: askTTL.Milliseconds()})
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

func askPhase(gws []*benchkit.Gateway, vhostURL string, bpid int) (*askResult, error) {
	h1, h2 := gws[0], gws[1]
	fmt.Printf("== 1. cross-host ask -> answer round trip (asker@%s, answerer@%s, %d measured, %d warm-up), raw two-hop beside it\n",
		h1.Host, h2.Host, *flagAsks, *flagWarmup)
	admin1, err := h1.Dial("")
	if err != nil {
		return nil, err
	}
	defer admin1.Close()
	admin2, err := h2.Dial("")
	if err != nil {
		return nil, err
	}
	defer admin2.Close()
	askTok, err := benchkit.Join(admin1, "asker")
	if err != nil {
		return nil, err
	}
	ansTok, err := benchkit.Join(admin2, "answerer")
	if err != nil {
		return nil, err
	}
	localTok, err := benchkit.Join(admin2, "localasker") // asks the answerer on its own host: no broker
	if err != nil {
		return nil, err
	}
	if err := waitRoster(h1, convergeWait, "ask", hasEntity("answerer", h2.Host)); err != nil {
		return nil, err
	}
	if err := waitRoster(h2, convergeWait, "ask", hasEntity("asker", h1.Host)); err != nil {
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
	sample := envelope.New(envelope.Ask, envelope.Party{Gid: ident.NewGid(h1.Host), Name: "asker", Host: h1.Host},
		envelope.Party{Gid: ident.NewGid(h2.Host), Name: "answerer", Host: h2.Host}, "are you there?")
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
			return nil, fmt.Errorf("ask warm-up: only %d of %d tries answered; h1 log:\n%s", okWarm, tries-1, benchkit.Tail(h1.Log))
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
			c0[i] = g.CPU()
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
			gwCPU[i] += g.CPU() - c0[i]
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
		res.gwCPU[g.Host] = gwCPU[i]
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
	fmt.Printf("ratio fleet/raw: p50 %.2fx  p99 %.2fx  (target p50 <= %.1fx)\n",
		ratio(benchkit.Pct(fs, 50), benchkit.Pct(rs, 50)), ratio(benchkit.Pct(fs, 99), benchkit.Pct(rs, 99)), targetAskRatio)
	fmt.Printf("same-host ask round trip (localasker@%s -> answerer@%s, no broker; same answerer): %s  (n=%d)\n", h2.Host, h2.Host, p5099(res.local), len(res.local))
	res.sign, res.verify = edTimes(res.envBytes)
	crypto := 2 * (res.sign + res.verify)
	fmt.Printf("signatures on the round trip (decision 6: the ASK and the ANSWER each signed and verified): 2 x (sign p50 %s + verify p50 %s) = %s,\n",
		benchkit.Ms(res.sign), benchkit.Ms(res.verify), benchkit.Ms(crypto))
	fmt.Printf("   %.0f%% of the raw p50; raw p50 + signatures alone = %.2fx raw, before any socket hop or routing\n",
		100*float64(crypto)/float64(benchkit.Pct(rs, 50)), ratio(benchkit.Pct(rs, 50)+crypto, benchkit.Pct(rs, 50)))
	var cpus []string
	for _, g := range gws {
		cpus = append(cpus, fmt.Sprintf("%s %.0f µs", g.Host, perOp(res.gwCPU[g.Host], len(res.rt))))
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
		if _, err := l.c.Call(&api.LeaveRequest{Name: l.name}); err != nil {
			return nil, fmt.Errorf("leave %s: %w", l.name, err)
		}
	}
	return res, nil
}

// printSummary prints the phase's lines of the summary.
func (r *askResult) printSummary() {
	fs, rs := benchkit.Sorted(r.rt), benchkit.Sorted(r.raw)
	r50, r99 := ratio(benchkit.Pct(fs, 50), benchkit.Pct(rs, 50)), ratio(benchkit.Pct(fs, 99), benchkit.Pct(rs, 99))
	fmt.Printf("1. ask -> answer across hosts (n=%d): p50 %s  p99 %s   raw two-hop (n=%d): p50 %s  p99 %s   ratio p50 %.2fx  p99 %.2fx\n",
		len(fs), benchkit.Ms(benchkit.Pct(fs, 50)), benchkit.Ms(benchkit.Pct(fs, 99)), len(rs), benchkit.Ms(benchkit.Pct(rs, 50)), benchkit.Ms(benchkit.Pct(rs, 99)), r50, r99)
	fmt.Printf("   same-host ask (no broker) p50 %s  p99 %s\n", benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.local), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(r.local), 99)))
	fmt.Printf("   signatures alone (2 signs + 2 verifies): %s = %.2fx raw p50 added to the raw round trip\n",
		benchkit.Ms(2*(r.sign+r.verify)), ratio(benchkit.Pct(rs, 50)+2*(r.sign+r.verify), benchkit.Pct(rs, 50)))
	fmt.Printf("   target ask p50 <= %.1fx raw (issue 13 point 6): %s   (p99 %.2fx; failed asks: %d)\n", targetAskRatio, benchkit.Met(r50 <= targetAskRatio), r99, len(r.failures))
}
