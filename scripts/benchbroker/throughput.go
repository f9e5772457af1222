// Phase: remote throughput, a → pull recipients on b (tracker issue 13,
// point 3), beside raw amqp091-go with the same guarantees (raw.go,
// rawTP) measured in the same run, interleaved, repeated.
//
// Senders are entities on h1, each on its own socket connection making
// OpSend calls one after another, as fleet-send does (each call returns
// once the broker confirmed the message); recipients are pull entities on
// h2, each drained by an OpRecv follow stream that writes every message
// out (JSON, as fleet-recv does when not on a terminal) and then
// acknowledges the batch. A measurement runs from the first send to the
// last message acknowledged by its recipient; every message is checked:
// none lost, none twice, in order per sender → recipient pair.

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

// tpTargets are the throughput targets by number of senders, as ratios
// fleet / raw confirm-each (8 → 1: issue 41, 0.6×).
var tpTargets = map[int]float64{1: 0.6, 8: 0.6}

const (
	tpWait      = 120 * time.Second // one measurement, at most
	tpSettle    = 60 * time.Second  // receipts back at the senders' gateway
	tpPipeline  = 64                // raw pipelined: confirms outstanding per sender
	tpRawPrefix = "bench.tp"
)

// tpConfig is one measured configuration.
type tpConfig struct {
	body, senders, recipients int
}

func (c tpConfig) String() string {
	return fmt.Sprintf("%s, %d sender%s -> %d recipient%s", sizeName(c.body), c.senders, plural(c.senders), c.recipients, plural(c.recipients))
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// rcptOf is the recipient of a sender's k-th message: with as many senders
// as recipients each sender has its own; one sender goes round the
// recipients; many senders to one all write to it.
func (c tpConfig) rcptOf(sender, k int) int { return (sender + k*c.senders) % c.recipients }

// tpBody is a message body of size bytes that says which run, sender,
// recipient and sequence number it is.
func tpBody(run string, sender, rcpt, seq, size int) string {
	s := fmt.Sprintf("%s %d %d %d ", run, sender, rcpt, seq)
	if len(s) < size {
		s += strings.Repeat("x", size-len(s))
	}
	return s
}

// tpSink checks what the recipients receive in one measurement.
type tpSink struct {
	mu       sync.Mutex
	run      string
	want     int
	got      int
	seen     map[[2]int]bool // (sender, seq)
	last     map[[2]int]int  // (sender, recipient) -> last seq
	dups     int
	disorder int
	wrong    int // at the wrong recipient, or unparsable
	done     chan struct{}
	at       time.Time
}

func newSink(run string, want int) *tpSink {
	return &tpSink{run: run, want: want, seen: map[[2]int]bool{}, last: map[[2]int]int{}, done: make(chan struct{})}
}

// arrive records one message taken by recipient rcpt; a message of
// another run is counted by stale.
func (s *tpSink) arrive(body string, rcpt int, stale *atomic.Int64) {
	f := strings.Fields(body[:min(len(body), 64)])
	if len(f) < 5 || f[0] != s.run {
		stale.Add(1)
		return
	}
	sender, e1 := strconv.Atoi(f[1])
	to, e2 := strconv.Atoi(f[2])
	seq, e3 := strconv.Atoi(f[3])
	s.mu.Lock()
	defer s.mu.Unlock()
	if e1 != nil || e2 != nil || e3 != nil || to != rcpt {
		s.wrong++
		return
	}
	k := [2]int{sender, seq}
	if s.seen[k] {
		s.dups++
		return
	}
	s.seen[k] = true
	p := [2]int{sender, rcpt}
	if last, ok := s.last[p]; ok && seq < last {
		s.disorder++
	}
	s.last[p] = seq
	s.got++
	if s.got == s.want {
		s.at = time.Now()
		close(s.done)
	}
}

func (s *tpSink) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dups > 0 || s.disorder > 0 || s.wrong > 0 {
		return fmt.Errorf("%d duplicates, %d out of order per sender->recipient pair, %d at the wrong recipient", s.dups, s.disorder, s.wrong)
	}
	return nil
}

// tpFleet holds the phase's entities and streams.
type tpFleet struct {
	h1, h2  *benchkit.Gateway
	senders []*api.Client
	rnames  []string // recipients' addresses as fleet-send takes them: NAME@HOST
	recvs   []*api.Client
	sink    atomic.Pointer[tpSink]
	stale   atomic.Int64
	errs    chan error
	wg      sync.WaitGroup
	leave   func()
}

func newTPFleet(h1, h2 *benchkit.Gateway, maxS, maxR int) (*tpFleet, error) {
	f := &tpFleet{h1: h1, h2: h2, errs: make(chan error, 64)}
	a1, err := h1.Dial("")
	if err != nil {
		return nil, err
	}
	a2, err := h2.Dial("")
	if err != nil {
		a1.Close()
		return nil, err
	}
	var snames, rnames []string
	for i := 0; i < maxS; i++ {
		snames = append(snames, fmt.Sprintf("tps%02d", i))
	}
	for i := 0; i < maxR; i++ {
		rnames = append(rnames, fmt.Sprintf("tpr%02d", i))
	}
	f.leave = func() {
		for _, n := range snames {
			_, _ = a1.Call(&api.LeaveRequest{Name: n})
		}
		for _, n := range rnames {
			_, _ = a2.Call(&api.LeaveRequest{Name: n})
		}
		a1.Close()
		a2.Close()
	}
	stoks, err := benchkit.JoinMany(h1, snames, 4)
	if err != nil {
		f.close()
		return nil, err
	}
	rtoks, err := benchkit.JoinMany(h2, rnames, 4)
	if err != nil {
		f.close()
		return nil, err
	}
	for _, n := range rnames {
		if err := waitRoster(h1, convergeWait, "throughput", hasEntity(n, h2.Host)); err != nil {
			f.close()
			return nil, err
		}
		f.rnames = append(f.rnames, n+"@"+h2.Host)
	}
	for _, t := range stoks {
		c, err := h1.Dial(t)
		if err != nil {
			f.close()
			return nil, err
		}
		f.senders = append(f.senders, c)
	}
	for i, t := range rtoks {
		c, err := h2.Dial(t)
		if err != nil {
			f.close()
			return nil, err
		}
		if err := c.Send(&api.RecvRequest{Follow: true}); err != nil {
			c.Close()
			f.close()
			return nil, err
		}
		f.recvs = append(f.recvs, c)
		f.wg.Add(1)
		go f.drain(i, c)
	}
	return f, nil
}

// drain is one recipient's fleet-recv --follow: write each batch out,
// then acknowledge it.
func (f *tpFleet) drain(i int, c *api.Client) {
	defer f.wg.Done()
	out := bufio.NewWriterSize(io.Discard, 64<<10)
	enc := json.NewEncoder(out)
	type message struct {
		Type string `json:"type"`
		*envelope.Envelope
	}
	for {
		resp, err := c.Read()
		if err != nil || resp.End {
			return
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			if err := enc.Encode(message{Type: "message", Envelope: d.Envelope}); err != nil {
				f.errs <- err
				return
			}
			acks = append(acks, d.Envelope.MsgID)
		}
		if err := out.Flush(); err != nil {
			return
		}
		if s := f.sink.Load(); s != nil {
			for _, d := range resp.Batch {
				s.arrive(d.Envelope.Body, i, &f.stale)
			}
		} else {
			f.stale.Add(int64(len(resp.Batch)))
		}
		if err := c.Send(&api.AckRequest{Acks: acks}); err != nil {
			return
		}
	}
}

func (f *tpFleet) close() {
	for _, c := range f.recvs {
		c.Close()
	}
	f.wg.Wait()
	for _, c := range f.senders {
		c.Close()
	}
	f.leave()
}

// tpRun is one measurement's outcome.
type tpRun struct {
	rate    float64       // messages per second, first send to last taken
	elapsed time.Duration // the same, as a duration
	sends   time.Duration // fleet: until the last OpSend returned (raw: the last confirm)
	settled time.Duration // fleet: until each sender's last message reads delivered at h1 (its receipt came)
	call    time.Duration // fleet: p50 of one OpSend call
	cpu     map[string]time.Duration
}

// run sends n messages as c says and waits for all of them at the
// recipients, then for each sender's last receipt.
func (f *tpFleet) run(c tpConfig, run string, n int, bpid int) (*tpRun, error) {
	sink := newSink(run, n)
	f.sink.Store(sink)
	defer f.sink.Store(nil)
	cpu0 := map[string]time.Duration{"h1": f.h1.CPU(), "h2": f.h2.CPU(), "broker": brokerCPU(bpid), "bench": benchkit.SelfCPU()}
	lastIDs := make([]string, c.senders)
	calls := make([][]time.Duration, c.senders)
	errs := make([]error, c.senders)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < c.senders; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			cl := f.senders[i]
			for k := 0; k < benchkit.Split(n, c.senders, i); k++ {
				r := c.rcptOf(i, k)
				t := time.Now()
				resp, err := cl.Call(&api.SendRequest{To: f.rnames[r], Body: tpBody(run, i, r, k, c.body)})
				calls[i] = append(calls[i], time.Since(t))
				if err != nil {
					errs[i] = fmt.Errorf("sender %d, message %d: %w", i, k, err)
					return
				}
				lastIDs[i] = resp.Sent.MsgID
			}
		}(i)
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	sends := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	select {
	case <-sink.done:
	case err := <-f.errs:
		return nil, err
	case <-time.After(tpWait):
		sink.mu.Lock()
		got := sink.got
		sink.mu.Unlock()
		return nil, fmt.Errorf("%s: %d of %d messages taken after %v", c, got, n, tpWait)
	}
	elapsed := sink.at.Sub(t0)
	if err := sink.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", c, err)
	}
	// the receipts: each sender's last message delivered, as its
	// sender's gateway knows it (fleet-send --until delivered)
	for i := 0; i < c.senders; i++ {
		if _, err := f.senders[i].Call(&api.WaitRequest{MsgID: lastIDs[i], Until: "delivered", TimeoutMS: tpSettle.Milliseconds()}); err != nil {
			return nil, fmt.Errorf("%s: the receipt of sender %d's last message: %w", c, i, err)
		}
	}
	settled := time.Since(t0)
	res := &tpRun{rate: float64(n) / elapsed.Seconds(), elapsed: elapsed, sends: sends, settled: settled, cpu: map[string]time.Duration{}}
	var all []time.Duration
	for _, c := range calls {
		all = append(all, c...)
	}
	res.call = benchkit.Pct(benchkit.Sorted(all), 50)
	res.cpu["h1"] = f.h1.CPU() - cpu0["h1"]
	res.cpu["h2"] = f.h2.CPU() - cpu0["h2"]
	res.cpu["broker"] = brokerCPU(bpid) - cpu0["broker"]
	res.cpu["bench"] = benchkit.SelfCPU() - cpu0["bench"]
	return res, nil
}

// tpSeries is one configuration's measurements, round by round.
type tpSeries struct {
	cfg                 tpConfig
	fleet, each, piped  []*tpRun
	durable             []*tpRun  // raw confirm-each, fdatasync before each ack: the CPU floor
	ratioEach, ratioPip []float64 // per round
	ratioCPU            []float64 // per round: (h1 + h2) CPU per message ÷ the raw client's
}

type tpResult struct {
	n      int
	rounds int
	series []*tpSeries
	stale  int64
}

func parseInts(s, what string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive number", what, p)
		}
		out = append(out, v)
	}
	return out, nil
}

func throughputPhase(gws []*benchkit.Gateway, vhostURL string, bpid int) (*tpResult, error) {
	h1, h2 := gws[0], gws[1]
	bodies, err := parseInts(*flagTPBodies, "-tp-bodies")
	if err != nil {
		return nil, err
	}
	senders, err := parseInts(*flagTPSend, "-tp-senders")
	if err != nil {
		return nil, err
	}
	rcpts, err := parseInts(*flagTPRcpt, "-tp-recipients")
	if err != nil {
		return nil, err
	}
	var cfgs []tpConfig
	for _, b := range bodies {
		for _, r := range rcpts {
			for _, s := range senders {
				cfgs = append(cfgs, tpConfig{body: b, senders: s, recipients: r})
			}
		}
	}
	n := *flagTPMsgs
	fmt.Printf("== throughput: %s@%s -> pull recipients@%s, %d messages per measurement, %d rounds; raw amqp091-go beside it in the same run, interleaved\n",
		"senders", h1.Host, h2.Host, n, *flagTPRounds)
	fmt.Println("   fleet: OpSend per message on each sender's socket connection (returns once the broker confirmed it), OpRecv --follow per recipient (written out, then acked)")
	fmt.Println("   raw: persistent, mandatory, publisher confirms, one channel per sender on one connection; one consumer per queue on another (prefetch 64), manual ack of each delivery once the consumer has it;")
	fmt.Printf("        confirm-each (wait for each confirm before the next publish) and pipelined (up to %d confirms outstanding per sender);\n", tpPipeline)
	fmt.Println("        durable: confirm-each with each consumer writing the body to a file and fdatasyncing it before the ack, its CPU (this process: both sides) and the broker's read around it: the CPU floor")
	maxS, maxR := slices.Max(senders), slices.Max(rcpts)
	f, err := newTPFleet(h1, h2, maxS, maxR)
	if err != nil {
		return nil, err
	}
	defer f.close()
	raw, err := newRawTP(vhostURL, h2.Dir, maxS, maxR)
	if err != nil {
		return nil, err
	}
	defer raw.close()

	// warm-up, unmeasured: every path once
	warm := tpConfig{body: bodies[0], senders: maxS, recipients: maxR}
	if _, err := f.run(warm, "warm", min(n, 8*maxS), bpid); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if _, err := raw.run(warm, "warm", min(n, 8*maxS), false); err != nil {
		return nil, fmt.Errorf("raw warm-up: %w", err)
	}
	res := &tpResult{n: n, rounds: *flagTPRounds}
	for _, c := range cfgs {
		res.series = append(res.series, &tpSeries{cfg: c})
	}
	for round := 0; round < *flagTPRounds; round++ {
		for ci, s := range res.series {
			c := s.cfg
			run := fmt.Sprintf("r%dc%d", round, ci)
			// the order of the four rotates from round to round
			var fr, er, pr, dr *tpRun
			for k := 0; k < 4; k++ {
				var err error
				switch (k + round) % 4 {
				case 0:
					fr, err = f.run(c, run+"f", n, bpid)
				case 1:
					er, err = raw.run(c, run+"e", n, false)
				case 2:
					pr, err = raw.run(c, run+"p", n, true)
				case 3:
					dr, err = raw.runDurable(c, run+"d", n, bpid)
				}
				if err != nil {
					return nil, err
				}
				time.Sleep(200 * time.Millisecond) // the broker's and gateways' leftovers
			}
			s.fleet, s.each, s.piped, s.durable = append(s.fleet, fr), append(s.each, er), append(s.piped, pr), append(s.durable, dr)
			s.ratioEach, s.ratioPip = append(s.ratioEach, fr.rate/er.rate), append(s.ratioPip, fr.rate/pr.rate)
			s.ratioCPU = append(s.ratioCPU, float64(fr.cpu["h1"]+fr.cpu["h2"])/float64(dr.cpu["raw"]))
			fmt.Printf("round %d  %-34s fleet %6.0f msgs/s (OpSend p50 %s; sends done %s, receipts %s; CPU/msg h1 %.0f µs, h2 %.0f µs, broker %.0f µs)   raw each %6.0f (%.2fx)   raw pipelined %6.0f (%.2fx)\n",
				round+1, c, fr.rate, benchkit.Ms(fr.call), secs(fr.sends), secs(fr.settled),
				perOp(fr.cpu["h1"], n), perOp(fr.cpu["h2"], n), perOp(fr.cpu["broker"], n),
				er.rate, fr.rate/er.rate, pr.rate, fr.rate/pr.rate)
			fmt.Printf("         %-34s raw durable %6.0f msgs/s (CPU/msg raw client %.0f µs, both sides; broker %.0f µs): fleet h1+h2 ÷ raw client %.2fx, broker ÷ raw's %.2fx\n",
				"", dr.rate, perOp(dr.cpu["raw"], n), perOp(dr.cpu["broker"], n),
				float64(fr.cpu["h1"]+fr.cpu["h2"])/float64(dr.cpu["raw"]), float64(fr.cpu["broker"])/float64(dr.cpu["broker"]))
		}
	}
	res.stale = f.stale.Load()
	fmt.Println("(the table is in the summary)")
	fmt.Println()
	return res, nil
}

// tpCPUTarget is issue 41's: a gateway's CPU per remote message at most
// twice the raw client's (here both gateways over the raw client's both
// sides).
const tpCPUTarget = 2.0

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// rng formats the range and median of xs with format.
func rng(xs []float64, format string) string {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if len(s) == 1 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
}

func rates(rs []*tpRun) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, r.rate)
	}
	return out
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// printSummary prints the table: median (range) over the rounds, the ratios per
// round, and the target.
func (r *tpResult) printSummary() {
	indent := ""
	fmt.Printf("%sthroughput: remote throughput, %d messages per measurement, %d rounds: median (range) msgs/s; ratio = fleet / raw of the same round\n", indent, r.n, r.rounds)
	for _, s := range r.series {
		target, has := tpTargets[s.cfg.senders]
		verdict := "no target"
		if has {
			verdict = fmt.Sprintf("target >= %.1fx raw each: %s", target, benchkit.Met(median(s.ratioEach) >= target))
		}
		var cpu []string
		for _, k := range []string{"h1", "h2", "broker"} {
			var t time.Duration
			for _, fr := range s.fleet {
				t += fr.cpu[k]
			}
			cpu = append(cpu, fmt.Sprintf("%s %.0f", k, perOp(t, r.n*len(s.fleet))))
		}
		fmt.Printf("%s  %-34s fleet %s   raw each %s   raw pipelined %s\n", indent, s.cfg,
			rng(rates(s.fleet), "%.0f"), rng(rates(s.each), "%.0f"), rng(rates(s.piped), "%.0f"))
		fmt.Printf("%s  %-34s ratio to raw each %s, to raw pipelined %s; %s; fleet CPU µs/msg: %s\n", indent, "",
			rng(s.ratioEach, "%.2fx"), rng(s.ratioPip, "%.2fx"), verdict, strings.Join(cpu, ", "))
		var rawCPU, rawBroker time.Duration
		for _, dr := range s.durable {
			rawCPU, rawBroker = rawCPU+dr.cpu["raw"], rawBroker+dr.cpu["broker"]
		}
		fmt.Printf("%s  %-34s CPU floor, raw client (publish with confirm, consume, fdatasync, ack; both sides) %.0f µs/msg, its broker %.0f µs/msg; "+
			"fleet h1+h2 ÷ raw client %s (target <= %.1fx: %s)\n", indent, "",
			perOp(rawCPU, r.n*len(s.durable)), perOp(rawBroker, r.n*len(s.durable)), rng(s.ratioCPU, "%.2fx"), tpCPUTarget, benchkit.Met(median(s.ratioCPU) <= tpCPUTarget))
	}
	if r.stale > 0 {
		fmt.Printf("%s  (%d deliveries of earlier measurements arrived late)\n", indent, r.stale)
	}
}
