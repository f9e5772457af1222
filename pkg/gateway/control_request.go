package gateway

// control_request.go — the requesting side of the control plane (see
// control.go for the whole flow): serve fleet-spawn and fleet-stop for a
// local entity, carry the request out here (this host) or send it, and hand
// the answer that comes back to the waiting call.

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
	"github.com/fleetd/fleet/pkg/trust"
)

// controlRequests is the asking side of the control plane: fleet-spawn and
// fleet-stop of the local entities, carried out here (exec) or sent to the
// host asked, and the calls waiting for the answers that come back. What it
// needs of the rest of the gateway comes as hooks, wired once (gateway.go
// open).
type controlRequests struct {
	host     string
	log      *slog.Logger
	audit    *audit.Log
	peers    *peerView     // the roster view learns an answer at once
	interval time.Duration // presence-interval: how long what is learned stands
	exec     *controlExec  // a request for this host is carried out here
	seal     *sealing      // sealing.go: a SPAWN's text to a host with no key (nil: single-host mode)

	mu      sync.Mutex
	waiters map[string][]*ctlWaiter // request id -> calls waiting for its answer

	caller  func(token string) (*mailbox, error)                                 // gateway.go: the calling entity
	resolve func(to string) (target, error)                                      // route.go
	remote  func() []api.EntityRow                                               // presence.go: the other hosts' entities
	linked  func() bool                                                          // a broker is configured: other hosts are reachable
	send    func(ctx context.Context, host string, env *envelope.Envelope) error // to host's control queue (the broker)
	heard   func()                                                               // presence.go: keep what was heard (saveHeard)
	ctx     func() context.Context                                               // the work in flight's: cancelled past the drain bound
	closing func() <-chan struct{}                                               // closed when shutdown starts
}

type ctlWaiter struct {
	requester string // gid: an answer is for the entity that asked
	host      string // the host asked: only it answers
	ch        chan *controlResult
}

func (c *controlRequests) wait(id, requester, host string) *ctlWaiter {
	w := &ctlWaiter{requester: requester, host: host, ch: make(chan *controlResult, 1)}
	c.mu.Lock()
	if c.waiters == nil {
		c.waiters = map[string][]*ctlWaiter{}
	}
	c.waiters[id] = append(c.waiters[id], w)
	c.mu.Unlock()
	return w
}

func (c *controlRequests) unwait(id string, w *ctlWaiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.waiters[id]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(c.waiters, id)
	} else {
		c.waiters[id] = ws
	}
}

// hand gives res, from host, to every call of requester waiting for
// request id and returns how many there were. An answer from another host
// than the one asked is refused.
func (c *controlRequests) hand(id, requester, host string, res *controlResult) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.waiters[id] {
		if w.requester == requester && w.host != host {
			return 0, broker.Refuse(broker.ReasonWrongHost, "an answer to request %s from host %s; it went to %s", id, host, w.host)
		}
	}
	for _, w := range c.waiters[id] {
		if w.requester == requester {
			select {
			case w.ch <- res:
				n++
			default: // answered already (a duplicate answer)
			}
		}
	}
	return n, nil
}

// controlTimeout is how long a request that waits timeoutMS waits.
func controlTimeout(timeoutMS int64) time.Duration {
	if timeoutMS > 0 {
		return time.Duration(timeoutMS) * time.Millisecond
	}
	return defaultControlTimeout
}

// Spawn serves fleet-spawn.
func (c *controlRequests) Spawn(req *api.SpawnRequest) (*api.Response, error) {
	from, err := c.caller(req.Token)
	if err != nil {
		return nil, err
	}
	if !nameRE.MatchString(req.Name) {
		return nil, fault.New(fault.Usage, fault.KindUsage,
			"%q is not a valid name (a letter, then up to 63 letters, digits, '-' or '_')", req.Name)
	}
	if err := ident.CheckMember(req.Groups); err != nil {
		return nil, err // before anything is sent: the target would refuse it
	}
	id := req.RequestID
	if id == "" {
		id = envelope.NewID()
	} else if !requestIDRE.MatchString(id) {
		return nil, fault.New(fault.Usage, fault.KindUsage, "%q is not a valid request id (letters, digits, '.', '_', ':', '-'; at most 128)", id)
	}
	profile := req.Profile
	if profile == "" {
		profile = "default"
	}
	body := spawnBody{Name: req.Name, Profile: profile, Groups: req.Groups, Args: req.Args}
	res, clear, err := c.request(envelope.Spawn, req.Host, id, body, from.snapshot(), controlTimeout(req.TimeoutMS))
	if err != nil {
		return nil, err
	}
	if res.Spawned != nil {
		// this host's word, never the answering host's: which host got
		// the request's text in the clear (sealing.go)
		s := *res.Spawned
		s.ClearHosts = clear
		res.Spawned = &s
	}
	return answered(res)
}

// Stop serves fleet-stop.
func (c *controlRequests) Stop(req *api.StopRequest) (*api.Response, error) {
	from, err := c.caller(req.Token)
	if err != nil {
		return nil, err
	}
	if req.Target == "" {
		return nil, fault.New(fault.Usage, fault.KindUsage, "no entity to stop")
	}
	gid, name, host, err := c.locate(req.Target)
	if err != nil {
		return nil, err
	}
	res, _, err := c.request(envelope.Stop, host, envelope.NewID(), stopBody{Gid: gid, Name: name}, from.snapshot(), controlTimeout(req.TimeoutMS))
	if err != nil {
		return nil, err
	}
	return answered(res)
}

func answered(res *controlResult) (*api.Response, error) {
	if res.Error != nil {
		return nil, res.Error.Fault()
	}
	return &api.Response{Spawned: res.Spawned, Stopped: res.Stopped}, nil
}

// locate finds the gid, name and host of an entity named by name,
// name@host or gid, through the union roster view.
func (c *controlRequests) locate(to string) (gid, name, host string, err error) {
	t, err := c.resolve(to)
	if err != nil {
		return "", "", "", err
	}
	switch {
	case t.box != nil:
		e := t.box.snapshot()
		return e.Gid, e.Name, c.host, nil
	case t.host != "" && !ident.IsGid(to):
		return t.gid, t.name, t.host, nil
	}
	// a gid names its host, but only the view says the entity is there
	for _, r := range c.remote() {
		if r.Gid == t.gid {
			return r.Gid, r.Name, r.Host, nil
		}
	}
	return "", "", "", fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity %s in the roster view", to).
		WithHint("list entities with: fleet-roster")
}

// request carries out a control request here, or sends it to host and
// waits for the answer until timeout. It says which host got the
// request's text in the clear (sealing.go): a SPAWN to a host with no
// sealing key is refused (77) before it is sent, unless plaintext-hosts
// or seal-fallback = clear allows it.
func (c *controlRequests) request(kind envelope.Kind, host, id string, body any, from store.Entity, timeout time.Duration) (*controlResult, []string, error) {
	if host == "" {
		host = c.host
	}
	if !trust.HostRE.MatchString(host) {
		// never a routing key the broker would refuse: a refused publish
		// closes the publishing channel every send shares
		return nil, nil, fault.New(fault.Usage, fault.KindUsage, "%q is not a host id (letters, digits, '-' and '_', at most 63)", host)
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	env := envelope.New(kind, envelope.Party{Gid: from.Gid, Name: from.Name, Host: from.Host},
		envelope.Party{Host: host, Group: "control"}, string(data))
	env.MsgID = id
	if host == c.host {
		return c.exec.CarryOut(env), nil, nil
	}
	if !c.linked() {
		return nil, nil, fault.New(fault.NoRecipient, fault.KindUnknownHost, "no host %s: this gateway has no broker configured to reach other hosts", host)
	}
	env.Expires = time.Now().Add(timeout).UTC() // never carried out after the caller gave up
	clear, err := c.seal.Check(env)
	if err != nil {
		return nil, nil, err
	}
	w := c.wait(id, from.Gid, host)
	defer c.unwait(id, w)
	if err := c.send(c.ctx(), host, env); err != nil {
		return nil, nil, err
	}
	c.audit.Message("control_sent", env, 0, clearReason(clear))
	c.log.Info("control request sent", "kind", env.Kind, "request_id", id, "trace_id", env.TraceID, "peer", host, "entity", from.Name)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case res := <-w.ch:
		c.learn(host, res)
		return res, clear, nil
	case <-t.C:
		if kind == envelope.Spawn {
			return nil, nil, fault.New(fault.TempFail, fault.KindTimeout, "no answer from host %s within %v: the spawn may still happen", host, timeout).
				WithHint("look with: fleet-roster --host %s; a request is carried out once per id (fleet-spawn --request-id %s)", host, id)
		}
		return nil, nil, fault.New(fault.TempFail, fault.KindTimeout, "no answer from host %s within %v: the stop may still happen", host, timeout).
			WithHint("look with: fleet-roster --host %s; stopping again is safe", host)
	case <-c.closing():
		return nil, nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
	}
}

// learn folds an answer from host into the roster view at once: the name
// of an entity just spawned there resolves, and one just stopped no longer
// does, as soon as fleet-spawn or fleet-stop returns — not one presence
// interval later. The host's next snapshot replaces all of it anyway.
func (c *controlRequests) learn(host string, res *controlResult) {
	var add *api.EntityRow
	drop := ""
	switch {
	case res.Spawned != nil && res.Error == nil:
		s := res.Spawned
		groups := s.Groups
		if groups == nil {
			groups = []string{}
		}
		add = &api.EntityRow{Name: s.Name, Host: s.Host, Gid: s.Gid, Mode: s.Mode, Groups: groups, Status: "idle"}
	case res.Stopped != nil:
		drop = res.Stopped.Gid
	default:
		return
	}
	if drop != "" {
		c.peers.Drop(host, drop)
	}
	if add != nil {
		c.peers.Upsert(host, *add, time.Now(), c.interval)
	}
	c.heard()
}

// Take is the intake's handler for a SPAWN_RESULT or STOP_RESULT: the
// answer is handed to the calls waiting for it, or logged and dropped.
func (c *controlRequests) Take(env *envelope.Envelope) error {
	log := c.log.With("request_id", env.InReplyTo, "trace_id", env.TraceID, "kind", env.Kind, "peer", env.Sender.Host)
	var res controlResult
	if err := json.Unmarshal([]byte(env.Body), &res); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "control answer: %v", err)
	}
	if res.RequestID != env.InReplyTo {
		return broker.Refuse(broker.ReasonMalformed, "an answer to request %q in reply to %q", res.RequestID, env.InReplyTo)
	}
	if err := checkControlResult(&res, env.Sender.Host); err != nil {
		return err
	}
	n, err := c.hand(env.InReplyTo, env.Recipient.Gid, env.Sender.Host, &res)
	if err != nil || n > 0 {
		return err
	}
	attrs := []any{"requester", env.Recipient.Gid}
	if res.Spawned != nil {
		attrs = append(attrs, "spawned", res.Spawned.Name, "spawned_gid", res.Spawned.Gid)
	}
	if res.Error != nil {
		attrs = append(attrs, "error", res.Error.Message)
	}
	log.Info("control answer with nobody waiting (the caller gave up, or a repeated answer): dropped", attrs...)
	return nil
}

// checkControlResult holds an answer from host to what the caller prints
// and the roster learns: an entity spawned or stopped there, by the
// grammar of local names and gids.
func checkControlResult(res *controlResult, host string) error {
	bad := func(format string, args ...any) error {
		return broker.Refuse(broker.ReasonMalformed, "control answer: "+format, args...)
	}
	if s := res.Spawned; s != nil {
		switch {
		case s.Host != host:
			return broker.Refuse(broker.ReasonWrongHost, "host %s answers that it spawned an entity on %s", host, s.Host)
		case !ident.IsGid(s.Gid) || !nameRE.MatchString(s.Name) || (s.Mode != "inject" && s.Mode != "pull" && s.Mode != "hook"):
			return bad("spawned entity %q (%q, %q)", s.Name, s.Gid, s.Mode)
		case ident.GidHost(s.Gid) != host:
			return broker.Refuse(broker.ReasonWrongHost, "host %s answers that it spawned %s, a gid made on another host", host, s.Gid)
		}
		for _, gr := range s.Groups {
			if !ident.ValidGroup(gr) {
				return bad("group %q", gr)
			}
		}
	}
	if s := res.Stopped; s != nil && (s.Host != host || ident.GidHost(s.Gid) != host) {
		return broker.Refuse(broker.ReasonWrongHost, "host %s answers that it stopped %q on %s", host, s.Gid, s.Host)
	}
	if e := res.Error; e != nil {
		e.Message, e.Hint = clipReason(e.Message), clipReason(e.Hint)
		// the caller exits with it: never 0, never a code outside the
		// table (a kind this build does not know, from a newer one, reads
		// as internal)
		switch fault.Code(e.Exit) {
		case fault.Usage, fault.Data, fault.NoRecipient, fault.Unavailable, fault.Software,
			fault.LaunchFailed, fault.CantCreate, fault.OutcomeUnknown, fault.TempFail, fault.Refused:
		default:
			e.Exit = int(fault.Software)
		}
		if !e.Kind.Known() {
			e.Kind = fault.KindInternal
		}
	}
	return nil
}
