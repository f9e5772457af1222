package gateway_test

// The metrics endpoint of real gateways: real traffic, then a scrape of
// the real HTTP endpoint parsed by Prometheus's own text parser
// (internal/scrape), and the counters checked by the amounts the traffic
// must have moved them.

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/scrape"
	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/trust"
	amqp "github.com/rabbitmq/amqp091-go"
)

// scrape reads g's /metrics as Prometheus would.
func (g *testGW) scrape() scrape.Families {
	g.t.Helper()
	addr := g.G.MetricsAddr()
	if addr == "" {
		g.t.Fatalf("gateway %s serves no metrics", g.Host)
	}
	f, err := scrape.Get("http://" + addr + "/metrics")
	if err != nil {
		g.t.Fatal(err)
	}
	return f
}

// metric is one sample's value in a fresh scrape of g (a histogram: its
// count); 0 when the sample is absent (a labelled counter appears at its
// first increment).
func (g *testGW) metric(name string, labels ...string) float64 {
	g.t.Helper()
	v, _, err := g.scrape().Value(name, labels...)
	if err != nil {
		g.t.Fatal(err)
	}
	return v
}

// waitMetric waits until the sample reads want.
func (g *testGW) waitMetric(want float64, name string, labels ...string) {
	g.t.Helper()
	eventually(g.t, fmt.Sprintf("%s%v = %v on %s", name, labels, want, g.Host), func() error {
		if v := g.metric(name, labels...); v != want {
			return fmt.Errorf("reads %v", v)
		}
		return nil
	})
}

// One gateway, no broker: local traffic moves accepted, delivered and
// dead by the amounts sent; a dead letter is counted with its reason; an
// ask is accepted live and delivered; inbox depth and age follow the
// inboxes; entities show by status; many entities give no more than
// TopN per-entity series; store flushes are timed.
func TestLocalMetrics(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"metrics-listen": "127.0.0.1:0", "delivery-attempts": "2"})
	g.waitLog(`"msg":"metrics served"`)
	f := g.scrape()
	for name, labels := range map[string][]string{
		"fleet_broker_state": {"state", "none"}, "fleet_gateway_info": {"host", "h1"},
	} {
		if v, ok, _ := f.Value(name, labels...); !ok || v != 1 {
			t.Fatalf("%s%v: %v (present %v), want 1", name, labels, v, ok)
		}
	}
	if v, ok, _ := f.Value("fleet_inbox_messages"); !ok || v != 0 {
		t.Fatalf("fleet_inbox_messages at start: %v (present %v)", v, ok)
	}
	flushes := g.metric("fleet_store_flush_seconds")

	alice, bob := g.join("alice"), g.join("bob")
	for i := 1; i <= 3; i++ {
		alice.mustSend("bob", fmt.Sprintf("m%d", i))
	}
	f = g.scrape()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fleet_messages_accepted_total", []string{"kind", "send"}, 3},
		{"fleet_messages_delivered_total", []string{"kind", "send"}, 0},
		{"fleet_inbox_messages", nil, 3},
		{"fleet_inbox_top_messages", []string{"entity", "bob"}, 3},
		{"fleet_inbox_depth", nil, 2}, // entities observed: alice and bob
		{"fleet_presence_entities", []string{"where", "local", "state", "idle"}, 2},
	} {
		if v, _, err := f.Value(c.name, c.labels...); err != nil || v != c.want {
			t.Errorf("after 3 sends: %s%v = %v (%v), want %v", c.name, c.labels, v, err, c.want)
		}
	}
	if f.Count("fleet_inbox_top_messages") != 1 {
		t.Errorf("top inboxes: %d series, want bob's only (alice's is empty)", f.Count("fleet_inbox_top_messages"))
	}
	if age, _, _ := f.Value("fleet_inbox_oldest_age_seconds"); age < 0 || age > 60 {
		t.Errorf("oldest age %v s for messages just sent", age)
	}
	if v, _, _ := f.Value("fleet_store_flush_seconds"); v < flushes+5 {
		t.Errorf("store flushes went from %v to %v over 2 joins and 3 sends", flushes, v)
	}

	bob.collect("m1", "m2", "m3")
	f = g.scrape()
	if v, _, _ := f.Value("fleet_messages_delivered_total", "kind", "send"); v != 3 {
		t.Errorf("delivered after bob drained 3: %v", v)
	}
	if v, _, _ := f.Value("fleet_inbox_messages"); v != 0 {
		t.Errorf("inbox messages after the drain: %v", v)
	}
	if f.Count("fleet_inbox_top_messages") != 0 {
		t.Errorf("top inboxes when all are empty: %v", f.Lines())
	}

	// an entity whose deliveries fail: dead after 2 attempts, with its
	// reason; the sender, on this host, gets a bounce (accepted too)
	g.join("hook", api.JoinRequest{Mode: "inject", Exec: "echo no >&2; exit 3"})
	alice.mustSend("hook", "never")
	g.waitMetric(1, "fleet_messages_dead_total", "kind", "send", "reason", "delivery_failed")
	g.waitMetric(1, "fleet_messages_accepted_total", "kind", "bounce")
	if v := g.metric("fleet_messages_accepted_total", "kind", "send"); v != 4 {
		t.Errorf("accepted sends: %v, want 4", v)
	}
	if got := bodies(alice.take(0)); len(got) != 1 {
		t.Fatalf("alice's bounce: %q", got)
	}

	// an ask: held live, then drained
	c, ask := alice.ask("bob", "q?", "", 10_000)
	bob.collect("q?")
	if _, err := bob.answer(ask.MsgID, "a!"); err != nil {
		t.Fatal(err)
	}
	if a, err := second(t, c); err != nil || a.Body != "a!" {
		t.Fatalf("alice's answer: %+v %v", a, err)
	}
	f = g.scrape()
	for _, what := range []string{"fleet_messages_accepted_total", "fleet_messages_delivered_total"} {
		if v, _, _ := f.Value(what, "kind", "ask"); v != 1 {
			t.Errorf("%s{kind=ask}: %v, want 1", what, v)
		}
	}

	setStatus(t, bob, "busy")
	g.waitMetric(1, "fleet_presence_entities", "where", "local", "state", "busy")

	// many entities: per-entity series for the TopN deepest only
	const n = metrics.TopN + 2
	sent := 0
	for i := range n {
		name := fmt.Sprintf("e%02d", i)
		g.join(name)
		for range i + 1 { // e00 holds 1, e01 2, ... e21 22
			alice.mustSend(name, "x")
			sent++
		}
	}
	f = g.scrape()
	if got := f.Count("fleet_inbox_top_messages"); got != metrics.TopN {
		t.Fatalf("%d per-entity series for %d non-empty inboxes, want %d", got, n, metrics.TopN)
	}
	for i := range n {
		v, ok, _ := f.Value("fleet_inbox_top_messages", "entity", fmt.Sprintf("e%02d", i))
		if in := i >= n-metrics.TopN; ok != in || (in && v != float64(i+1)) {
			t.Errorf("e%02d (depth %d): in the top %v with %v, want in it: %v", i, i+1, ok, v, in)
		}
	}
	if v, _, _ := f.Value("fleet_inbox_messages"); v != float64(sent) {
		t.Errorf("inbox messages %v, want %d", v, sent)
	}
	if v, _, _ := f.Value("fleet_inbox_depth"); v != float64(n+3) { // and alice, bob, hook
		t.Errorf("depth histogram over %v entities, want %d", v, n+3)
	}
}

// The address is checked before anything else: one that cannot be had
// stops the gateway with exit 64 and one line, before its state folder is
// touched; a non-loopback one is served with a warning; none serves
// nothing.
func TestLocalMetricsListen(t *testing.T) {
	dir := t.TempDir()
	h1 := startGW(t, dir, "h1", settings{"metrics-listen": "127.0.0.1:0"})
	taken := h1.G.MetricsAddr()

	cfg := newConfig(t, dir, "h2", settings{"metrics-listen": taken})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := gateway.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil))).Run(ctx)
	fe := faultOf(t, err, fault.Usage)
	if fe.Kind != fault.KindBadConfig || !strings.Contains(err.Error(), "cannot serve metrics on "+taken) ||
		!strings.Contains(err.Error(), "address already in use") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a taken address: %s %q", fe.Kind, err)
	}
	if _, err := os.Stat(cfg.StateDir); !os.IsNotExist(err) {
		t.Errorf("the state folder of a gateway that could not serve metrics was made: %v", err)
	}
	if h1.metric("fleet_gateway_info", "host", "h1") != 1 {
		t.Error("the first gateway's endpoint is not its own")
	}

	open := startGW(t, dir, "h3", settings{"metrics-listen": "0.0.0.0:0"})
	open.waitLog(`"msg":"metrics served beyond this machine, without authentication`)
	if h1.logCount("beyond this machine") != 0 {
		t.Error("a loopback endpoint was warned about")
	}
	_, port, err := net.SplitHostPort(open.G.MetricsAddr())
	if err != nil {
		t.Fatal(err)
	}
	if f, err := scrape.Get("http://127.0.0.1:" + port + "/metrics"); err != nil || f.Count("fleet_gateway_info") != 1 {
		t.Errorf("0.0.0.0: not served on loopback: %v", err)
	}

	off := startGW(t, dir, "h4", nil)
	if a := off.G.MetricsAddr(); a != "" {
		t.Errorf("metrics served by default, on %s", a)
	}
}

// Two hosts through the private broker: a remote send moves the
// recipient's counters and the sender's confirm latency; the broker link
// and presence show; refusals are counted by cause (malformed, newer
// schema, not authentic, replay) from forgeries published with a raw AMQP
// client; a reconnect is counted; a full remote inbox is a cap hit and a
// dead letter on the sender's host.
func TestCrossMetrics(t *testing.T) {
	u := brokerURL(t)
	dir := t.TempDir()
	set := settings{"broker": u, "metrics-listen": "127.0.0.1:0", "inbox-max-length": "2"}
	h1 := &testGW{t: t, Host: "h1", Cfg: newConfig(t, dir, "h1", set), logs: &syncBuffer{}}
	h2 := &testGW{t: t, Host: "h2", Cfg: newConfig(t, dir, "h2", set), logs: &syncBuffer{}}
	enrol(t, h1, h2)
	for _, g := range []*testGW{h1, h2} {
		g.start()
		t.Cleanup(func() { g.stop(); g.noPermissionErrors() })
	}
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	for _, g := range []*testGW{h1, h2} {
		g.waitMetric(1, "fleet_broker_state", "state", "connected")
		g.waitMetric(1, "fleet_presence_hosts", "state", "live")
		g.waitMetric(1, "fleet_presence_entities", "where", "remote", "state", "idle")
	}

	acks := h1.metric("fleet_publish_confirm_seconds", "outcome", "ack")
	alice.mustSend("bob", "across")
	bob.collect("across")
	if v := h1.metric("fleet_publish_confirm_seconds", "outcome", "ack"); v < acks+1 {
		t.Errorf("h1's confirmed publishes went from %v to %v over a remote send", acks, v)
	}
	if v := h1.metric("fleet_messages_accepted_total", "kind", "send"); v != 0 {
		t.Errorf("the sender's host counted a remote send as accepted: %v", v)
	}
	f := h2.scrape()
	for _, what := range []string{"fleet_messages_accepted_total", "fleet_messages_delivered_total"} {
		if v, _, _ := f.Value(what, "kind", "send"); v != 1 {
			t.Errorf("h2 %s{kind=send}: %v, want 1", what, v)
		}
	}

	// forgeries straight into bob's inbox, as the node's administrator
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	publish := func(body []byte, headers amqp.Table) {
		t.Helper()
		if err := ch.Publish(broker.ExMsg, bob.Gid, false, false, amqp.Publishing{Body: body, Headers: headers}); err != nil {
			t.Fatal(err)
		}
	}
	env := func(mod func(*envelope.Envelope)) []byte {
		e := envelope.New(envelope.Send, envelope.Party{Gid: alice.Gid, Name: "alice", Host: "h1"},
			envelope.Party{Gid: bob.Gid, Name: "bob", Host: "h2"}, "forged")
		mod(e)
		b, err := envelope.Encode(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	key, err := trust.HostKey(h1.Cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	signed := func(body []byte) amqp.Table { // as h1's gateway signs
		return amqp.Table{"fleet-host": "h1", "fleet-sig": base64.StdEncoding.EncodeToString(ed25519.Sign(key, body))}
	}
	publish([]byte("not an envelope"), nil)
	publish(env(func(e *envelope.Envelope) { e.Schema = "9.0" }), nil)
	publish(env(func(*envelope.Envelope) {}), nil) // unsigned
	old := env(func(e *envelope.Envelope) { e.Created = time.Now().Add(-30 * 24 * time.Hour) })
	publish(old, signed(old)) // authentic, but older than the dedup window
	for _, c := range [][2]string{
		{"malformed", "malformed"}, {"newer_schema", "newer_schema"}, {"not_authentic", "unsigned"}, {"replay", "replay"},
	} {
		h2.waitMetric(1, "fleet_refused_total", "cause", c[0], "reason", c[1])
	}
	if v := h2.metric("fleet_refused_total", "cause", "not_authentic", "reason", "bad_signature"); v != 0 {
		t.Errorf("a refusal counted that did not happen: %v", v)
	}
	if got := bob.take(0); len(got) != 0 {
		t.Fatalf("bob got forgeries: %q", bodies(got))
	}
	conn.Close()

	// every connection of the test's vhost cut: both gateways reconnect
	vhost := strings.TrimPrefix(mustParse(t, u).Path, "/")
	if out, err := testnode.Ctl("close_all_connections", "-p", vhost, "test: metrics reconnect"); err != nil {
		t.Fatalf("close_all_connections: %v\n%s", err, out)
	}
	for _, g := range []*testGW{h1, h2} {
		g.waitMetric(1, "fleet_broker_reconnects_total")
		g.waitMetric(1, "fleet_broker_state", "state", "connected")
	}

	// bob's gateway goes: his inbox fills at 2 on the broker, the third
	// send is refused there (75), a cap hit and a dead letter on h1
	h2.stop()
	alice.mustSend(bob.Gid, "one")
	alice.mustSend(bob.Gid, "two")
	_, err = alice.send(bob.Gid, "three")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull {
		t.Fatalf("a send to a full inbox: %s %v", fe.Kind, err)
	}
	f = h1.scrape()
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"fleet_inbox_full_total", []string{"kind", "send"}, 1},
		{"fleet_messages_dead_total", []string{"kind", "send", "reason", "inbox_full"}, 1},
		{"fleet_publish_confirm_seconds", []string{"outcome", "nack"}, 2}, // reject-publish nacks, and the one retry
	} {
		if v, _, err := f.Value(c.name, c.labels...); err != nil || v != c.want {
			t.Errorf("after a full inbox: %s%v = %v (%v), want %v", c.name, c.labels, v, err, c.want)
		}
	}
	// bob's host left the view with its leaving notice: gone, bob still known
	h1.waitMetric(0, "fleet_presence_hosts", "state", "live")
	h1.waitMetric(1, "fleet_presence_hosts", "state", "gone")
	h1.waitMetric(1, "fleet_presence_entities", "where", "remote", "state", "gone")
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
