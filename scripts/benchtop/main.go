// Command benchtop measures what watching costs (issue 38 point 4): real
// fleet-gw gateways (default 10) on the private RabbitMQ node, in one
// vhost of their own, with 1,000 pull entities spread over them and 100
// messages a second between them (each from an entity of one host to the
// receiver of another, taken and acknowledged there). On the first
// gateway (h1) it measures, over windows of -window, in repeated rounds:
//
//   - none: the gateway's CPU with nobody watching (the floor, A);
//   - json: with `fleet-roster --watch --json` (stdout to /dev/null);
//   - table: with `fleet-roster --watch` on a terminal (real tmux);
//   - top: with fleet-top on a terminal (real tmux, 120x40), its own CPU
//     and its frames' render times (FLEET_TOP_FRAMES);
//   - both: fleet-top and `fleet-roster --watch` at once.
//
// Each watched window (B) sits between two unwatched ones of the same
// round: its ratio is B over their mean. The target: at most 1.05x for
// each watcher alone. With -pprof-port (and a fleet-gw built with -tags
// pprof) h1 serves pprof, and -profile DIR adds a round 0, left out of
// the summary, that keeps h1's CPU profile of every window
// (gw-CONFIG-0.pprof; the floors gw-none-I.pprof).
//
// It stops every gateway, the tmux server and deletes the vhost on every
// exit path (benchkit.Main); scripts/bench-top.sh finishes from the pid
// files if it cannot. A missed target is reported, never an exit status.
//
//	scripts/bench-top.sh [-gateways 10] [-entities 1000] [-rate 100] [-window 15s] [-rounds 3] [-configs json,table,top,both]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

const (
	target       = 1.05 // a watcher's gateway CPU over the floor's
	readyTimeout = 20 * time.Second
	convergeWait = 120 * time.Second
	settle       = 3 * time.Second // after a watcher starts, before its window
)

var (
	flagBin      = flag.String("bin", "bin", "folder holding the fleet binaries")
	flagBroker   = flag.String("broker", "", "AMQP URL of the private node, without a vhost (default: the output of -rmq url)")
	flagRMQ      = flag.String("rmq", "scripts/rabbitmq-node.sh", "the private node's script (url, ctl)")
	flagVhost    = flag.String("vhost", "benchtop", "vhost to create for the run and delete after it (refused if it exists)")
	flagGateways = flag.Int("gateways", 10, "gateways h1..hN")
	flagEntities = flag.Int("entities", 1000, "pull entities, spread evenly over the gateways")
	flagRate     = flag.Int("rate", 100, "messages a second, over all gateways")
	flagWindow   = flag.Duration("window", 15*time.Second, "one measured window")
	flagRounds   = flag.Int("rounds", 3, "rounds; each measures every configuration between unwatched windows")
	flagConfigs  = flag.String("configs", "json,table,top,both", "watched configurations: json, table, top, both")
	flagPprof    = flag.Int("pprof-port", 0, "give h1 FLEET_PPROF_ADDR=127.0.0.1:PORT (a fleet-gw built with -tags pprof); 0: none")
	flagProfile  = flag.String("profile", "", "with -pprof-port: a round 0 (not in the summary) keeps h1's CPU profile of every window here")
	flagDir      = flag.String("dir", "", "parent of the temporary folder (default $TMPDIR); keep it short: sockets live there")
	flagPiddir   = flag.String("piddir", "", "write gw-*.pid, tmux (its socket name) and vhost here, for a wrapper's cleanup")
	flagTimeout  = flag.Duration("timeout", 30*time.Minute, "overall bound: clean up and exit 3 when it passes")
)

func main() {
	flag.Parse()
	benchkit.Main("benchtop", "cleaning up (gateways, tmux, vhost)", *flagTimeout, run)
}

func run() error {
	configs := strings.Split(*flagConfigs, ",")
	for _, c := range configs {
		if !slices.Contains([]string{"json", "table", "top", "both"}, c) {
			return fmt.Errorf("-configs: unknown configuration %q (json, table, top, both)", c)
		}
	}
	if *flagGateways < 2 || *flagEntities < 2**flagGateways || *flagRate <= 0 || *flagWindow <= 0 || *flagRounds <= 0 {
		return errors.New("-gateways at least 2, -entities at least two per gateway, -rate, -window and -rounds positive")
	}
	bin, err := filepath.Abs(*flagBin)
	if err != nil {
		return err
	}
	for _, b := range []string{"fleet-gw", "fleet-roster", "fleet-top"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("%s not built (go build -o DIR/ ./cmd/...): %w", filepath.Join(bin, b), err)
		}
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		return errors.New("tmux not found: the table and top configurations run on its terminals")
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
	tmp, err := os.MkdirTemp(*flagDir, "fbt-")
	if err != nil {
		return err
	}
	benchkit.AtCleanup(func() { os.RemoveAll(tmp) })
	if err := node().CreateVhost(*flagVhost); err != nil {
		return err
	}
	host, _ := os.Hostname()
	fmt.Printf("fleet watch-cost benchmark — %s, %s/%s, %d CPUs, %s\n", host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), time.Now().Format(time.RFC3339))
	fmt.Printf("broker %s; %d gateways, %d pull entities, %d messages/s; windows of %v, %d rounds; load average at start: %s\n",
		broker.Redact(vhostURL), *flagGateways, *flagEntities, *flagRate, *flagWindow, *flagRounds, benchkit.Loadavg())
	fmt.Printf("every gateway, the broker, tmux, the watchers and this benchmark share the machine's %d CPUs\n\n", runtime.NumCPU())

	gws, err := startGateways(bin, tmp, vhostURL)
	if err != nil {
		return err
	}
	tr, err := startTraffic(gws)
	if err != nil {
		return err
	}
	defer tr.stop()
	tm := &tmux{sock: fmt.Sprintf("benchtop-%d", os.Getpid()), bin: bin, env: gws[0].Env, dir: tmp}
	if *flagPiddir != "" {
		_ = os.WriteFile(filepath.Join(*flagPiddir, "tmux"), []byte(tm.sock+"\n"), 0o600)
	}
	benchkit.AtCleanup(tm.killServer)
	res := &results{}
	time.Sleep(settle) // the traffic's first seconds
	first := 1
	if *flagProfile != "" && *flagPprof > 0 {
		first = 0 // round 0 profiles every window, and is left out of the summary
	}
	for r := first; r <= *flagRounds; r++ {
		profile := func(cfg string, i int) string {
			if r != 0 {
				return ""
			}
			return filepath.Join(*flagProfile, fmt.Sprintf("gw-%s-%d.pprof", cfg, i))
		}
		keep := res
		if r == 0 {
			keep = &results{}
		}
		floor0, err := measure(gws[0], tr, nil, profile("none", 0), r)
		if err != nil {
			return err
		}
		keep.add("none", floor0, 0)
		for _, cfg := range configs {
			w, err := startWatchers(tm, gws[0], cfg)
			if err != nil {
				return err
			}
			b, err := measure(gws[0], tr, w, profile(cfg, 0), r)
			w.stop()
			if err != nil {
				return err
			}
			floor1, err := measure(gws[0], tr, nil, profile("none", len(keep.wins["none"])), r)
			if err != nil {
				return err
			}
			keep.add("none", floor1, 0)
			a := (floor0.gw + floor1.gw) / 2
			keep.add(cfg, b, float64(b.gw)/float64(a))
			fmt.Printf("round %d  %-5s gateway %s vs floor %s (%.2fx)  watcher CPU %s  %s\n", r, cfg,
				pct(b.gw, b.wall), pct(a, b.wall), float64(b.gw)/float64(a), pct(b.watch, b.wall), b.note)
			floor0 = floor1
		}
	}
	for _, g := range gws {
		if err := g.Alive(); err != nil {
			return err
		}
	}
	fmt.Println("\n==================== summary ====================")
	res.print(configs, tr)
	fmt.Printf("load average at end: %s (other work on this machine skews every figure)\n", benchkit.Loadavg())
	return nil
}

func pct(d, wall time.Duration) string {
	return fmt.Sprintf("%.1f%%", 100*float64(d)/float64(wall))
}

// startGateways starts h1..hN, each trusting every other (as deployed),
// joins the entities, and waits until h1 hears all of them.
func startGateways(bin, root, vhostURL string) ([]*benchkit.Gateway, error) {
	n := *flagGateways
	var gws []*benchkit.Gateway
	for i := 1; i <= n; i++ {
		h := fmt.Sprintf("h%d", i)
		env := []string{"FLEET_BROKER=" + vhostURL, "FLEET_PAIR_RATE=0"}
		if i == 1 && *flagPprof > 0 {
			env = append(env, fmt.Sprintf("FLEET_PPROF_ADDR=127.0.0.1:%d", *flagPprof))
		}
		pidfile := ""
		if *flagPiddir != "" {
			pidfile = filepath.Join(*flagPiddir, "gw-"+h+".pid")
		}
		g, err := benchkit.StartGateway(benchkit.GatewayConfig{
			Bin: bin, Dir: filepath.Join(root, h), Host: h, Env: env,
			TrustFile: filepath.Join(root, "trust"), Pidfile: pidfile, Ready: readyTimeout, WaitBroker: true,
		})
		if err != nil {
			return nil, err
		}
		gws = append(gws, g)
	}
	fmt.Printf("fleet-gw %s, h1 pid %d\n", gws[0].Version, gws[0].Pid())
	return gws, nil
}

// traffic is the steady load: on each gateway, one receiver (r-HOST, a
// follow stream that acknowledges what it takes) and senders (the other
// entities), sending at -rate over all gateways, each to the receiver of
// another host.
type traffic struct {
	sent, taken, failed atomic.Int64
	quit                chan struct{}
	wg                  sync.WaitGroup
	clients             []*api.Client
}

func startTraffic(gws []*benchkit.Gateway) (*traffic, error) {
	tr := &traffic{quit: make(chan struct{})}
	per := *flagEntities / len(gws)
	toks := make([][]string, len(gws))
	for i, g := range gws {
		names := []string{"r-" + g.Host}
		for k := 1; k < per; k++ {
			names = append(names, fmt.Sprintf("e-%s-%d", g.Host, k))
		}
		var err error
		if toks[i], err = benchkit.JoinMany(g, names, 4); err != nil {
			return nil, err
		}
	}
	if err := waitRows(gws[0], per*len(gws)); err != nil {
		return nil, err
	}
	for i, g := range gws {
		c, err := g.Dial(toks[i][0])
		if err != nil {
			return nil, err
		}
		if err := c.Send(&api.RecvRequest{Follow: true}); err != nil {
			return nil, err
		}
		tr.clients = append(tr.clients, c)
		tr.wg.Add(1)
		go tr.drain(c)
	}
	every := time.Duration(float64(time.Second) * float64(len(gws)) / float64(*flagRate))
	for i, g := range gws {
		c, err := g.Dial("")
		if err != nil {
			return nil, err
		}
		tr.clients = append(tr.clients, c)
		tr.wg.Add(1)
		go tr.send(c, i, toks[i][1:], gws, every)
	}
	return tr, nil
}

func (tr *traffic) drain(c *api.Client) {
	defer tr.wg.Done()
	for {
		resp, err := c.Read()
		if err != nil || resp.End {
			return
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			acks = append(acks, d.Envelope.MsgID)
		}
		tr.taken.Add(int64(len(acks)))
		if c.Send(&api.AckRequest{Acks: acks}) != nil {
			return
		}
	}
}

func (tr *traffic) send(c *api.Client, i int, toks []string, gws []*benchkit.Gateway, every time.Duration) {
	defer tr.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	body := strings.Repeat("x", 512)
	for n := 0; ; n++ {
		select {
		case <-tr.quit:
			return
		case <-t.C:
		}
		j := (i + 1 + rand.IntN(len(gws)-1)) % len(gws)
		c.Token = toks[n%len(toks)]
		if _, err := c.Call(&api.SendRequest{To: "r-" + gws[j].Host + "@" + gws[j].Host, Body: body}); err != nil {
			if tr.failed.Add(1) == 1 {
				fmt.Fprintf(os.Stderr, "benchtop: a send failed (counted): %v\n", err)
			}
			continue
		}
		tr.sent.Add(1)
	}
}

func (tr *traffic) stop() {
	close(tr.quit)
	for _, c := range tr.clients {
		c.Close()
	}
	tr.wg.Wait()
}

func waitRows(g *benchkit.Gateway, n int) error {
	c, err := g.Dial("")
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(convergeWait)
	for {
		resp, err := c.Call(&api.RosterRequest{})
		if err != nil {
			return err
		}
		if len(resp.Entities) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("h1 hears %d of %d entities after %v", len(resp.Entities), n, convergeWait)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ---- the watchers ----

// tmux is a private tmux server for the watchers that need a terminal.
type tmux struct {
	sock, bin, dir string
	env            []string
	n              int
}

func (t *tmux) cmd(args ...string) error {
	out, err := exec.Command("tmux", append([]string{"-L", t.sock}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("tmux %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (t *tmux) killServer() { _ = exec.Command("tmux", "-L", t.sock, "kill-server").Run() }

// start runs argv in a new 120x40 session, with the gateway's environment
// and extra, and returns the session's name and the command's pid.
func (t *tmux) start(extra []string, argv ...string) (string, int, error) {
	t.n++
	name := fmt.Sprintf("w%d", t.n)
	line := "exec env"
	for _, kv := range append(slices.Clone(t.env), extra...) {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "FLEET_") || k == "XDG_CONFIG_HOME" || k == "NO_COLOR" {
			line += " " + shq(kv)
		}
	}
	for _, a := range argv {
		line += " " + shq(a)
	}
	if err := t.cmd("new-session", "-d", "-s", name, "-x", "120", "-y", "40", line); err != nil {
		return "", 0, err
	}
	out, err := exec.Command("tmux", "-L", t.sock, "display-message", "-p", "-t", name, "#{pane_pid}").Output()
	if err != nil {
		return "", 0, fmt.Errorf("tmux display-message: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	return name, pid, err
}

func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// watchers is one configuration's running watchers.
type watchers struct {
	pids     []int
	cmds     []*exec.Cmd
	sessions []string
	tm       *tmux
	frames   string // fleet-top's frames file ("" without fleet-top)
	topPid   int
}

func startWatchers(tm *tmux, g *benchkit.Gateway, cfg string) (*watchers, error) {
	w := &watchers{tm: tm}
	if cfg == "json" {
		cmd := exec.Command(filepath.Join(tm.bin, "fleet-roster"), "--watch", "--json")
		cmd.Env, cmd.Stdout, cmd.Stderr = g.Env, io.Discard, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		w.cmds, w.pids = append(w.cmds, cmd), append(w.pids, cmd.Process.Pid)
	}
	if cfg == "table" || cfg == "both" {
		s, pid, err := tm.start(nil, filepath.Join(tm.bin, "fleet-roster"), "--watch")
		if err != nil {
			return nil, err
		}
		w.sessions, w.pids = append(w.sessions, s), append(w.pids, pid)
	}
	if cfg == "top" || cfg == "both" {
		w.frames = filepath.Join(tm.dir, fmt.Sprintf("frames-%d", tm.n+1))
		s, pid, err := tm.start([]string{"FLEET_TOP_FRAMES=" + w.frames}, filepath.Join(tm.bin, "fleet-top"))
		if err != nil {
			return nil, err
		}
		w.sessions, w.pids, w.topPid = append(w.sessions, s), append(w.pids, pid), pid
	}
	return w, nil
}

func (w *watchers) cpu() time.Duration {
	var d time.Duration
	for _, p := range w.pids {
		d += benchkit.ProcCPU(p)
	}
	return d
}

func (w *watchers) alive() error {
	for _, p := range w.pids {
		if syscall.Kill(p, 0) != nil {
			return fmt.Errorf("watcher pid %d ended early", p)
		}
	}
	return nil
}

func (w *watchers) stop() {
	for _, c := range w.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
		_ = c.Wait()
	}
	for _, s := range w.sessions {
		_ = w.tm.cmd("kill-session", "-t", s)
	}
}

// frameTimes reads the frames fleet-top rendered, from skip on.
func frameTimes(path string, skip int) ([]time.Duration, int) {
	var out []time.Duration
	lines := strings.Split(benchkit.ReadFile(path), "\n")
	n := 0
	for _, l := range lines {
		us, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil {
			continue
		}
		if n++; n > skip {
			out = append(out, time.Duration(us)*time.Microsecond)
		}
	}
	return out, n
}

// ---- a window ----

type window struct {
	wall, gw, watch time.Duration // the window, h1's CPU, the watchers' CPU
	top             time.Duration // fleet-top's own CPU
	frames          []time.Duration
	msgs            int64
	note            string
}

// measure is one window on g, with w watching (nil: none); prof, when
// set, keeps g's CPU profile of the window.
func measure(g *benchkit.Gateway, tr *traffic, w *watchers, prof string, round int) (window, error) {
	var skip int
	if w != nil {
		time.Sleep(settle)
		if w.frames != "" {
			_, skip = frameTimes(w.frames, 0)
		}
	}
	var profErr chan error
	if prof != "" {
		profErr = make(chan error, 1)
		go func() { profErr <- fetchProfile(prof, *flagWindow) }()
	}
	t0, c0, s0 := time.Now(), g.CPU(), tr.sent.Load()
	var w0, top0 time.Duration
	if w != nil {
		w0, top0 = w.cpu(), benchkit.ProcCPU(w.topPid)
	}
	time.Sleep(*flagWindow)
	out := window{wall: time.Since(t0), gw: g.CPU() - c0, msgs: tr.sent.Load() - s0}
	if w != nil {
		if err := w.alive(); err != nil {
			return out, err
		}
		out.watch = w.cpu() - w0
		if w.topPid > 0 {
			out.top = benchkit.ProcCPU(w.topPid) - top0
			out.frames, _ = frameTimes(w.frames, skip)
			s := benchkit.Sorted(out.frames)
			out.note = fmt.Sprintf("fleet-top CPU %s, %d frames, p50 %s p99 %s", pct(out.top, out.wall), len(s),
				benchkit.Ms(benchkit.Pct(s, 50)), benchkit.Ms(benchkit.Pct(s, 99)))
		}
	}
	if profErr != nil {
		if err := <-profErr; err != nil {
			fmt.Fprintf(os.Stderr, "benchtop: profile %s: %v\n", prof, err)
		}
	}
	if err := g.Alive(); err != nil {
		return out, err
	}
	return out, nil
}

func fetchProfile(path string, d time.Duration) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", *flagPprof, int(d.Seconds())))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("pprof: %s (is fleet-gw built with -tags pprof?)", resp.Status)
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// ---- the summary ----

type results struct {
	wins   map[string][]window
	ratios map[string][]float64
}

func (r *results) add(cfg string, w window, ratio float64) {
	if r.wins == nil {
		r.wins, r.ratios = map[string][]window{}, map[string][]float64{}
	}
	r.wins[cfg] = append(r.wins[cfg], w)
	if ratio > 0 {
		r.ratios[cfg] = append(r.ratios[cfg], ratio)
	}
}

func (r *results) print(configs []string, tr *traffic) {
	var gw, wall time.Duration
	var msgs int64
	for _, w := range r.wins["none"] {
		gw, wall, msgs = gw+w.gw, wall+w.wall, msgs+w.msgs
	}
	fmt.Printf("floor (nobody watching): h1's CPU %s of one CPU, over %d windows; %.0f messages/s sent fleet-wide (%d sent, %d taken, %d failed sends)\n",
		pct(gw, wall), len(r.wins["none"]), float64(msgs)/wall.Seconds(), tr.sent.Load(), tr.taken.Load(), tr.failed.Load())
	names := map[string]string{"json": "fleet-roster --watch --json", "table": "fleet-roster --watch (table)", "top": "fleet-top", "both": "fleet-top + fleet-roster --watch"}
	for _, cfg := range configs {
		rs := slices.Sorted(slices.Values(r.ratios[cfg]))
		var strs []string
		for _, x := range r.ratios[cfg] {
			strs = append(strs, fmt.Sprintf("%.2fx", x))
		}
		var gw, wall, watch time.Duration
		var frames []time.Duration
		for _, w := range r.wins[cfg] {
			gw, wall, watch = gw+w.gw, wall+w.wall, watch+w.watch
			frames = append(frames, w.frames...)
		}
		med := rs[len(rs)/2]
		line := fmt.Sprintf("%-34s h1 CPU %s, B/A per round %s, median %.2fx  %s (target <= %.2fx when alone)  watcher CPU %s",
			names[cfg]+":", pct(gw, wall), strings.Join(strs, " "), med, benchkit.Met(med <= target), target, pct(watch, wall))
		if len(frames) > 0 {
			s := benchkit.Sorted(frames)
			line += fmt.Sprintf("; fleet-top frames %d, p50 %s p99 %s", len(s), benchkit.Ms(benchkit.Pct(s, 50)), benchkit.Ms(benchkit.Pct(s, 99)))
		}
		fmt.Println(line)
	}
}

// node is the private node, through -rmq.
func node() benchkit.Node {
	return benchkit.Node{Script: *flagRMQ, Prog: "benchtop", Piddir: *flagPiddir}
}
