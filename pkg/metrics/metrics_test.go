package metrics_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/scrape"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/metrics"
)

// serve runs m on a real port and returns its /metrics URL.
func serve(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	ep, err := metrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if ep.Exposed() {
		t.Fatalf("127.0.0.1 counted as exposed")
	}
	ep.Serve(m)
	t.Cleanup(func() { ep.Close() })
	return "http://" + ep.Addr() + "/metrics"
}

func value(t *testing.T, f scrape.Families, name string, labels ...string) float64 {
	t.Helper()
	v, ok, err := f.Value(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("no sample %s%v", name, labels)
	}
	return v
}

// Thousands of entities stay a bounded number of series: the inboxes are
// totals, one histogram and the TopN deepest by name; states outside a
// label's vocabulary read "other"; the scrape is what Prometheus's own
// parser accepts.
func TestBoundedCardinality(t *testing.T) {
	now := time.Now()
	snap := metrics.Snapshot{Broker: "connected", Hosts: map[string]int{"live": 3, "stale": 1, "weird": 2},
		Entities: map[metrics.Where]int{{Where: "local", State: "idle"}: 4999, {Where: "local", State: "busy"}: 1, {Where: "remote", State: "sleepy"}: 7}}
	total := 0
	for i := range 5000 {
		in := metrics.Inbox{Entity: fmt.Sprintf("e%04d", i), Depth: i % 50}
		if i == 4999 {
			in.Depth = 100000 // one inbox far deeper than the rest
		}
		if in.Depth > 0 {
			in.Oldest = now.Add(-time.Duration(in.Depth) * time.Second)
		}
		total += in.Depth
		snap.Inboxes = append(snap.Inboxes, in)
	}
	m := metrics.New("h1", "v-test", func() (metrics.Snapshot, error) { return snap, nil })
	url := serve(t, m)
	f, err := scrape.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Count("fleet_inbox_top_messages"); n != metrics.TopN {
		t.Fatalf("%d top series for 5000 inboxes, want %d", n, metrics.TopN)
	}
	if n := f.Count("fleet_inbox_top_oldest_age_seconds"); n != metrics.TopN {
		t.Fatalf("%d top age series, want %d", n, metrics.TopN)
	}
	if v := value(t, f, "fleet_inbox_top_messages", "entity", "e4999"); v != 100000 {
		t.Errorf("deepest inbox: %v", v)
	}
	// the rest of the top: depth 49, from the last names of that depth
	if _, ok, _ := f.Value("fleet_inbox_top_messages", "entity", "e0049"); !ok {
		t.Errorf("e0049 (depth 49) not in the top")
	}
	if _, ok, _ := f.Value("fleet_inbox_top_messages", "entity", "e0048"); ok {
		t.Errorf("e0048 (depth 48) in the top, before all the 49s")
	}
	if v := value(t, f, "fleet_inbox_messages"); v != float64(total) {
		t.Errorf("inbox messages %v, want %d", v, total)
	}
	if v := value(t, f, "fleet_inbox_oldest_age_seconds"); v < 100000 || v > 100060 {
		t.Errorf("oldest age %v, want about 100000", v)
	}
	if v := value(t, f, "fleet_inbox_depth"); v != 5000 {
		t.Errorf("depth histogram counts %v entities, want 5000", v)
	}
	h := f["fleet_inbox_depth"].Metric[0].Histogram
	if len(h.Bucket) != len(metrics.DepthBuckets)+1 { // and +Inf
		t.Errorf("%d depth buckets, want %d and +Inf", len(h.Bucket), len(metrics.DepthBuckets))
	}
	for _, b := range h.Bucket {
		if b.GetUpperBound() == 0 && b.GetCumulativeCount() != 100 { // i%50 == 0 for 100 of 5000, less the deep one
			t.Errorf("empty inboxes: %d, want 100", b.GetCumulativeCount())
		}
		if b.GetUpperBound() == 10000 && b.GetCumulativeCount() != 4999 {
			t.Errorf("inboxes at most 10000 deep: %d, want 4999", b.GetCumulativeCount())
		}
	}
	if v := value(t, f, "fleet_broker_state", "state", "connected"); v != 1 {
		t.Errorf("connected: %v", v)
	}
	if v := value(t, f, "fleet_broker_state", "state", "down"); v != 0 {
		t.Errorf("down: %v", v)
	}
	if v := value(t, f, "fleet_presence_hosts", "state", "other"); v != 2 {
		t.Errorf("hosts in an unknown state: %v, want 2 as other", v)
	}
	if v := value(t, f, "fleet_presence_entities", "where", "remote", "state", "other"); v != 7 {
		t.Errorf("remote entities in an unknown state: %v, want 7 as other", v)
	}
	if v := value(t, f, "fleet_presence_entities", "where", "local", "state", "idle"); v != 4999 {
		t.Errorf("local idle: %v", v)
	}
	if v := value(t, f, "fleet_gateway_info", "host", "h1", "version", "v-test"); v != 1 {
		t.Errorf("info: %v", v)
	}
	for _, fam := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if f[fam] == nil {
			t.Errorf("%s missing: the Go and process collectors are not registered", fam)
		}
	}
	if len(f.Lines()) > 400 {
		t.Errorf("%d samples for 5000 entities: not bounded", len(f.Lines()))
	}

	// nothing but /metrics is served
	for _, path := range []string{"/", "/metrics/", "/debug/pprof/"} {
		resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
}

// A scrape whose reading of the gateway fails still serves the counters,
// and says what failed instead of reading 0 for the states.
func TestScrapeFailureIsSaid(t *testing.T) {
	m := metrics.New("h1", "v", func() (metrics.Snapshot, error) { return metrics.Snapshot{}, errors.New("store closed") })
	m.Accepted(envelope.Send)
	url := serve(t, m)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	f, err := scrape.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, f, "fleet_messages_accepted_total", "kind", "send"); v != 1 {
		t.Errorf("accepted: %v", v)
	}
	if _, ok, _ := f.Value("fleet_inbox_messages"); ok {
		t.Errorf("an inbox total was served though the store could not be read")
	}
	if v := value(t, f, "promhttp_metric_handler_errors_total", "cause", "gathering"); v < 1 {
		t.Errorf("the failed gathering was not counted: %v", v)
	}
}

// Label values come from closed vocabularies: every reason the gateway
// writes when it dead-letters maps to its own label, every broker refusal
// reason to a cause, and anything else to "other".
func TestVocabularies(t *testing.T) {
	for text, want := range map[string]string{
		"expired before delivery":                                        "expired",
		"sender host h2 is no longer trusted":                            "untrusted",
		"uncertain: the gateway stopped while injecting; the entity may": "uncertain",
		"uncertain: tmux paste: exit status 1":                           "uncertain",
		"delivery failed 5 times: exit status 1":                         "delivery_failed",
		"recipient left the fleet":                                       "recipient_left",
		"inbox full":                                                     "inbox_full",
		"inbox full: the broker refused it":                              "inbox_full",
		"something new":                                                  "other",
	} {
		if got := metrics.DeadReason(text); got != want {
			t.Errorf("DeadReason(%q) = %q, want %q", text, got, want)
		}
	}

	m := metrics.New("h1", "v", func() (metrics.Snapshot, error) { return metrics.Snapshot{Broker: "none"}, nil })
	reasons := map[string]string{
		broker.ReasonMalformed: "malformed", broker.ReasonNewerSchema: "newer_schema",
		broker.ReasonUnsigned: "not_authentic", broker.ReasonUntrusted: "not_authentic",
		broker.ReasonForged: "not_authentic", broker.ReasonWrongHost: "not_authentic",
		broker.ReasonReplay: "replay", broker.ReasonNotMember: "misrouted",
		broker.ReasonMisrouted: "misrouted", broker.ReasonPoison: "poison",
	}
	for r := range reasons {
		m.Refused(r)
	}
	m.Refused("invented by a future broker")
	m.Accepted(envelope.Kind("NOT_A_KIND"))
	m.Confirmed("weird", time.Millisecond)
	f, err := scrape.Get(serve(t, m))
	if err != nil {
		t.Fatal(err)
	}
	for r, cause := range reasons {
		if v := value(t, f, "fleet_refused_total", "reason", r, "cause", cause); v != 1 {
			t.Errorf("refused %s (%s): %v", r, cause, v)
		}
	}
	if v := value(t, f, "fleet_refused_total", "reason", "other", "cause", "other"); v != 1 {
		t.Errorf("an unknown refusal reason: %v, want 1 as other", v)
	}
	if v := value(t, f, "fleet_messages_accepted_total", "kind", "other"); v != 1 {
		t.Errorf("an unknown kind: %v, want 1 as other", v)
	}
	if v := value(t, f, "fleet_publish_confirm_seconds", "outcome", "other"); v != 1 {
		t.Errorf("an unknown outcome: %v, want 1 as other", v)
	}
	if v := value(t, f, "fleet_broker_state", "state", "none"); v != 1 {
		t.Errorf("no broker: %v", v)
	}
	// a nil *Metrics (metrics off) takes every call and does nothing
	var off *metrics.Metrics
	off.Accepted(envelope.Send)
	off.Settled(envelope.Send, true, "expired")
	off.Settled(envelope.Send, false, "")
	off.InboxFull(envelope.Send)
	off.Refused("replay")
	off.Reconnected()
	off.Confirmed("ack", time.Millisecond)
	off.Flushed(time.Millisecond)
}
