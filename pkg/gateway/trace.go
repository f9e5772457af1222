package gateway

// trace.go — fleet-trace: every hop of one flow, from every gateway that
// saw it, gathered through the fleet itself.
//
// The caller is an entity of this host (its credential). Its gateway
// searches its own audit log (every rotated file of it) and, with a
// broker, sends a TRACE to the control queue of every host in its trust
// file — non-persistent, mandatory, confirmed, expiring at the caller's
// deadline — then gathers the TRACE_RESULT answers until every host asked
// has answered or the deadline passes. Hosts that could not be asked
// (no control queue on the broker, the broker down) or did not answer in
// time are named in the result. Without a broker, this host's hops alone.
//
// Answering: a host takes a TRACE from its control queue, admitted like a
// SPAWN or STOP (signed by a trusted host, naming a requester entity of
// that host, expiring within the control window), searches its audit log
// and answers on bridge.msg with key = the requester's gid, so the answer
// arrives on the requester's own inbox consumer (as control answers do)
// and is handed to the waiting call, never stored.
//
// Authorization: any authenticated entity of a trusted host may ask. The
// trace id is the capability (an entity learns it from a message of the
// flow), and an audit line holds no message text: ids, names, kinds,
// events, times, sizes.
//
// Every byte of an answer is another host's word: it must come from a
// host that was asked, for the trace asked about, at most traceLines
// hops, each one of the answering host (a host never speaks for
// another's hops), each field in the grammar of its kind, times not in
// the future. Anything else is refused (to bridge.dlq, loudly), never
// half-used.

import (
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

const (
	// defaultTraceTimeout bounds the gathering when the caller gives none.
	defaultTraceTimeout = 5 * time.Second
	// traceLines is the most hops one host gives for one trace (the
	// first ones); more are said to be left out.
	traceLines = 1000
	// traceAnswerBytes bounds an answer's body, well under any gateway's
	// body limit: hops past it are left out, and the answer says so.
	traceAnswerBytes = 512 << 10
)

// traceQuery is the body of a TRACE.
type traceQuery struct {
	TraceID string `json:"trace_id"`
}

// traceAnswer is the body of a TRACE_RESULT.
type traceAnswer struct {
	TraceID   string    `json:"trace_id"`
	Hops      []api.Hop `json:"hops"`
	Truncated bool      `json:"truncated,omitempty"`
	Error     string    `json:"error,omitempty"`   // the host could not read its audit log
	Refused   bool      `json:"refused,omitempty"` // the host refused the query; Error says why (refusals.go)
}

// traceWaiters owns the trace queries of this gateway waiting for other
// hosts' answers. The zero value is ready.
type traceWaiters struct {
	mu   sync.Mutex
	runs map[string]*traceRun // query id -> its run
}

// traceRun is one query: who asked, the hosts asked (true once answered),
// and where their answers go.
type traceRun struct {
	trace     string
	requester string
	asked     map[string]bool
	ch        chan traceReply
}

type traceReply struct {
	host string
	ans  *traceAnswer
}

// Open starts a run of query id for requester, asking hosts.
func (t *traceWaiters) Open(id, trace, requester string, hosts []string) *traceRun {
	r := &traceRun{trace: trace, requester: requester, asked: map[string]bool{}, ch: make(chan traceReply, len(hosts))}
	for _, h := range hosts {
		r.asked[h] = false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.runs == nil {
		t.runs = map[string]*traceRun{}
	}
	t.runs[id] = r
	return r
}

// Close ends a run: later answers to it are dropped.
func (t *traceWaiters) Close(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.runs, id)
}

// Expect returns the trace id a run of query id for requester asks host
// about, or false when no such run waits for host's answer (none open,
// answered already: the answer is dropped). A host that was not asked is
// refused.
func (t *traceWaiters) Expect(id, requester, host string) (string, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.runs[id]
	if r == nil || r.requester != requester {
		return "", false, nil
	}
	answered, asked := r.asked[host]
	if !asked {
		return "", false, broker.Refuse(broker.ReasonWrongHost, "an answer to trace query %s from host %s, which was not asked", id, host)
	}
	return r.trace, !answered, nil
}

// Answer hands host's answer to its run; false: nobody waits for it.
func (t *traceWaiters) Answer(id, requester, host string, ans *traceAnswer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.runs[id]
	if r == nil || r.requester != requester {
		return false
	}
	if answered, asked := r.asked[host]; !asked || answered {
		return false
	}
	r.asked[host] = true
	r.ch <- traceReply{host: host, ans: ans} // room for one per host
	return true
}

// tracer owns fleet-trace on this gateway: its own queries waiting for
// the other hosts' answers, the searches it runs for other hosts' queries
// (at most traceSearches at once) and their goroutines. The Gateway
// wires it once the store is open.
type tracer struct {
	host    string
	log     *slog.Logger
	audit   *audit.Log
	reg     *registry
	peers   *peerView       // names of the other hosts' entities
	workers *sync.WaitGroup // the searches for other hosts are waited for at shutdown

	caller func(token string) (store.Entity, error) // the entity a request acts as (by its credential)

	// read at each query: set in Run, after the store is open
	br      func() *broker.Broker  // nil: single-host mode
	trusted func() []string        // the hosts asked: the trust file's, by line or certificate
	ctx     func() context.Context // publishes are aborted past the drain bound (hardCtx)
	done    func() <-chan struct{} // closed when shutdown starts (runCtx)

	waits traceWaiters  // queries of this gateway waiting for answers
	sem   chan struct{} // searches running for other hosts' queries
}

func newTracer(host string, log *slog.Logger, a *audit.Log, reg *registry, peers *peerView, workers *sync.WaitGroup) *tracer {
	return &tracer{host: host, log: log, audit: a, reg: reg, peers: peers, workers: workers,
		sem: make(chan struct{}, traceSearches)}
}

// Trace serves fleet-trace for the entity of this host req acts as.
func (t *tracer) Trace(req *api.TraceRequest) (*api.Response, error) {
	sender, err := t.caller(req.Token)
	if err != nil {
		return nil, err
	}
	id := req.TraceID
	if !idRE.MatchString(id) {
		return nil, fault.New(fault.Usage, fault.KindUsage, "%q is not a trace id", id).
			WithHint("fleet-send prints MSG_ID TRACE_ID; --json has trace_id")
	}
	timeout := defaultTraceTimeout
	if req.TimeoutMS > 0 {
		timeout = time.Duration(req.TimeoutMS) * time.Millisecond
	}
	if timeout > controlWindow {
		return nil, fault.New(fault.Usage, fault.KindUsage, "a trace query waits at most %v, not %v", controlWindow, timeout)
	}
	deadline := time.Now().Add(timeout)
	out := &api.Trace{TraceID: id, Hops: []api.Hop{}}

	own := t.ownHops(id)
	out.Hops = append(out.Hops, own.Hops...)
	self := api.TraceHost{Host: t.host, State: api.TraceAnswered, Hops: len(own.Hops), Truncated: own.Truncated}
	if own.Error != "" {
		self.State, self.Detail = api.TraceUnreachable, own.Error
	}
	out.Hosts = append(out.Hosts, self)
	br := t.br()
	if br == nil {
		sortHops(out.Hops)
		t.nameHops(out)
		return &api.Response{Trace: out}, nil
	}

	hosts := t.trusted() // by line or certificate; an unreadable trust file admits no line
	qid := envelope.NewID()
	run := t.waits.Open(qid, id, sender.Gid, hosts)
	defer t.waits.Close(qid)
	body, _ := json.Marshal(traceQuery{TraceID: id})
	state := map[string]*api.TraceHost{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range hosts {
		th := &api.TraceHost{Host: h, State: api.TraceNoAnswer}
		state[h] = th
		env := envelope.New(envelope.Trace, envelope.Party{Gid: sender.Gid, Name: sender.Name, Host: sender.Host},
			envelope.Party{Host: h, Group: "control"}, string(body))
		env.MsgID, env.TraceID, env.Expires = qid, qid, deadline.UTC()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := br.PublishQuery(t.ctx(), h, env); err != nil {
				mu.Lock()
				th.State, th.Detail = api.TraceUnreachable, err.Error()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	waiting := 0
	for _, th := range state {
		if th.State == api.TraceNoAnswer {
			waiting++
		}
	}
	t.log.Info("trace query sent", "trace_id", id, "query_id", qid, "entity", sender.Name, "hosts", len(hosts), "asked", waiting)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
gather:
	for waiting > 0 {
		select {
		case r := <-run.ch:
			th := state[r.host]
			if th.State != api.TraceNoAnswer {
				continue
			}
			waiting--
			th.State, th.Hops, th.Truncated = api.TraceAnswered, len(r.ans.Hops), r.ans.Truncated
			if r.ans.Error != "" {
				th.State, th.Detail = api.TraceUnreachable, r.ans.Error
			}
			if r.ans.Refused {
				th.State = api.TraceRefused
			}
			out.Hops = append(out.Hops, r.ans.Hops...)
		case <-timer.C:
			break gather
		case <-t.done():
			return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
		}
	}
	for _, h := range hosts {
		out.Hosts = append(out.Hosts, *state[h])
	}
	sortHops(out.Hops)
	t.nameHops(out)
	return &api.Response{Trace: out}, nil
}

// nameHops gives the names this gateway knows of the hops' senders and
// recipients (the hops themselves carry gids: a host speaks only for its
// own entities, and names are this gateway's view).
func (t *tracer) nameHops(tr *api.Trace) {
	for _, h := range tr.Hops {
		for _, gid := range []string{h.Sender, h.Recipient} {
			if gid == "" || tr.Names[gid] != "" {
				continue
			}
			name := ""
			if b := t.reg.Get(gid); b != nil {
				name = b.snapshot().Name
			} else {
				name = t.peers.Name(gid)
			}
			if name != "" {
				if tr.Names == nil {
					tr.Names = map[string]string{}
				}
				tr.Names[gid] = name
			}
		}
	}
}

// ownHops are this host's hops of trace, from every file of its audit
// log, in the grammar an answer must keep.
func (t *tracer) ownHops(trace string) *traceAnswer {
	ans := &traceAnswer{TraceID: trace, Hops: []api.Hop{}}
	found, err := t.audit.Search(trace, traceLines)
	if err != nil {
		t.log.Error("searching the audit log", "trace_id", trace, "err", err)
		ans.Error = "host " + t.host + " could not read its audit log"
	}
	ans.Truncated = found.Truncated
	for _, ln := range found.Lines {
		h := hopOf(ln, t.host)
		if ident.IsGid(h.Entity) {
			// a message addressed by gid names no entity: say which, if
			// it still lives here
			if b := t.reg.Get(h.Entity); b != nil {
				h.Entity = b.snapshot().Name
			}
		}
		ans.Hops = append(ans.Hops, h)
	}
	return ans
}

// hopOf is an audit line as a hop of host, each field kept only when it
// fits the grammar of its kind (a line from an older build may not).
func hopOf(ln audit.Line, host string) api.Hop {
	h := api.Hop{Time: ln.Time.UTC(), Host: host, Event: ln.Event, Attempt: ln.Attempt, Size: ln.Size, Reason: clipReason(ln.Reason)}
	if !eventRE.MatchString(h.Event) {
		h.Event = "other"
	}
	if nameRE.MatchString(ln.Entity) || ident.IsGid(ln.Entity) {
		h.Entity = ln.Entity
	}
	if envelope.Kind(ln.Kind).Known() {
		h.Kind = ln.Kind
	}
	if idRE.MatchString(ln.MsgID) {
		h.MsgID = ln.MsgID
	}
	if ident.IsGid(ln.Sender) {
		h.Sender = ln.Sender
	}
	if ident.IsGid(ln.Recipient) {
		h.Recipient = ln.Recipient
	}
	if h.Attempt < 0 || h.Attempt > maxAttempt {
		h.Attempt = 0
	}
	if h.Size < 0 {
		h.Size = 0
	}
	return h
}

// eventRE is the grammar of an audit event name.
var eventRE = regexp.MustCompile(`^[a-z][a-z_]{0,31}$`)

// maxAttempt bounds an attempt count in a hop.
const maxAttempt = 1 << 20

// Query answers a TRACE from another host (admitted as a control
// request: signed by a trusted host, naming a requester of that host,
// expiring within the control window) with this host's hops. It never
// fails the delivery: a query that cannot be answered is simply not
// answered, and the requester names this host as silent.
func (t *tracer) Query(env *envelope.Envelope) error {
	if env.Sender.Gid == "" {
		return broker.Refuse(broker.ReasonMalformed, "a TRACE that names no requester")
	}
	log := t.log.With("query_id", env.MsgID, "peer", env.Sender.Host, "requester", env.Sender.String())
	var q traceQuery
	if err := json.Unmarshal([]byte(env.Body), &q); err != nil || !idRE.MatchString(q.TraceID) {
		return broker.Refuse(broker.ReasonMalformed, "a TRACE without a trace id")
	}
	if env.Expired(time.Now()) {
		log.Info("trace query expired before it was taken up: not answered", "trace_id", q.TraceID)
		return nil
	}
	// answered beside the control queue, not on it: a search reads up to
	// (audit-files+1) × audit-max-size, and SPAWN/STOP must not wait
	// behind it. At most traceSearches at once; more are not answered
	// (their requester names this host as silent) rather than queued.
	select {
	case t.sem <- struct{}{}:
	default:
		log.Warn("trace query not answered: other searches are running", "trace_id", q.TraceID)
		return nil
	}
	br := t.br()
	t.workers.Add(1)
	go func() {
		defer func() { <-t.sem; t.workers.Done() }()
		ans := t.ownHops(q.TraceID)
		body := fitAnswer(ans)
		res := envelope.New(envelope.TraceResult, envelope.Party{Host: t.host}, env.Sender, string(body))
		res.TraceID, res.InReplyTo, res.Expires = env.TraceID, env.MsgID, env.Expires
		if err := br.Publish(t.ctx(), env.Sender.Gid, res, false); err != nil {
			log.Warn("trace answer not sent", "trace_id", q.TraceID, "err", err)
			return
		}
		log.Info("trace query answered", "trace_id", q.TraceID, "hops", len(ans.Hops), "truncated", ans.Truncated)
	}()
	return nil
}

// traceSearches bounds the trace searches a gateway runs at once for
// other hosts (tracer.sem).
const traceSearches = 2

// fitAnswer encodes ans within traceAnswerBytes, leaving out the last
// hops (and saying so) when it would not fit.
func fitAnswer(ans *traceAnswer) []byte {
	for {
		body, _ := json.Marshal(ans)
		if len(body) <= traceAnswerBytes || len(ans.Hops) == 0 {
			return body
		}
		// drop in proportion to the excess, at least one
		keep := len(ans.Hops) * traceAnswerBytes / len(body)
		if keep >= len(ans.Hops) {
			keep = len(ans.Hops) - 1
		}
		ans.Hops, ans.Truncated = ans.Hops[:keep], true
	}
}

// Result takes a TRACE_RESULT for a query of this gateway: checked
// whole, then handed to the waiting call; dropped when nobody waits.
func (t *tracer) Result(env *envelope.Envelope) error {
	host := env.Sender.Host
	trace, waiting, err := t.waits.Expect(env.InReplyTo, env.Recipient.Gid, host)
	if err != nil {
		return err
	}
	if !waiting {
		t.log.Info("trace answer with nobody waiting (the caller gave up, or a repeated answer): dropped",
			"query_id", env.InReplyTo, "peer", host)
		return nil
	}
	var ans traceAnswer
	if err := json.Unmarshal([]byte(env.Body), &ans); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "trace answer: %v", err)
	}
	if err := checkTraceAnswer(&ans, trace, host, time.Now()); err != nil {
		return err
	}
	t.waits.Answer(env.InReplyTo, env.Recipient.Gid, host, &ans)
	return nil
}

// checkTraceAnswer holds host's answer about trace to what this host
// would send itself: at most traceLines hops, each of host, in grammar,
// not from the future.
func checkTraceAnswer(ans *traceAnswer, trace, host string, now time.Time) error {
	bad := func(format string, args ...any) error {
		return broker.Refuse(broker.ReasonMalformed, "trace answer from %s: "+format, append([]any{host}, args...)...)
	}
	if ans.TraceID != trace {
		return bad("about trace %q, not %q", ans.TraceID, trace)
	}
	if len(ans.Hops) > traceLines {
		return bad("%d hops, over the %d a host gives", len(ans.Hops), traceLines)
	}
	ans.Error = clipReason(ans.Error)
	for i := range ans.Hops {
		h := &ans.Hops[i]
		if h.Host != host {
			// a host never speaks for another's hops
			return broker.Refuse(broker.ReasonWrongHost, "trace answer from %s holds a hop of host %q", host, h.Host)
		}
		switch {
		case h.Time.IsZero() || h.Time.Year() < 2000 || h.Time.Sub(now) > maxSkew:
			return bad("a hop at %s", h.Time.Format(time.RFC3339))
		case !eventRE.MatchString(h.Event):
			return bad("event %q", h.Event)
		case h.Entity != "" && !nameRE.MatchString(h.Entity) && !ident.IsGid(h.Entity):
			return bad("entity %q", h.Entity)
		case h.Kind != "" && !envelope.Kind(h.Kind).Known():
			return bad("kind %q", h.Kind)
		case h.MsgID != "" && !idRE.MatchString(h.MsgID):
			return bad("msg id %q", h.MsgID)
		case h.Sender != "" && !ident.IsGid(h.Sender), h.Recipient != "" && !ident.IsGid(h.Recipient):
			return bad("sender %q, recipient %q", h.Sender, h.Recipient)
		case h.Attempt < 0 || h.Attempt > maxAttempt || h.Size < 0:
			return bad("attempt %d, size %d", h.Attempt, h.Size)
		}
		h.Time = h.Time.UTC()
		h.Reason = clipReason(h.Reason)
	}
	return nil
}

// eventOrder breaks ties between hops at the same instant by the order
// in which a flow goes through them.
var eventOrder = map[string]int{
	"asked": 0, "replied": 0,
	"accepted": 1, "published": 1,
	"confirmed": 2, "unconfirmed": 2, "not_sent": 2,
	"taken": 3, "retry": 4,
	"injected": 5, "drained": 5,
	"answered": 6, "too_late": 6,
	"receipt": 7, "dead": 8, "expired": 8, "bounced": 9,
}

// sortHops orders hops by time (each host's own clock), ties by the order
// of a flow, then by host and msg id so the order is stable.
func sortHops(hops []api.Hop) {
	rank := func(e string) int {
		if r, ok := eventOrder[e]; ok {
			return r
		}
		return len(eventOrder)
	}
	sort.SliceStable(hops, func(i, j int) bool {
		a, b := hops[i], hops[j]
		if !a.Time.Equal(b.Time) {
			return a.Time.Before(b.Time)
		}
		if rank(a.Event) != rank(b.Event) {
			return rank(a.Event) < rank(b.Event)
		}
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		return a.MsgID < b.MsgID
	})
}
