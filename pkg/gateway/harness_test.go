package gateway_test

// The in-process harness: real gateways (real store in a temp folder, real
// socket, the private RabbitMQ node when a test needs one) run inside
// `go test` and are driven through pkg/api, as the commands drive them.
// Tests here prove the gateway's logic quickly; the end-to-end scripts in
// testdata/script prove the real binaries.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
)

// TestMain hands this package's parallel tests to testsched: -parallel N
// places, and a test waiting for the broker node (while a test has it
// alone) or for the cluster holds none of them.
func TestMain(m *testing.M) {
	testsched.Main()
	os.Exit(m.Run())
}

// testGW is one gateway running in this process.
type testGW struct {
	t      testing.TB
	Host   string
	Cfg    *config.Config
	G      *gateway.Gateway
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
	// refusalsExpected: the test takes the gateway's broker login away
	refusalsExpected bool
}

// syncBuffer is the gateway's log, readable while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// settings are configuration keys (as in the config file) for a gateway;
// "file" is the config file's text (for launcher profiles).
type settings map[string]string

// newConfig resolves a gateway's configuration from the defaults and set,
// through the same loader as fleet-gw (no environment, no config file).
func newConfig(t testing.TB, dir, host string, set settings) *config.Config {
	t.Helper()
	all := settings{
		"host": host, "state-dir": filepath.Join(dir, host), "socket": filepath.Join(dir, host+".sock"),
		"retry-base": "20ms", "retry-max": "100ms", "settle-delay": "10ms", "drain-timeout": "2s",
		"heartbeat": "2s", "presence-interval": "200ms", "trust-file": filepath.Join(dir, host, "trust"),
		// tests send one recipient hundreds of messages a second; pair-rate
		// has its own (pairrate_test.go, testdata/script/pair_rate.txtar)
		"pair-rate": "0",
	}
	for k, v := range set {
		all[k] = v
	}
	// A gateway never connects as guest: each host gets its own
	// least-privilege login in the test's vhost, made by the provisioning
	// code (fleet-gw broker-setup's), as in a deployment.
	if u := all["broker"]; strings.Contains(u, "guest:guest@") && u != downBroker {
		login, err := testnode.Login(u, host)
		if err != nil {
			t.Fatal(err)
		}
		all["broker"] = login
	}
	// the config file holds what only it can (launcher profiles): set["file"]
	file := filepath.Join(dir, host+".conf")
	if err := os.WriteFile(file, []byte(all["file"]), 0o600); err != nil {
		t.Fatal(err)
	}
	byEnv := map[string]string{}
	for _, k := range config.Keys {
		if v, ok := all[k.Name]; ok {
			byEnv[k.Env] = v
		}
	}
	cfg, err := config.Load(func(_, env string) (string, bool) {
		v, ok := byEnv[env]
		return v, ok && v != ""
	}, file)
	if err != nil {
		t.Fatalf("config for %s: %v", host, err)
	}
	return cfg
}

// startGW runs a gateway for host under dir until the test ends.
func startGW(t testing.TB, dir, host string, set settings) *testGW {
	t.Helper()
	g := &testGW{t: t, Host: host, Cfg: newConfig(t, dir, host, set), logs: &syncBuffer{}}
	g.start()
	t.Cleanup(func() {
		g.stop()
		g.noPermissionErrors()
	})
	return g
}

// noPermissionErrors fails the test if a gateway running with its own
// least-privilege login logged a broker refusal: in normal operation a
// gateway never tries what its login may not do.
func (g *testGW) noPermissionErrors() {
	if !strings.Contains(g.Cfg.Broker, "fleet-gw-") || g.refusalsExpected {
		return
	}
	for _, l := range strings.Split(g.logs.String(), "\n") {
		if strings.Contains(l, "ACCESS_REFUSED") || strings.Contains(l, "(403)") {
			g.t.Errorf("gateway %s, with its own broker login, logged a permission error: %s", g.Host, l)
			return
		}
	}
}

func (g *testGW) start() {
	g.t.Helper()
	log := slog.New(slog.NewJSONHandler(g.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g.G = gateway.New(g.Cfg, log)
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel, g.done = cancel, make(chan error, 1)
	go func(gw *gateway.Gateway, done chan error) { done <- gw.Run(ctx) }(g.G, g.done)
	select {
	case <-g.G.Ready():
	case err := <-g.done:
		g.done <- err
		g.t.Fatalf("gateway %s did not start: %v\n%s", g.Host, err, g.logs)
	case <-time.After(30 * time.Second):
		g.t.Fatalf("gateway %s not ready within 30s\n%s", g.Host, g.logs)
	}
}

// stop stops the gateway as SIGTERM does (drain, then return) and returns
// what Run returned.
func (g *testGW) stop() {
	if g.cancel == nil {
		return
	}
	g.cancel()
	select {
	case err := <-g.done:
		if err != nil {
			g.t.Logf("gateway %s stopped: %v", g.Host, err)
		}
	case <-time.After(30 * time.Second):
		g.t.Errorf("gateway %s did not stop within 30s", g.Host)
	}
	g.cancel = nil
}

// restart stops the gateway and starts it again on the same state.
func (g *testGW) restart() {
	g.t.Helper()
	g.stop()
	g.start()
}

// dial opens a client acting with token ("" = none).
func (g *testGW) dial(token string) *api.Client {
	g.t.Helper()
	c, err := api.Dial(g.Cfg.Socket)
	if err != nil {
		g.t.Fatalf("dial %s: %v", g.Host, err)
	}
	c.Token = token
	g.t.Cleanup(func() { c.Close() })
	return c
}

// call makes one request on a fresh connection.
func (g *testGW) call(token string, req api.Request) (*api.Response, error) {
	c, err := api.Dial(g.Cfg.Socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.Token = token
	return c.Call(req)
}

// must is call that fails the test on an error.
func (g *testGW) must(token string, req api.Request) *api.Response {
	g.t.Helper()
	resp, err := g.call(token, req)
	if err != nil {
		g.t.Fatalf("%s on %s: %v", api.OpOf(req), g.Host, err)
	}
	return resp
}

// entity is a joined entity: its name, gid and credential.
type entity struct {
	Name, Gid, Token string
	gw               *testGW
}

// join registers a pull entity (or as req says) and returns it.
func (g *testGW) join(name string, req ...api.JoinRequest) entity {
	g.t.Helper()
	r := api.JoinRequest{Mode: "pull"}
	if len(req) > 0 {
		r = req[0]
	}
	r.Name = name
	resp := g.must("", &r)
	return entity{Name: name, Gid: resp.Entity.Gid, Token: resp.Token, gw: g}
}

// send sends body from e to "to" and returns what the gateway said.
func (e entity) send(to, body string) (*api.Sent, error) {
	resp, err := e.gw.call(e.Token, &api.SendRequest{To: to, Body: body})
	if err != nil {
		return nil, err
	}
	return resp.Sent, nil
}

// mustSend is send that fails the test on an error.
func (e entity) mustSend(to, body string) *api.Sent {
	e.gw.t.Helper()
	s, err := e.send(to, body)
	if err != nil {
		e.gw.t.Fatalf("send from %s to %s: %v", e.Name, to, err)
	}
	return s
}

// recv drains e's inbox as fleet-recv does (written out, then acked) and
// returns the bodies in order.
func (e entity) recv() []api.Delivery {
	e.gw.t.Helper()
	c := e.gw.dial(e.Token)
	if err := c.Send(&api.RecvRequest{}); err != nil {
		e.gw.t.Fatal(err)
	}
	var got []api.Delivery
	for {
		resp, err := c.Read()
		if err != nil {
			e.gw.t.Fatalf("recv %s: %v", e.Name, err)
		}
		if resp.End {
			return got
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			got = append(got, d)
			acks = append(acks, d.Envelope.MsgID)
		}
		if err := c.Send(&api.AckRequest{Acks: acks}); err != nil {
			e.gw.t.Fatal(err)
		}
	}
}

// bodies are the message bodies of ds, in order.
func bodies(ds []api.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Envelope.Body
	}
	return out
}

// eventually retries f until it returns nil, or fails the test after 15s
// with f's last error.
func eventually(t testing.TB, what string, f func() error) {
	t.Helper()
	eventuallyWithin(t, 15*time.Second, what, f)
}

// eventuallyWithin is eventually with another bound.
func eventuallyWithin(t testing.TB, bound time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, bound, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// faultOf checks that err is a fault with exit code want and returns it.
func faultOf(t testing.TB, err error, want fault.Code) *fault.Error {
	t.Helper()
	var fe *fault.Error
	if !errors.As(err, &fe) {
		t.Fatalf("want a fault with exit %d, got %v", want, err)
	}
	if fe.Code != want {
		t.Fatalf("want exit %d, got %d: %v", want, fe.Code, err)
	}
	return fe
}

// brokerURL is the private RabbitMQ node's URL for a test that needs one
// (as guest, the node's administrator), in a vhost of its own (deleted
// after; the same one for every call in a test), holding the node's shared test
// lock (the outage scripts of the end-to-end tests take it exclusively).
// make test starts the node and sets FLEET_TEST_BROKER; without it, the
// test starts the node itself.
//
// A broker test runs in parallel with the others (testsched.Take, here,
// at its first call): it spends its time waiting for the broker, for
// rabbitmqctl and for presence rounds, in its own vhost, folder and
// gateways. It shares the node with the other broker tests of this
// package, unless one has it alone (brokerAlone).
func brokerURL(t testing.TB) string {
	t.Helper()
	vhostsMu.Lock()
	u, ok := vhosts[t]
	vhostsMu.Unlock()
	if ok {
		return u
	}
	vhostsMu.Lock()
	isAlone := alone[t]
	vhostsMu.Unlock()
	if pt, ok := t.(*testing.T); ok && !isAlone {
		testsched.Take(pt, testsched.Need{Group: "node"})
	}
	unlock, err := testnode.Lock(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	// with h1's and h2's logins, which most tests here use: made with
	// the vhost, they cost no rabbitmqctl call of their own
	url, drop, err := testnode.Vhost("t-inproc-"+strings.ReplaceAll(t.Name(), "/", "-")+"-"+treeTag, "h1", "h2")
	if err != nil {
		t.Fatal(err)
	}
	vhostsMu.Lock()
	vhosts[t] = url
	vhostsMu.Unlock()
	t.Cleanup(func() {
		drop()
		vhostsMu.Lock()
		delete(vhosts, t)
		vhostsMu.Unlock()
	})
	return url
}

// A test that joins hundreds or thousands of entities (a queue and a
// consumer each on the broker) has the node alone (brokerAlone): beside
// three others on a loaded machine the node answered a join too late (an
// AMQP read timing out).

// alone are the tests that called brokerAlone.
var alone = map[testing.TB]bool{}

// brokerAlone makes t a broker test that runs while no other broker test
// of this package does (still in parallel with the tests without one);
// call it first, then brokerURL as any broker test. long is about how
// long it takes (the longest tests start first).
func brokerAlone(t *testing.T, long time.Duration) {
	t.Helper()
	testsched.Take(t, testsched.Need{Group: "node", Alone: true, Long: long})
	vhostsMu.Lock()
	alone[t] = true
	vhostsMu.Unlock()
	t.Cleanup(func() {
		vhostsMu.Lock()
		delete(alone, t)
		vhostsMu.Unlock()
	})
}

// treeTag tells apart the vhosts of two source trees (git worktrees)
// whose tests share one node at the same time: each test deletes its vhost
// first and last, which would cut the other tree's run of it.
var treeTag = func() string {
	wd, _ := os.Getwd()
	sum := sha256.Sum256([]byte(wd))
	return hex.EncodeToString(sum[:3])
}()

// vhosts are the tests' vhost URLs: one per test, however often asked.
var (
	vhostsMu sync.Mutex
	vhosts   = map[testing.TB]string{}
)

// enrol makes the gateways trust each other, as `fleet-gw trust add` does
// with the lines `fleet-gw key` prints (signing and sealing keys).
func enrol(t testing.TB, gws ...*testGW) {
	t.Helper()
	for _, g := range gws {
		priv, err := trust.HostKey(g.Cfg.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		ring, err := seal.LoadKeyring(g.Cfg.StateDir) // as fleet-gw key prints it
		if err != nil {
			t.Fatal(err)
		}
		line := trust.SealedLine(g.Host, priv.Public().(ed25519.PublicKey), ring.Public().String())
		e, err := trust.ParseLine(line)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range gws {
			if o != g {
				if _, err := trust.Add(o.Cfg.TrustFile, e); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// waitLog waits until the gateway's log has a line containing s.
func (g *testGW) waitLog(s string) {
	g.t.Helper()
	eventually(g.t, fmt.Sprintf("log line %q on %s", s, g.Host), func() error {
		if strings.Contains(g.logs.String(), s) {
			return nil
		}
		return errors.New("not logged")
	})
}

func asFault(err error, fe **fault.Error) bool { return errors.As(err, fe) }
