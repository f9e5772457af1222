// Package metrics is fleet-gw's Prometheus metrics: every metric the
// gateway exports is defined in this file, with its labels and the fixed
// vocabulary each label takes. The gateway calls in at the points where a
// message is accepted, delivered or dies (pkg/gateway/metrics.go wires it),
// the broker and the store report through observers of their own
// (broker.Observer, store.OnFlush), and what is a state rather than an
// event — inbox depths, the broker link, presence — is read from the
// gateway at scrape time.
//
// Only fleet-gw links this package: the short commands never import it
// (pkg/cli's layering test), so client_golang costs them no start-up time.
//
// Label values are closed sets — message kinds, reasons and states are
// mapped to the vocabularies below, anything else to "other" — and no
// label carries a msg id, gid or free text, so the number of series does
// not grow with traffic or with entities. The one per-entity family is the
// deepest TopN inboxes (see Snapshot).
package metrics

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TopN is how many of the deepest inboxes get series of their own,
// labelled by entity name: enough to name the culprits of a backlog, few
// enough that thousands of entities stay a handful of series.
const TopN = 20

// DepthBuckets are the upper bounds of fleet_inbox_depth: how many
// entities have at most this many messages waiting.
var DepthBuckets = []float64{0, 1, 10, 100, 1000, 10000, 100000}

// Metrics is one gateway's metrics, on a registry of its own (several
// gateways run in one test process; the global default registry is never
// used). A nil *Metrics does nothing: the gateway calls it unconditionally
// and pays nothing when --metrics-listen is off.
type Metrics struct {
	reg        *prometheus.Registry
	accepted   *prometheus.CounterVec
	delivered  *prometheus.CounterVec
	dead       *prometheus.CounterVec
	inboxFull  *prometheus.CounterVec
	inboxHeld  prometheus.Counter
	refused    *prometheus.CounterVec
	reconnects prometheus.Counter
	notAccept  *prometheus.CounterVec
	loopsCut   *prometheus.CounterVec
	rateLim    prometheus.Counter
	loopNotes  prometheus.Counter
	urgent     *prometheus.CounterVec
	confirm    *prometheus.HistogramVec
	flush      prometheus.Histogram
}

// Snapshot is what one scrape reads from the gateway.
type Snapshot struct {
	// Broker is the link's state: none (single-host mode), connecting,
	// connected, blocked or down (broker.State).
	Broker string
	// Inboxes are this host's inboxes (entity name, depth, head's
	// creation time). Exported as totals, a histogram of depths over
	// entities, and series of their own for the TopN deepest only.
	Inboxes []Inbox
	// Hosts are the other hosts in the roster view by state: live (some
	// entity heard within two intervals), stale, unknown (this gateway is
	// cut off from the broker) or untrusted (heard, not in the trust file).
	Hosts map[string]int
	// Entities are the roster's entities by where (local, remote) and
	// status (idle, busy, waiting; remote ones also stale, unknown).
	Entities map[Where]int
}

// Inbox is one local inbox at scrape time.
type Inbox struct {
	Entity string
	Depth  int
	Oldest time.Time // the head's creation time; zero when empty
}

// Where is a key of Snapshot.Entities.
type Where struct{ Where, State string }

// Vocabularies of the scrape-time labels; values outside them read "other".
var (
	brokerStates   = []string{"none", "connecting", "connected", "blocked", "down"}
	hostStates     = []string{"live", "stale", "unknown", "gone", "untrusted"}
	localStates    = []string{"idle", "busy", "waiting"}
	remoteStates   = []string{"idle", "busy", "waiting", "stale", "unknown", "gone"}
	confirmResults = []string{"ack", "returned", "nack", "closed", "timeout"}
)

// New returns the metrics of the gateway of host; snap is called at each
// scrape and must be safe to call concurrently with everything else.
func New(host, version string, snap func() (Snapshot, error)) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_messages_accepted_total",
			Help: "Messages taken into a local inbox (stored durably; asks: held live), by kind.",
		}, []string{"kind"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_messages_delivered_total",
			Help: "Messages a local entity has (injected, drained by fleet-recv, or handed to a waiting send), by kind.",
		}, []string{"kind"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_messages_dead_total",
			Help: "Messages dead-lettered on this host, by kind and reason (" + strings.Join(deadReasons, ", ") + ", other).",
		}, []string{"kind", "reason"}),
		inboxFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_inbox_full_total",
			Help: "Cap hits: messages refused because an inbox is at inbox-max-length (a broker inbox: reject-publish; a local one: the gateway), by kind. The sender is told 75 (mail from another host is held on the broker instead: fleet_inbox_held_total).",
		}, []string{"kind"}),
		inboxHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_inbox_held_total",
			Help: "Back-pressure: times this gateway stopped taking from an entity's broker inbox because its local inbox was at inbox-max-length (the broker holds the mail until it drains; nothing is refused).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_refused_total",
			Help: "Deliveries from the broker refused before they could act, by cause (not_authentic, malformed, newer_schema, replay, misrouted, poison) and the exact reason.",
		}, []string{"cause", "reason"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_broker_reconnects_total",
			Help: "Broker connections made again after one was lost.",
		}),
		notAccept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_not_accepted_total",
			Help: "Messages an entity's inbound policy refused (kind not_accepted), by where: send (a local sender's, refused before anything was stored) or arrival (one from another host, refused as it came in: it is also in fleet_broker_refused_total).",
		}, []string{"where"}),
		loopsCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_loops_cut_total",
			Help: "Messages (sends, replies, asks, answers, broadcasts) refused as past max-hops in their trace (kind loop), by where: send (a local sender's, refused before it was stored or published) or arrival (one from another host, refused as it came in).",
		}, []string{"where"}),
		rateLim: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_rate_limited_total",
			Help: "Sends, replies, asks, answers and broadcasts refused because their sender sent the recipient (a broadcast: the group) more than pair-rate messages in the last minute (kind rate_limited, exit 75; nothing queued).",
		}),
		loopNotes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_loop_notices_total",
			Help: "NOTICEs put in the inbox of the other party of a loop cut here (the entity whose message the cut one answered): the sender was told by its exit status or a BOUNCE.",
		}),
		urgent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_urgent_total",
			Help: "Urgent messages (fleet-send --urgent, fleet-ask --urgent) of this host's entities, by outcome: sent (within urgent-rate, on its way ahead of normal mail), rate_limited (refused over urgent-rate: exit 75, nothing sent), demoted (from another host's sender past twice urgent-rate here: taken in as normal mail) or interrupted (an agent's own interrupt pressed for it: --interrupt-on-urgent).",
		}, []string{"outcome"}),
		confirm: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleet_publish_confirm_seconds",
			Help:    "From handing a publish to the publishing channel to the broker's confirm, by outcome (ack, returned, nack, closed, timeout).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"outcome"}),
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleet_store_flush_seconds",
			Help:    "One write-ahead log flush of the store (one write and one fdatasync for a group commit).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	// series that exist from the start read 0, not absent, so a rate or
	// an alert on them works before the first event
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(causes[r], r)
	}
	m.confirm.WithLabelValues("ack")
	m.notAccept.WithLabelValues("send")
	m.notAccept.WithLabelValues("arrival")
	m.loopsCut.WithLabelValues("send")
	m.loopsCut.WithLabelValues("arrival")
	m.urgent.WithLabelValues("sent")
	m.urgent.WithLabelValues("rate_limited")
	m.urgent.WithLabelValues("demoted")
	m.urgent.WithLabelValues("interrupted")
	m.reg.MustRegister(m.accepted, m.delivered, m.dead, m.inboxFull, m.inboxHeld, m.refused, m.reconnects, m.notAccept, m.loopsCut, m.rateLim, m.urgent, m.loopNotes, m.confirm, m.flush,
		&scraper{host: host, version: version, snap: snap},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry the metrics are on (tests gather it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Accepted counts a message taken into a local inbox.
func (m *Metrics) Accepted(kind envelope.Kind) {
	if m != nil {
		m.accepted.WithLabelValues(kindLabel(kind)).Inc()
	}
}

// Delivered counts a message a local entity has.
func (m *Metrics) Delivered(kind envelope.Kind) {
	if m != nil {
		m.delivered.WithLabelValues(kindLabel(kind)).Inc()
	}
}

// Dead counts a message dead-lettered here; reason is the gateway's text,
// mapped to DeadReason's vocabulary.
func (m *Metrics) Dead(kind envelope.Kind, reason string) {
	if m != nil {
		m.dead.WithLabelValues(kindLabel(kind), DeadReason(reason)).Inc()
	}
}

// Settled counts a message in a local inbox that was delivered, or died.
func (m *Metrics) Settled(kind envelope.Kind, dead bool, reason string) {
	if dead {
		m.Dead(kind, reason)
	} else {
		m.Delivered(kind)
	}
}

// InboxFull counts a cap hit (broker.Observer.InboxFull).
func (m *Metrics) InboxFull(kind envelope.Kind) {
	if m != nil {
		m.inboxFull.WithLabelValues(kindLabel(kind)).Inc()
	}
}

// InboxHeld counts a local inbox's back-pressure on its broker inbox.
func (m *Metrics) InboxHeld() {
	if m != nil {
		m.inboxHeld.Inc()
	}
}

// Refused counts a refusal (broker.Observer.Refused).
func (m *Metrics) Refused(reason string) {
	if m == nil {
		return
	}
	cause, ok := causes[reason]
	if !ok {
		reason, cause = "other", "other"
	}
	m.refused.WithLabelValues(cause, reason).Inc()
}

// NotAccepted counts a message an inbound policy refused, where "send"
// or "arrival".
func (m *Metrics) NotAccepted(where string) {
	if m != nil {
		m.notAccept.WithLabelValues(where).Inc()
	}
}

// LoopCut counts a message refused as a loop, where "send" or "arrival".
func (m *Metrics) LoopCut(where string) {
	if m != nil {
		m.loopsCut.WithLabelValues(where).Inc()
	}
}

// LoopNoticed counts a NOTICE to the other party of a loop cut.
func (m *Metrics) LoopNoticed() {
	if m != nil {
		m.loopNotes.Inc()
	}
}

// RateLimited counts a send refused over pair-rate.
func (m *Metrics) RateLimited() {
	if m != nil {
		m.rateLim.Inc()
	}
}

// Urgent counts an urgent message: outcome "sent" or "rate_limited" (a
// local sender's), or "demoted" (another host's, taken in as normal).
func (m *Metrics) Urgent(outcome string) {
	if m != nil {
		m.urgent.WithLabelValues(outcome).Inc()
	}
}

// Reconnected counts a reconnect (broker.Observer.Reconnected).
func (m *Metrics) Reconnected() {
	if m != nil {
		m.reconnects.Inc()
	}
}

// Confirmed observes one confirmed publish (broker.Observer.Confirmed).
func (m *Metrics) Confirmed(outcome string, took time.Duration) {
	if m == nil {
		return
	}
	if !contains(confirmResults, outcome) {
		outcome = "other"
	}
	m.confirm.WithLabelValues(outcome).Observe(took.Seconds())
}

// Flushed observes one store log flush (store.OnFlush).
func (m *Metrics) Flushed(took time.Duration) {
	if m != nil {
		m.flush.Observe(took.Seconds())
	}
}

// kindLabel is a message kind as a label: lower case, "other" for a kind
// this build does not know.
func kindLabel(k envelope.Kind) string {
	if !k.Known() {
		return "other"
	}
	return strings.ToLower(string(k))
}

// The reasons a message dies on this host (the gateway writes them as
// text, with details such as an error or a host): prefixes, and the label
// each maps to. Kept in one place so a new reason is added here, not
// discovered as "other" on a dashboard.
var deadPrefixes = []struct{ prefix, label string }{
	{"expired in the broker", "expired_in_broker"},   // in a broker inbox, told to its sender (gateway/deaths.go)
	{"rejected in the broker", "rejected_in_broker"}, // likewise
	{"dropped by the broker", "dropped_by_broker"},   // likewise
	{"expired", "expired"},                           // its TTL passed before delivery, or inbox-ttl in a local inbox
	{"sender host ", "untrusted"},                    // its host left the trust file since it was admitted
	{"uncertain", "uncertain"},                       // an injection cut by a crash or an unsure adapter
	{"delivery failed", "delivery_failed"},           // inject attempts used up
	{"recipient left", "recipient_left"},             // its recipient left the fleet
	{"inbox full", "inbox_full"},                     // a full inbox refused it: the broker's (remote) or the gateway's (local: gateway/inboxcap.go)
}

var deadReasons = func() []string {
	var out []string
	for _, p := range deadPrefixes {
		out = append(out, p.label)
	}
	return out
}()

// DeadReason maps a dead letter's reason text to its label.
func DeadReason(text string) string {
	for _, p := range deadPrefixes {
		if strings.HasPrefix(text, p.prefix) {
			return p.label
		}
	}
	return "other"
}

// causes groups the broker's refusal reasons (broker.Reason*, and
// broker.ReasonPoison) into the causes an operator acts on.
var causes = map[string]string{
	"unsigned":       "not_authentic",
	"untrusted_host": "not_authentic",
	"bad_signature":  "not_authentic",
	"wrong_host":     "not_authentic",
	"malformed":      "malformed",
	"newer_schema":   "newer_schema",
	"replay":         "replay",
	"loop":           "loop",
	"not_member":     "misrouted",
	"misrouted":      "misrouted",
	"not_accepted":   "not_accepted",
	"poison":         "poison",
}

var refusalReasons = func() []string {
	var out []string
	for r := range causes {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}()

func contains(set []string, v string) bool {
	for _, s := range set {
		if s == v {
			return true
		}
	}
	return false
}

// scraper is the collector of what is read at scrape time.
type scraper struct {
	host, version string
	snap          func() (Snapshot, error)
}

var (
	descInfo     = prometheus.NewDesc("fleet_gateway_info", "This gateway: its host id and version (always 1).", []string{"host", "version"}, nil)
	descBroker   = prometheus.NewDesc("fleet_broker_state", "The broker link: 1 for the current state (none, connecting, connected, blocked, down), 0 for the others.", []string{"state"}, nil)
	descMessages = prometheus.NewDesc("fleet_inbox_messages", "Messages waiting in this host's inboxes, all entities together.", nil, nil)
	descOldest   = prometheus.NewDesc("fleet_inbox_oldest_age_seconds", "Age (since creation) of the oldest message waiting in any of this host's inboxes; 0 when all are empty.", nil, nil)
	descDepth    = prometheus.NewDesc("fleet_inbox_depth", "Entities of this host by how many messages wait in their inbox (one observation per entity at scrape time).", nil, nil)
	descTop      = prometheus.NewDesc("fleet_inbox_top_messages", fmt.Sprintf("Messages waiting in each of the %d deepest non-empty inboxes, by entity name.", TopN), []string{"entity"}, nil)
	descTopAge   = prometheus.NewDesc("fleet_inbox_top_oldest_age_seconds", fmt.Sprintf("Age of the oldest message in each of the %d deepest non-empty inboxes, by entity name.", TopN), []string{"entity"}, nil)
	descHosts    = prometheus.NewDesc("fleet_presence_hosts", "Other hosts in this gateway's roster view, by state (live, stale, unknown, gone, untrusted).", []string{"state"}, nil)
	descEntities = prometheus.NewDesc("fleet_presence_entities", "Entities in this gateway's roster view, by where (local, remote) and status.", []string{"where", "state"}, nil)
)

func (s *scraper) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInfo, descBroker, descMessages, descOldest, descDepth, descTop, descTopAge, descHosts, descEntities} {
		ch <- d
	}
}

func (s *scraper) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1, s.host, s.version)
	snap, err := s.snap()
	if err != nil {
		// the rest of the scrape still serves; the failure is said
		for _, d := range []*prometheus.Desc{descBroker, descMessages, descHosts} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	for _, st := range brokerStates {
		ch <- prometheus.MustNewConstMetric(descBroker, prometheus.GaugeValue, flag(snap.Broker == st), st)
	}
	if !contains(brokerStates, snap.Broker) {
		ch <- prometheus.MustNewConstMetric(descBroker, prometheus.GaugeValue, 1, "other")
	}
	s.inboxes(ch, snap.Inboxes, time.Now())
	for _, st := range hostStates {
		ch <- prometheus.MustNewConstMetric(descHosts, prometheus.GaugeValue, float64(snap.Hosts[st]), st)
	}
	if n := others(snap.Hosts, hostStates); n > 0 {
		ch <- prometheus.MustNewConstMetric(descHosts, prometheus.GaugeValue, float64(n), "other")
	}
	for where, states := range map[string][]string{"local": localStates, "remote": remoteStates} {
		other := 0
		for k, n := range snap.Entities {
			if k.Where == where && !contains(states, k.State) {
				other += n
			}
		}
		for _, st := range states {
			ch <- prometheus.MustNewConstMetric(descEntities, prometheus.GaugeValue, float64(snap.Entities[Where{where, st}]), where, st)
		}
		if other > 0 {
			ch <- prometheus.MustNewConstMetric(descEntities, prometheus.GaugeValue, float64(other), where, "other")
		}
	}
}

// inboxes exports the inboxes with bounded cardinality: totals, the
// histogram of depths over entities, and the TopN deepest by name.
func (s *scraper) inboxes(ch chan<- prometheus.Metric, boxes []Inbox, now time.Time) {
	total := 0
	var oldest time.Time
	buckets := make(map[float64]uint64, len(DepthBuckets))
	for _, ub := range DepthBuckets {
		buckets[ub] = 0 // a bound no inbox reaches still reads 0
	}
	for _, b := range boxes {
		total += b.Depth
		if b.Depth > 0 && !b.Oldest.IsZero() && (oldest.IsZero() || b.Oldest.Before(oldest)) {
			oldest = b.Oldest
		}
		for _, ub := range DepthBuckets {
			if float64(b.Depth) <= ub {
				buckets[ub]++ // cumulative: every bound at or above it
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descMessages, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age(now, oldest))
	ch <- prometheus.MustNewConstHistogram(descDepth, uint64(len(boxes)), float64(total), buckets)

	top := make([]Inbox, 0, len(boxes))
	for _, b := range boxes {
		if b.Depth > 0 {
			top = append(top, b)
		}
	}
	sort.Slice(top, func(i, j int) bool {
		if top[i].Depth != top[j].Depth {
			return top[i].Depth > top[j].Depth
		}
		return top[i].Entity < top[j].Entity
	})
	if len(top) > TopN {
		top = top[:TopN]
	}
	for _, b := range top {
		ch <- prometheus.MustNewConstMetric(descTop, prometheus.GaugeValue, float64(b.Depth), b.Entity)
		ch <- prometheus.MustNewConstMetric(descTopAge, prometheus.GaugeValue, age(now, b.Oldest), b.Entity)
	}
}

func age(now, t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(now.Sub(t).Seconds(), 0)
}

func flag(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func others(m map[string]int, known []string) int {
	n := 0
	for k, v := range m {
		if !contains(known, k) {
			n += v
		}
	}
	return n
}

// Endpoint is the metrics endpoint: an address bound by Listen, served
// by Serve, until Close. Only GET /metrics is served, in the Prometheus
// text format (or what the scraper negotiates).
type Endpoint struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr (host:port; port 0 picks one). It is apart from Serve
// so a gateway fails at start, before anything else, when the address
// cannot be had.
func Listen(addr string) (*Endpoint, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Endpoint{ln: ln}, nil
}

// Addr is the bound address (with the port picked for port 0).
func (e *Endpoint) Addr() string { return e.ln.Addr().String() }

// Exposed reports whether the endpoint listens beyond this machine: it
// has no authentication, so the gateway warns.
func (e *Endpoint) Exposed() bool {
	a, ok := e.ln.Addr().(*net.TCPAddr)
	return !ok || !a.IP.IsLoopback()
}

// Serve starts serving m; call once.
func (e *Endpoint) Serve(m *Metrics) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:      m.reg, // promhttp_metric_handler_errors_total
		ErrorHandling: promhttp.ContinueOnError,
	}))
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// Serve returns only once Close closed the listener
	go func(srv *http.Server) { _ = srv.Serve(e.ln) }(e.srv)
}

// Close stops the endpoint at once (a scrape in progress is cut), or
// releases the address if it never served. A nil Endpoint is off.
func (e *Endpoint) Close() error {
	if e == nil {
		return nil
	}
	if e.srv != nil {
		return e.srv.Close()
	}
	return e.ln.Close()
}
