// Command benchlocal measures a real fleet-gw on this machine: durable
// sender-to-pull-receiver throughput over the socket API, each sender
// count followed at once by its floor (a group-commit append + fdatasync
// writer group, groupcommit.go) and by raw bbolt with one fsync'd commit
// per put; the wall time of one fleet-send call beside a static Go hello
// world and one fdatasync; and the gateway's resident memory idle and with
// many entities.
//
// It starts bin/fleet-gw run in a temporary state folder with its own
// socket, and always stops it again (SIGTERM, then SIGKILL), also on error,
// on SIGINT/SIGTERM and when the overall -timeout passes. Missed targets are
// reported, never turned into a failing exit status.
//
//	go run ./scripts/benchlocal [-n 20000] [-calls 200] [-entities 1000]
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
	bolt "go.etcd.io/bbolt"
)

// Targets.
const (
	targetDurable = 0.8                     // gateway throughput ÷ the group-commit floor, same writers
	targetPerCall = 1.5                     // fleet-send p50 ÷ a static Go hello world's
	readyTimeout  = 10 * time.Second        // gateway start
	rssSettle     = 500 * time.Millisecond  // before reading VmRSS
	settle        = 1500 * time.Millisecond // after a throughput run: the gateway checkpoints within a second
)

var (
	flagBin      = flag.String("bin", "bin", "folder holding the fleet-gw and fleet-send binaries")
	flagN        = flag.Int("n", 20000, "messages per gateway throughput run")
	flagRawN     = flag.Int("raw-n", 0, "puts per raw bbolt run (0: same as -n)")
	flagBody     = flag.Int("body", 512, "message body size in bytes")
	flagSenders  = flag.String("senders", "1,8", "comma-separated concurrent sender counts")
	flagCalls    = flag.Int("calls", 200, "fleet-send (and /bin/true) exec calls")
	flagEntities = flag.Int("entities", 1000, "entities to register for the memory figure")
	flagDir      = flag.String("dir", "", "parent of the temporary folders (default $TMPDIR); gateway and raw bbolt share it")
	flagPidfile  = flag.String("pidfile", "", "write the gateway's pid here while it runs (for a wrapper's cleanup)")
	flagKeep     = flag.Bool("keep", false, "keep the temporary folder (gateway log, state)")
	flagTimeout  = flag.Duration("timeout", 20*time.Minute, "overall bound: stop the gateway and exit 3 when it passes")
	flagFloor    = flag.String("floor", "", "folder holding the floor baselines hello and minsend (built from scripts/benchlocal/floor like the fleet binaries); empty: not measured")
	flagPprof    = flag.Int("pprof-port", 0, "give the gateway FLEET_PPROF_ADDR=127.0.0.1:PORT (served only by a fleet-gw built with -tags pprof); 0: none")
)

// floorTimes are the per-call floors (-floor), when measured.
type floorTimes struct{ hello, min time.Duration }

var floor *floorTimes

func main() {
	flag.Parse()
	benchkit.Main("benchlocal", "stopping the gateway", *flagTimeout, run)
}

// ---- the gateway process ----

// startGateway starts bin/fleet-gw run in dir (host "bench", no broker)
// through the shared launcher.
func startGateway(bin, dir string) (*benchkit.Gateway, error) {
	var env []string
	if addr, err := freePort(); err == nil {
		metricsURL = "http://" + addr + "/metrics"
		env = append(env, "FLEET_METRICS_LISTEN="+addr)
	}
	if *flagPprof > 0 {
		env = append(env, fmt.Sprintf("FLEET_PPROF_ADDR=127.0.0.1:%d", *flagPprof))
	}
	// a run measures the store, not the inbox cap: room for all of it
	// even if the receiver falls behind (every inbox is capped: fleet(7))
	env = append(env, fmt.Sprintf("FLEET_INBOX_MAX_LENGTH=%d", max(*flagN, 10000)))
	// and the store, not pair-rate (30 a minute by default: fleet(7),
	// LOOPS AND RATES): one sender sends one recipient all of it
	env = append(env, "FLEET_PAIR_RATE=0")
	return benchkit.StartGateway(benchkit.GatewayConfig{
		Bin: bin, Dir: dir, Host: "bench", Pidfile: *flagPidfile, Ready: readyTimeout, Env: env,
	})
}

// metricsURL is the gateway's /metrics, where its store's log flushes are
// counted ("" when no port could be found).
var metricsURL string

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// flushes reads how many store log flushes the gateway made so far and
// their total time (zeros when unreadable).
func flushes() (n float64, took time.Duration) {
	if metricsURL == "" {
		return 0, 0
	}
	resp, err := http.Get(metricsURL)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch k {
		case "fleet_store_flush_seconds_count":
			n = f
		case "fleet_store_flush_seconds_sum":
			took = time.Duration(f * float64(time.Second))
		}
	}
	return n, took
}

// ---- helpers ----

func makeBody(n int) string {
	const text = "fleet local benchmark payload, plain ASCII so JSON needs no escaping. "
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(text)
	}
	return b.String()[:n]
}

// ---- a. gateway throughput ----

type tpResult struct {
	senders  int
	n        int
	elapsed  time.Duration // first send to the receiver's last ack on disk
	sendDone time.Duration // first send to the last sender's last accepted
	batches  int
	lat      []time.Duration // per-send round trips, sorted
	gwCPU    time.Duration   // the gateway's CPU time during the run
	gwSwitch int64           // the gateway's context switches during the run (all its threads)
	flushes  float64         // the gateway's store log flushes (write + fdatasync) during the run
	flushT   time.Duration   // their total time
	benchCPU time.Duration   // this process's (the clients') CPU time
}

func (r tpResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// round is one sender count's gateway run and its floors, run right after.
type round struct {
	tp   tpResult
	gc   groupResult
	bolt rawResult
}

// throughput registers one pull receiver and `senders` senders, starts a
// following receiver, then has every sender send its share sequentially on
// its own connection, and times until the receiver's last ack is durable
// (the gateway answers the recv with End only after committing the ack that
// reaches -max).
func throughput(g *benchkit.Gateway, admin *api.Client, tag string, senders, n int, body string) (tpResult, error) {
	res := tpResult{senders: senders, n: n}
	rname := tag + "-r"
	rtok, err := benchkit.Join(admin, rname)
	if err != nil {
		return res, err
	}
	clients := make([]*api.Client, senders)
	for i := range clients {
		tok, err := benchkit.Join(admin, fmt.Sprintf("%s-s%d", tag, i))
		if err != nil {
			return res, err
		}
		if clients[i], err = g.Dial(tok); err != nil {
			return res, err
		}
		defer clients[i].Close()
	}
	rc, err := g.Dial(rtok)
	if err != nil {
		return res, err
	}
	defer rc.Close()
	if err := rc.Send(&api.RecvRequest{Follow: true, Max: n}); err != nil {
		return res, err
	}

	type recvOut struct {
		ids     map[string]bool
		batches int
		end     time.Time
		err     error
	}
	recvDone := make(chan recvOut, 1)
	go func() {
		out := recvOut{ids: make(map[string]bool, n)}
		for {
			resp, err := rc.Read()
			if err != nil {
				out.err = err
				recvDone <- out
				return
			}
			if resp.End {
				out.end = time.Now()
				recvDone <- out
				return
			}
			out.batches++
			acks := make([]string, 0, len(resp.Batch))
			for _, d := range resp.Batch {
				acks = append(acks, d.Envelope.MsgID)
				out.ids[d.Envelope.MsgID] = true
			}
			if err := rc.Send(&api.AckRequest{Acks: acks}); err != nil {
				out.err = err
				recvDone <- out
				return
			}
		}
	}()

	start := make(chan struct{})
	var wg sync.WaitGroup
	lats := make([][]time.Duration, senders)
	sent := make([][]string, senders)
	errs := make([]error, senders)
	ends := make([]time.Time, senders)
	for i := range clients {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			k := benchkit.Split(n, senders, i)
			lats[i] = make([]time.Duration, 0, k)
			sent[i] = make([]string, 0, k)
			<-start
			for j := 0; j < k; j++ {
				t := time.Now()
				resp, err := clients[i].Call(&api.SendRequest{To: rname, Body: body})
				if err != nil {
					errs[i] = err
					return
				}
				lats[i] = append(lats[i], time.Since(t))
				if resp.Sent == nil || resp.Sent.State != "accepted" {
					errs[i] = fmt.Errorf("send: unexpected reply %+v", resp.Sent)
					return
				}
				sent[i] = append(sent[i], resp.Sent.MsgID)
			}
			ends[i] = time.Now()
		}(i)
	}
	gw0, self0, sw0 := g.CPU(), benchkit.SelfCPU(), contextSwitches(g.Pid())
	fl0, flT0 := flushes()
	t0 := time.Now()
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		rc.Close() // unblock the receiver
		<-recvDone
		return res, fmt.Errorf("%d sender(s): %w", senders, err)
	}
	for _, e := range ends {
		if d := e.Sub(t0); d > res.sendDone {
			res.sendDone = d
		}
	}
	out := <-recvDone // bounded by the overall -timeout
	res.gwCPU, res.benchCPU, res.gwSwitch = g.CPU()-gw0, benchkit.SelfCPU()-self0, contextSwitches(g.Pid())-sw0
	fl1, flT1 := flushes()
	res.flushes, res.flushT = fl1-fl0, flT1-flT0
	if out.err != nil {
		return res, fmt.Errorf("receiver: %w", out.err)
	}
	res.elapsed = out.end.Sub(t0)
	res.batches = out.batches
	total := 0
	for i := range sent {
		total += len(sent[i])
		for _, id := range sent[i] {
			if !out.ids[id] {
				return res, fmt.Errorf("message %s was accepted but never received", id)
			}
		}
		res.lat = append(res.lat, lats[i]...)
	}
	if total != n || len(out.ids) != n {
		return res, fmt.Errorf("sent %d, received %d distinct, want %d", total, len(out.ids), n)
	}
	res.lat = benchkit.Sorted(res.lat)
	return res, nil
}

// contextSwitches sums the voluntary and involuntary context switches of
// every thread of process pid (-1 when unreadable): a count, steadier on
// a busy machine than any time.
func contextSwitches(pid int) int64 {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return -1
	}
	var n int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// ---- b. raw bbolt baseline ----

type rawResult struct {
	mode    string // "Update" or "Batch"
	writers int
	n       int
	elapsed time.Duration
}

func (r rawResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// rawBolt does n puts of size bytes into a fresh bbolt file (opened like the
// store opens its own) from `writers` goroutines, each put its own
// db.Update (one commit, one fsync) or its own db.Batch call.
func rawBolt(dir, mode string, writers, n, size int) (rawResult, error) {
	res := rawResult{mode: mode, writers: writers, n: n}
	path := filepath.Join(dir, fmt.Sprintf("raw-%s-%d.db", strings.ToLower(mode), writers))
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		return res, err
	}
	defer os.Remove(path)
	defer db.Close()
	bucket := []byte("b")
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	}); err != nil {
		return res, err
	}
	val := []byte(makeBody(size))
	do := db.Update
	if mode == "Batch" {
		do = db.Batch
	}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	start := make(chan struct{})
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			k := benchkit.Split(n, writers, w)
			<-start
			for i := 0; i < k; i++ {
				var key [8]byte
				binary.BigEndian.PutUint64(key[:], uint64(w)<<32|uint64(i))
				if err := do(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(key[:], val) }); err != nil {
					errs[w] = err
					return
				}
			}
		}(w)
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	res.elapsed = time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	var got int
	if err := db.View(func(tx *bolt.Tx) error { got = tx.Bucket(bucket).Stats().KeyN; return nil }); err != nil {
		return res, err
	}
	if got != n {
		return res, fmt.Errorf("raw %s: %d keys stored, want %d", mode, got, n)
	}
	return res, nil
}

// ---- c. per-call wall time of an exec'd command ----

// execTimes runs each of cmds calls times, interleaved (so drift hits all
// alike), every one the same way: exec.Command, the same environment,
// stdout and stderr captured. It returns sorted wall times per command.
func execTimes(env []string, calls int, cmds [][]string) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(cmds))
	once := func(argv []string) (time.Duration, error) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		t := time.Now()
		err := cmd.Run()
		d := time.Since(t)
		if err != nil {
			return d, fmt.Errorf("%s: %v: %s", filepath.Base(argv[0]), err, strings.TrimSpace(stderr.String()))
		}
		return d, nil
	}
	// warm the page cache and the gateway
	for i := 0; i < 5; i++ {
		for _, argv := range cmds {
			if _, err := once(argv); err != nil {
				return nil, err
			}
		}
	}
	for i := 0; i < calls; i++ {
		for k, argv := range cmds {
			d, err := once(argv)
			if err != nil {
				return nil, err
			}
			out[k] = append(out[k], d)
		}
	}
	for k := range out {
		out[k] = benchkit.Sorted(out[k])
	}
	return out, nil
}

// inprocSend times, in this process, what fleet-send does minus the
// process: dial, hello, send (durable), close.
func inprocSend(g *benchkit.Gateway, token, to, body string, calls int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, calls)
	for i := 0; i < calls; i++ {
		t := time.Now()
		c, err := g.Dial(token)
		if err != nil {
			return nil, err
		}
		_, err = c.Call(&api.SendRequest{To: to, Body: body})
		c.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return benchkit.Sorted(out), nil
}

// ---- run ----

func run() error {
	senderCounts, err := parseCounts(*flagSenders)
	if err != nil {
		return err
	}
	if *flagN <= 0 || *flagCalls <= 0 || *flagBody <= 0 || *flagEntities < 0 {
		return errors.New("-n, -calls and -body must be positive, -entities not negative")
	}
	rawN := *flagRawN
	if rawN <= 0 {
		rawN = *flagN
	}
	bin, err := filepath.Abs(*flagBin)
	if err != nil {
		return err
	}
	for _, b := range []string{"fleet-gw", "fleet-send"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("%s not built (run make build): %w", filepath.Join(bin, b), err)
		}
	}
	tmp, err := os.MkdirTemp(*flagDir, "fleet-bench-")
	if err != nil {
		return err
	}
	if *flagKeep {
		fmt.Printf("temporary folder kept: %s\n", tmp)
	} else {
		benchkit.AtCleanup(func() { os.RemoveAll(tmp) })
	}
	body := makeBody(*flagBody)

	host, _ := os.Hostname()
	fmt.Printf("fleet local benchmark — %s, %s/%s, %d CPUs, GOMAXPROCS %d, %s\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), time.Now().Format(time.RFC3339))
	fmt.Printf("state and raw bbolt files under %s (%s filesystem); load average at start: %s\n", tmp, benchkit.FSType(tmp), benchkit.Loadavg())
	fmt.Printf("body %d bytes; throughput N=%d per run; raw N=%d; exec calls %d; entities %d\n\n",
		*flagBody, *flagN, rawN, *flagCalls, *flagEntities)

	g, err := startGateway(bin, tmp)
	if err != nil {
		return err
	}
	fmt.Printf("fleet-gw pid %d, socket %s\n\n", g.Pid(), g.Socket)
	admin, err := g.Dial("")
	if err != nil {
		return err
	}
	defer admin.Close()

	// d. memory: idle, then with the entities (registered before any
	// traffic, so the figure is the registry's cost, not leftover buffers).
	fmt.Println("== d. gateway resident memory (VmRSS, /proc/PID/status)")
	time.Sleep(rssSettle)
	idle, err := g.Memory()
	if err != nil {
		return err
	}
	fmt.Printf("idle, 0 entities:         VmRSS %s  (anon %s, file %s; threads %d)\n", benchkit.MiB(idle.RSS), benchkit.MiB(idle.Anon), benchkit.MiB(idle.File), idle.Threads)
	joinStart := time.Now()
	names := make([]string, *flagEntities)
	for i := range names {
		names[i] = fmt.Sprintf("ent%05d", i)
	}
	if _, err := benchkit.JoinMany(g, names, 8); err != nil {
		return err
	}
	joinTook := time.Since(joinStart)
	time.Sleep(rssSettle)
	full, err := g.Memory()
	if err != nil {
		return err
	}
	perEnt := 0.0
	if *flagEntities > 0 {
		perEnt = float64(full.RSS-idle.RSS) / float64(*flagEntities)
	}
	fmt.Printf("%d entities (OpJoin):   VmRSS %s  (anon %s, file %s; threads %d, VmHWM %s; +%.1f KiB per entity)\n",
		*flagEntities, benchkit.MiB(full.RSS), benchkit.MiB(full.Anon), benchkit.MiB(full.File), full.Threads, benchkit.MiB(full.HWM), perEnt)
	fmt.Printf("registering them took %v (%.0f joins/s, 8 connections)\n\n", joinTook.Round(time.Millisecond),
		float64(*flagEntities)/joinTook.Seconds())

	// a. throughput, each sender count beside its floors in turn
	fmt.Printf("== a. durable throughput, sender -> pull receiver (%d-byte bodies, N=%d, fsync before accepted),\n", *flagBody, *flagN)
	fmt.Printf("      each run between two runs of the group-commit floor (the figure: both together) and followed by raw bbolt,\n")
	fmt.Printf("      with as many writers (N=%d each, same folder, gateway idle)\n", rawN)
	var rounds []round
	for _, s := range senderCounts {
		gc1, err := groupCommit(tmp, s, rawN, *flagBody)
		if err != nil {
			return err
		}
		r, err := throughput(g, admin, fmt.Sprintf("tp%d", s), s, *flagN, body)
		if err != nil {
			return err
		}
		fmt.Printf("%d sender(s): %8.0f msgs/s  (all %d acked in %v; senders done in %v; %d recv batches; send round trip p50 %s p99 %s)\n",
			s, r.rate(), r.n, r.elapsed.Round(time.Millisecond), r.sendDone.Round(time.Millisecond), r.batches,
			benchkit.Ms(benchkit.Pct(r.lat, 50)), benchkit.Ms(benchkit.Pct(r.lat, 99)))
		fmt.Printf("              CPU: gateway %v (%.0f%% of one core, %.0f µs/msg, %.1f context switches/msg), benchmark clients %v (%.0f%% of one core)\n",
			r.gwCPU.Round(10*time.Millisecond), 100*r.gwCPU.Seconds()/r.elapsed.Seconds(),
			float64(r.gwCPU.Microseconds())/float64(r.n), float64(r.gwSwitch)/float64(r.n),
			r.benchCPU.Round(10*time.Millisecond), 100*r.benchCPU.Seconds()/r.elapsed.Seconds())
		if r.flushes > 0 {
			fmt.Printf("              store log: %.0f flushes, %.2f per message, %.2f ms each on average (write + fdatasync)\n",
				r.flushes, r.flushes/float64(r.n), float64(r.flushT)/float64(time.Millisecond)/r.flushes)
		}
		time.Sleep(settle) // the gateway's checkpoint after its last change is over
		gc2, err := groupCommit(tmp, s, rawN, *flagBody)
		if err != nil {
			return err
		}
		gc := gc1.plus(gc2)
		fmt.Printf("   floor, group-commit append + fdatasync, %d writer(s): %8.0f records/s  (before %.0f, after %.0f; %d flushes, %.2f per record, %.2f ms each)\n",
			s, gc.rate(), gc1.rate(), gc2.rate(), gc.flushes, float64(gc.flushes)/float64(gc.n), float64(gc.elapsed)/float64(time.Millisecond)/float64(gc.flushes))
		floorCPU := float64(gc.cpu.Microseconds()) / float64(gc.n)
		fmt.Printf("   floor's CPU %.1f µs/record (in process); gateway's CPU per message ÷ floor's per record %.1fx\n",
			floorCPU, float64(r.gwCPU.Microseconds())/float64(r.n)/floorCPU)
		b, err := rawBolt(tmp, "Update", s, rawN, *flagBody)
		if err != nil {
			return err
		}
		fmt.Printf("   raw bbolt, db.Update per put, %d writer(s):     %8.0f puts/s  (%v)\n", s, b.rate(), b.elapsed.Round(time.Millisecond))
		rounds = append(rounds, round{tp: r, gc: gc, bolt: b})
	}
	fmt.Println()

	// c. fleet-send per call
	fmt.Printf("== c. per-call wall time, exec'd with FLEET_TOKEN set (%d calls each, interleaved, 5 warm-up)\n", *flagCalls)
	stok, err := benchkit.Join(admin, "exec-s")
	if err != nil {
		return err
	}
	if _, err := benchkit.Join(admin, "exec-r"); err != nil {
		return err
	}
	env := append(append([]string(nil), g.Env...), "FLEET_TOKEN="+stok)
	send := filepath.Join(bin, "fleet-send")
	cmds := [][]string{
		{send, "exec-r", body},
		{"/bin/true", "exec-r", body},
		{send, "--version"},
	}
	if *flagFloor != "" {
		cmds = append(cmds,
			[]string{filepath.Join(*flagFloor, "hello")},
			[]string{filepath.Join(*flagFloor, "minsend"), "exec-r", body})
	}
	times, err := execTimes(env, *flagCalls, cmds)
	if err != nil {
		return err
	}
	sendT, trueT, verT := times[0], times[1], times[2]
	inproc, err := inprocSend(g, stok, "exec-r", body, *flagCalls)
	if err != nil {
		return err
	}
	syncT, err := fsyncCost(tmp, *flagCalls)
	if err != nil {
		return err
	}
	fmt.Printf("fleet-send NAME TEXT:        p50 %s  p99 %s\n", benchkit.Ms(benchkit.Pct(sendT, 50)), benchkit.Ms(benchkit.Pct(sendT, 99)))
	fmt.Printf("/bin/true (process start):   p50 %s  p99 %s\n", benchkit.Ms(benchkit.Pct(trueT, 50)), benchkit.Ms(benchkit.Pct(trueT, 99)))
	fmt.Printf("fleet-send --version:        p50 %s  p99 %s  (Go binary start, no socket)\n", benchkit.Ms(benchkit.Pct(verT, 50)), benchkit.Ms(benchkit.Pct(verT, 99)))
	if *flagFloor != "" {
		helloT, minT := times[3], times[4]
		floor = &floorTimes{hello: benchkit.Pct(helloT, 50), min: benchkit.Pct(minT, 50)}
		fmt.Printf("Go hello world (static):     p50 %s  p99 %s  (the floor of any Go command here)\n", benchkit.Ms(benchkit.Pct(helloT, 50)), benchkit.Ms(benchkit.Pct(helloT, 99)))
		fmt.Printf("minimal client, no CLI:      p50 %s  p99 %s  (dial+hello+send through pkg/api, static)\n", benchkit.Ms(benchkit.Pct(minT, 50)), benchkit.Ms(benchkit.Pct(minT, 99)))
	}
	fmt.Printf("in-process dial+hello+send:  p50 %s  p99 %s  (no process; includes the fsync)\n", benchkit.Ms(benchkit.Pct(inproc, 50)), benchkit.Ms(benchkit.Pct(inproc, 99)))
	fmt.Printf("512-byte write + fdatasync:  p50 %s  p99 %s  (in-process, same folder: the disk's part of one durable send)\n\n", benchkit.Ms(benchkit.Pct(syncT, 50)), benchkit.Ms(benchkit.Pct(syncT, 99)))

	after, err := g.Memory()
	if err != nil {
		return err
	}
	if err := g.Alive(); err != nil {
		return err
	}
	admin.Close()
	g.Stop()

	// b. raw bbolt db.Batch, a reference, with the gateway stopped
	var batchRef *rawResult
	if batchW := senderCounts[len(senderCounts)-1]; batchW > 1 {
		fmt.Printf("== b. raw bbolt db.Batch reference (%d-byte puts, N=%d, same folder, gateway stopped)\n", *flagBody, rawN)
		r, err := rawBolt(tmp, "Batch", batchW, rawN, *flagBody)
		if err != nil {
			return err
		}
		batchRef = &r
		fmt.Printf("db.Batch per put,  %d writers:   %8.0f puts/s  (%v; default MaxBatchDelay 10ms)\n\n", batchW, r.rate(), r.elapsed.Round(time.Millisecond))
	}

	// summary
	fmt.Println("==================== summary ====================")
	for _, r := range rounds {
		fmt.Printf("gateway, %d sender(s):  %8.0f msgs/s   group-commit floor, %d writer(s): %8.0f records/s   ratio %.2fx   (raw bbolt Update: %8.0f puts/s, %.2fx)\n",
			r.tp.senders, r.tp.rate(), r.gc.writers, r.gc.rate(), r.tp.rate()/r.gc.rate(), r.bolt.rate(), r.tp.rate()/r.bolt.rate())
	}
	if batchRef != nil {
		fmt.Printf("raw bbolt db.Batch, %d writers: %8.0f puts/s (reference)\n", batchRef.writers, batchRef.rate())
	}
	fmt.Printf("fleet-send per call:    p50 %s  p99 %s   (/bin/true p50 %s p99 %s; fleet-send --version p50 %s; in-process send p50 %s)\n",
		benchkit.Ms(benchkit.Pct(sendT, 50)), benchkit.Ms(benchkit.Pct(sendT, 99)), benchkit.Ms(benchkit.Pct(trueT, 50)), benchkit.Ms(benchkit.Pct(trueT, 99)), benchkit.Ms(benchkit.Pct(verT, 50)), benchkit.Ms(benchkit.Pct(inproc, 50)))
	fmt.Printf("one 512-byte write + fdatasync here: p50 %s  p99 %s  (a durable send includes one; a hello world none)\n",
		benchkit.Ms(benchkit.Pct(syncT, 50)), benchkit.Ms(benchkit.Pct(syncT, 99)))
	if floor != nil {
		fmt.Printf("floors of that figure:  Go hello world (static) p50 %s; minimal client without a CLI framework p50 %s\n",
			benchkit.Ms(floor.hello), benchkit.Ms(floor.min))
	}
	fmt.Printf("gateway VmRSS:          idle 0 entities %s; %d entities %s (+%.1f KiB/entity); after the load %s (VmHWM %s)\n",
		benchkit.MiB(idle.RSS), *flagEntities, benchkit.MiB(full.RSS), perEnt, benchkit.MiB(after.RSS), benchkit.MiB(after.HWM))
	fmt.Printf("load average at end:    %s (other work on this machine skews every figure)\n", benchkit.Loadavg())
	fmt.Println("targets (issue 13):")
	for _, r := range rounds {
		ratio := r.tp.rate() / r.gc.rate()
		fmt.Printf("  local durable, %d sender(s) >= %.1fx the group-commit floor:  %.2fx  -> %s\n", r.tp.senders, targetDurable, ratio, benchkit.Met(ratio >= targetDurable))
	}
	p50 := benchkit.Pct(sendT, 50)
	if floor != nil {
		ratio := float64(p50) / float64(floor.hello)
		fmt.Printf("  fleet-send p50 <= %.1fx a static Go hello world:  %.2fx (%s / %s)  -> %s\n", targetPerCall, ratio, benchkit.Ms(p50), benchkit.Ms(floor.hello), benchkit.Met(ratio <= targetPerCall))
	} else {
		fmt.Printf("  fleet-send p50 <= %.1fx a static Go hello world:  not measured (no -floor)\n", targetPerCall)
	}
	return nil
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 256 {
			return nil, fmt.Errorf("-senders: %q is not a count from 1 to 256", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("-senders is empty")
	}
	return out, nil
}
