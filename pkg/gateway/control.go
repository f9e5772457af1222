package gateway

// control.go — the control plane (U4): fleet-spawn and fleet-stop.
//
// The requester is an entity (its credential, as for fleet-send). Its
// gateway turns the call into a SPAWN or STOP envelope whose msg id is the
// request id, and:
//
//   - target host = this host: carries it out here, broker or not;
//   - otherwise publishes it to bridge.control, key = the target host
//     (mandatory, confirmed: unroutable = no such host, 67), expiring at the
//     caller's deadline, and waits. The target gateway consumes it from its
//     control.<host> queue, carries it out and publishes the answer
//     (SPAWN_RESULT / STOP_RESULT, in reply to the request id) to bridge.msg
//     with key = the requester's gid: it arrives on the requester's own
//     inbox consumer, where takeBroker hands it to the waiting call. An
//     answer is never stored in an inbox: nobody waiting (the caller gave
//     up, or a duplicate answer) means it is logged and dropped.
//
// The answer rides the requester's inbox because that queue already exists,
// is bound by gid, and is consumed by exactly the gateway that waits: no
// reply queue to declare, name or clean up, and the broker's mandatory flag
// tells the target at once if the requester is gone.
//
// Each request id is carried out once per host (store: BeginControl): a
// redelivered SPAWN, or the same --request-id sent again, is answered from
// the record, with the same gid. A spawn that failed cleanly leaves no
// record (nothing was started), so it may be tried again; one cut short by
// a crash is answered "uncertain" for good, never started twice.

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/launch"
	"github.com/fleetd/fleet/pkg/store"
)

// defaultControlTimeout bounds a spawn or stop when the caller gives none.
const defaultControlTimeout = 30 * time.Second

// controlState is the control plane's part of the gateway.
type controlState struct {
	mu      sync.Mutex
	waiters map[string][]*ctlWaiter // request id -> calls waiting for its answer
	run     sync.Mutex              // one control request carried out at a time on this host
}

type ctlWaiter struct {
	requester string // gid: an answer is for the entity that asked
	host      string // the host asked: only it answers
	ch        chan *controlResult
}

func (c *controlState) wait(id, requester, host string) *ctlWaiter {
	w := &ctlWaiter{requester: requester, host: host, ch: make(chan *controlResult, 1)}
	c.mu.Lock()
	if c.waiters == nil {
		c.waiters = map[string][]*ctlWaiter{}
	}
	c.waiters[id] = append(c.waiters[id], w)
	c.mu.Unlock()
	return w
}

func (c *controlState) unwait(id string, w *ctlWaiter) {
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
func (c *controlState) hand(id, requester, host string, res *controlResult) (int, error) {
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

// spawnBody is the body of a SPAWN.
type spawnBody struct {
	Name    string   `json:"name"`
	Profile string   `json:"profile"`
	Groups  []string `json:"groups,omitempty"`
	Args    []string `json:"args,omitempty"`
}

// stopBody is the body of a STOP.
type stopBody struct {
	Gid  string `json:"gid"`
	Name string `json:"name,omitempty"`
}

// controlResult is the body of a SPAWN_RESULT or STOP_RESULT, and what the
// control record keeps as the answer.
type controlResult struct {
	RequestID string         `json:"request_id"`
	Spawned   *api.Spawned   `json:"spawned,omitempty"`
	Stopped   *api.Stopped   `json:"stopped,omitempty"`
	Error     *api.ErrorBody `json:"error,omitempty"`
}

func failed(id string, err error) *controlResult {
	return &controlResult{RequestID: id, Error: api.FromFault(err)}
}

var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

func controlTimeout(req *api.Request) time.Duration {
	if req.TimeoutMS > 0 {
		return time.Duration(req.TimeoutMS) * time.Millisecond
	}
	return defaultControlTimeout
}

// spawn serves fleet-spawn.
func (g *Gateway) spawn(req *api.Request) (*api.Response, error) {
	from, err := g.caller(req)
	if err != nil {
		return nil, err
	}
	if !nameRE.MatchString(req.Name) {
		return nil, fault.New(fault.Usage, fault.KindUsage,
			"%q is not a valid name (a letter, then up to 63 letters, digits, '-' or '_')", req.Name)
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
	res, err := g.request(envelope.Spawn, req.Host, id, body, from.snapshot(), controlTimeout(req))
	if err != nil {
		return nil, err
	}
	return answered(res)
}

// stop serves fleet-stop.
func (g *Gateway) stop(req *api.Request) (*api.Response, error) {
	from, err := g.caller(req)
	if err != nil {
		return nil, err
	}
	if req.Target == "" {
		return nil, fault.New(fault.Usage, fault.KindUsage, "no entity to stop")
	}
	gid, name, host, err := g.locate(req.Target)
	if err != nil {
		return nil, err
	}
	res, err := g.request(envelope.Stop, host, envelope.NewID(), stopBody{Gid: gid, Name: name}, from.snapshot(), controlTimeout(req))
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
func (g *Gateway) locate(to string) (gid, name, host string, err error) {
	t, err := g.resolve(to)
	if err != nil {
		return "", "", "", err
	}
	switch {
	case t.box != nil:
		e := t.box.snapshot()
		return e.Gid, e.Name, g.cfg.Host, nil
	case t.host != "":
		return t.gid, t.name, t.host, nil
	}
	for _, r := range g.remoteRows() { // a gid: which host has it?
		if r.Gid == t.gid {
			return r.Gid, r.Name, r.Host, nil
		}
	}
	return "", "", "", fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity %s in the roster view", to).
		WithHint("list entities with: fleet-roster")
}

// request carries out a control request here, or sends it to host and
// waits for the answer until timeout.
func (g *Gateway) request(kind envelope.Kind, host, id string, body any, from store.Entity, timeout time.Duration) (*controlResult, error) {
	if host == "" {
		host = g.cfg.Host
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	env := envelope.New(kind, envelope.Party{Gid: from.Gid, Name: from.Name, Host: from.Host},
		envelope.Party{Host: host, Group: "control"}, string(data))
	env.MsgID = id
	if host == g.cfg.Host {
		return g.carryOut(env), nil
	}
	if g.br == nil {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownHost, "no host %s: this gateway has no broker configured to reach other hosts", host)
	}
	env.Expires = time.Now().Add(timeout).UTC() // never carried out after the caller gave up
	w := g.ctl.wait(id, from.Gid, host)
	defer g.ctl.unwait(id, w)
	if err := g.br.PublishControl(g.runCtx, host, env); err != nil {
		return nil, err
	}
	g.audit.Message("control_sent", env, 0, "")
	g.log.Info("control request sent", "kind", env.Kind, "request_id", id, "trace_id", env.TraceID, "peer", host, "entity", from.Name)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case res := <-w.ch:
		g.learn(host, res)
		return res, nil
	case <-t.C:
		if kind == envelope.Spawn {
			return nil, fault.New(fault.TempFail, fault.KindTimeout, "no answer from host %s within %v: the spawn may still happen", host, timeout).
				WithHint("look with: fleet-roster --host %s; a request is carried out once per id (fleet-spawn --request-id %s)", host, id)
		}
		return nil, fault.New(fault.TempFail, fault.KindTimeout, "no answer from host %s within %v: the stop may still happen", host, timeout).
			WithHint("look with: fleet-roster --host %s; stopping again is safe", host)
	case <-g.runCtx.Done():
		return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
	}
}

// learn folds an answer from host into the roster view at once: the name
// of an entity just spawned there resolves, and one just stopped no longer
// does, as soon as fleet-spawn or fleet-stop returns — not one presence
// interval later. The host's next snapshot replaces all of it anyway.
func (g *Gateway) learn(host string, res *controlResult) {
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
		g.peers.Drop(host, drop)
	}
	if add != nil {
		g.peers.Upsert(host, *add, time.Now(), g.cfg.PresenceInterval)
	}
}

// takeBroker is the broker's handler for every local inbox: the answers to
// this gateway's control requests are taken here, everything else goes on
// to takeRemote.
func (g *Gateway) takeBroker(env *envelope.Envelope) error {
	switch env.Kind {
	case envelope.SpawnResult, envelope.StopResult:
		return g.onControlResult(env)
	}
	return g.takeRemote(env)
}

func (g *Gateway) onControlResult(env *envelope.Envelope) error {
	log := g.log.With("request_id", env.InReplyTo, "trace_id", env.TraceID, "kind", env.Kind, "peer", env.Sender.Host)
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
	n, err := g.ctl.hand(env.InReplyTo, env.Recipient.Gid, env.Sender.Host, &res)
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
		case !isGid(s.Gid) || !nameRE.MatchString(s.Name) || (s.Mode != "inject" && s.Mode != "pull"):
			return bad("spawned entity %q (%q, %q)", s.Name, s.Gid, s.Mode)
		}
		for _, gr := range s.Groups {
			if !nameRE.MatchString(gr) {
				return bad("group %q", gr)
			}
		}
	}
	if s := res.Stopped; s != nil && (s.Host != host || !isGid(s.Gid)) {
		return broker.Refuse(broker.ReasonWrongHost, "host %s answers that it stopped %q on %s", host, s.Gid, s.Host)
	}
	if e := res.Error; e != nil {
		e.Message, e.Hint = clipReason(e.Message), clipReason(e.Hint)
	}
	return nil
}

// onControl is the broker's handler for this host's control queue: carry
// the request out, then answer the requester. An error requeues the
// request; carried out already, it is then answered from the record.
func (g *Gateway) onControl(env *envelope.Envelope) error {
	if env.Sender.Gid == "" {
		// a request speaks for an entity of the signing host (admit.go)
		return broker.Refuse(broker.ReasonMalformed, "a %s that names no requester", env.Kind)
	}
	res := g.carryOut(env)
	log := g.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "peer", env.Sender.Host)
	kind := envelope.SpawnResult
	if env.Kind == envelope.Stop {
		kind = envelope.StopResult
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	ans := envelope.New(kind, envelope.Party{Host: g.cfg.Host}, env.Sender, string(data))
	ans.TraceID, ans.InReplyTo, ans.Expires = env.TraceID, env.MsgID, env.Expires
	err = g.br.Publish(g.runCtx, env.Sender.Gid, ans, true)
	switch {
	case err == nil:
		return nil
	case fault.CodeOf(err) == fault.NoRecipient:
		log.Warn("the requester's inbox is gone: answer dropped", "requester", env.Sender.String())
		return nil
	}
	return err
}

// carryOut carries out one control request on this host.
func (g *Gateway) carryOut(env *envelope.Envelope) *controlResult {
	id := env.MsgID
	bad := func(err error) *controlResult {
		return failed(id, fault.Wrap(fault.Data, fault.KindBadEnvelope, err, "malformed %s request", env.Kind))
	}
	switch env.Kind {
	case envelope.Spawn:
		var b spawnBody
		if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
			return bad(err)
		}
		return g.handleSpawn(env, b)
	case envelope.Stop:
		var b stopBody
		if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
			return bad(err)
		}
		return g.handleStop(env, b)
	}
	return failed(id, fault.New(fault.Data, fault.KindBadEnvelope, "%s is not a control request", env.Kind))
}

// claim records request id as being carried out. It returns the answer to
// give instead when the id was handled before.
func (g *Gateway) claim(env *envelope.Envelope, subject string, log *slog.Logger) *controlResult {
	id := env.MsgID
	prev, err := g.st.BeginControl(id, env.Kind, subject, time.Now().UTC())
	if err != nil {
		return failed(id, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the request"))
	}
	if prev == nil {
		if env.Expired(time.Now()) {
			g.st.ForgetControl(id)
			log.Warn("control request expired before it was taken up: not carried out")
			return failed(id, fault.New(fault.TempFail, fault.KindTimeout, "the request expired before host %s took it up; not carried out", g.cfg.Host))
		}
		return nil
	}
	if prev.Kind != env.Kind || prev.Subject != subject {
		return failed(id, fault.New(fault.Usage, fault.KindUsage, "request id %s was used before for another request (%s %s)", id, prev.Kind, prev.Subject).
			WithHint("give each request its own --request-id"))
	}
	if prev.State == store.ControlDone {
		var res controlResult
		if err := json.Unmarshal(prev.Result, &res); err != nil {
			return failed(id, fault.Wrap(fault.Software, fault.KindInternal, err, "the record of request %s is unreadable", id))
		}
		log.Info("control request carried out before: answered from the record")
		return &res
	}
	return g.cutShort(env, subject, log)
}

// cutShort answers a request found running: the gateway died while
// carrying it out. A STOP is simply carried out again (stopping twice
// stops once); a SPAWN is not — what it started is unknown — and the
// answer says so, now and for every later delivery.
func (g *Gateway) cutShort(env *envelope.Envelope, subject string, log *slog.Logger) *controlResult {
	if env.Kind == envelope.Stop {
		return nil
	}
	log.Warn("spawn request was cut short by a gateway stop: not carried out again", "entity", subject)
	res := failed(env.MsgID, fault.New(fault.LaunchFailed, fault.KindSpawnUncertain,
		"the gateway of host %s stopped while spawning %s (request %s): whether it was started is unknown", g.cfg.Host, subject, env.MsgID).
		WithHint("look for it with: fleet-roster --host %s; stop it with: fleet-stop %s@%s", g.cfg.Host, subject, g.cfg.Host))
	g.record(env.MsgID, res, log)
	return res
}

func (g *Gateway) record(id string, res *controlResult, log *slog.Logger) {
	data, err := json.Marshal(res)
	if err == nil {
		err = g.st.EndControl(id, data, time.Now().UTC())
	}
	if err != nil {
		log.Error("recording the answer of a control request", "err", err)
	}
}

func (g *Gateway) handleSpawn(env *envelope.Envelope, b spawnBody) *controlResult {
	log := g.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "entity", b.Name, "profile", b.Profile)
	g.ctl.run.Lock()
	defer g.ctl.run.Unlock()
	if res := g.claim(env, b.Name, log); res != nil {
		return res
	}
	res := g.spawnNow(env, b, log)
	if res.Error != nil {
		// nothing was left behind: the same request may be tried again
		if err := g.st.ForgetControl(env.MsgID); err != nil {
			log.Error("forgetting a failed spawn request", "err", err)
		}
		return res
	}
	g.record(env.MsgID, res, log)
	return res
}

// spawnNow starts the profile's command and registers the entity. The
// command waits for its credential, so it never runs unregistered; a
// command that dies within the profile's grace undoes the registration.
func (g *Gateway) spawnNow(env *envelope.Envelope, b spawnBody, log *slog.Logger) *controlResult {
	id := env.MsgID
	p := g.cfg.Profiles[b.Profile]
	if p == nil {
		have := strings.Join(g.cfg.ProfileNames(), ", ")
		if have == "" {
			have = "none"
		}
		return failed(id, fault.New(fault.Usage, fault.KindUnknownProfile, "host %s has no profile %q (it has: %s)", g.cfg.Host, b.Profile, have).
			WithHint("define profile.%s.command in the config file of fleet-gw on %s", b.Profile, g.cfg.Host))
	}
	e := &store.Entity{Name: b.Name, Mode: p.Mode, Groups: b.Groups}
	check := *e // validated before anything starts; the pane is not known yet
	if p.Mode == "inject" {
		if p.Launcher == launch.Tmux {
			check.TmuxTarget = "(new window)"
		} else {
			check.Exec = p.Deliver
		}
	}
	if err := checkEntity(&check); err != nil {
		return failed(id, err)
	}
	_, taken := g.reg.Named(b.Name)
	if taken {
		return failed(id, fault.New(fault.Usage, fault.KindNameTaken, "%s is already registered on host %s", b.Name, g.cfg.Host).
			WithHint("choose another name, or stop it first with: fleet-stop %s@%s", b.Name, g.cfg.Host))
	}
	launchFailed := func(err error) *controlResult {
		log.Warn("launch failed", "launcher", p.Launcher, "err", err)
		return failed(id, fault.New(fault.LaunchFailed, fault.KindLaunchFailed,
			"the %s launcher of profile %s failed on host %s: %v", p.Launcher, p.Name, g.cfg.Host, err).
			WithHint("check profile.%s in the config file of fleet-gw on %s, and that gateway's log", p.Name, g.cfg.Host))
	}
	dir := p.Dir
	if dir == "" {
		dir, _ = os.Getwd()
	}
	dir, _ = filepath.Abs(dir)
	socket, _ := filepath.Abs(g.cfg.Socket)
	cred, _ := filepath.Abs(ident.File(g.cfg.StateDir, b.Name))
	logDir, _ := filepath.Abs(filepath.Join(g.cfg.StateDir, "spawn"))
	gid := envelope.NewID()
	proc, err := launch.Start(g.hardCtx, launch.Spec{
		Launcher: p.Launcher, Command: p.Command, Args: b.Args, Name: b.Name, Gid: gid,
		Socket: socket, CredFile: cred, Session: p.Session, Dir: dir, LogDir: logDir,
	})
	if err != nil {
		return launchFailed(err)
	}
	e.Gid = gid
	if p.Mode == "inject" {
		if p.Launcher == launch.Tmux {
			e.TmuxTarget = proc.Info.Pane
		} else {
			e.Exec = p.Deliver
		}
	}
	// recorded first, so fleet-stop finds the process even if this gateway
	// dies right after registering
	if info, err := json.Marshal(proc.Info); err == nil {
		if err := g.st.PutLaunched(gid, info); err != nil {
			log.Error("recording how the entity was launched: fleet-stop will not stop its process", "err", err)
		}
	}
	if _, _, err := g.register(e); err != nil { // the command starts now
		_ = launch.Stop(g.hardCtx, proc.Info)
		_ = g.st.DeleteLaunched(gid)
		return failed(id, err)
	}
	g.crashAt("spawn-after-register")
	if err := proc.Settle(g.hardCtx, p.Grace); err != nil {
		if _, uerr := g.unregister(gid, b.Name); uerr != nil {
			log.Error("removing an entity whose command died at once", "err", uerr)
		}
		_ = launch.Stop(g.hardCtx, proc.Info)
		return launchFailed(err)
	}
	g.audit.Write(audit.Line{Event: "spawned", TraceID: env.TraceID, MsgID: id, Sender: env.Sender.Gid, Entity: b.Name, Recipient: gid})
	log.Info("entity spawned", "gid", gid, "launcher", p.Launcher, "process", proc.Info.String(), "requester", env.Sender.String())
	return &controlResult{RequestID: id, Spawned: &api.Spawned{
		Gid: gid, Name: b.Name, Host: g.cfg.Host, RequestID: id, Profile: p.Name, Mode: p.Mode, Groups: groupsOf(e),
	}}
}

func (g *Gateway) handleStop(env *envelope.Envelope, b stopBody) *controlResult {
	log := g.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "gid", b.Gid)
	g.ctl.run.Lock()
	defer g.ctl.run.Unlock()
	if res := g.claim(env, b.Gid, log); res != nil {
		return res
	}
	res := g.stopNow(env, b, log)
	g.record(env.MsgID, res, log)
	return res
}

// stopNow stops what the entity's launcher started, then removes the
// entity exactly as fleet-roster leave does: what still waits in its inbox
// is dead-lettered ("recipient left the fleet") and its credential dies.
// In this order every step may be repeated: a STOP cut short by a crash and
// delivered again finds the process gone and finishes the leave. A process
// that cannot be stopped leaves the entity registered, for another try.
func (g *Gateway) stopNow(env *envelope.Envelope, b stopBody, log *slog.Logger) *controlResult {
	id := env.MsgID
	bx := g.box(b.Gid)
	if bx == nil {
		what := b.Gid
		if b.Name != "" {
			what = b.Name + " (" + b.Gid + ")"
		}
		return failed(id, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity %s on host %s", what, g.cfg.Host).
			WithHint("list entities with: fleet-roster --host %s", g.cfg.Host))
	}
	ent := bx.snapshot()
	process := ""
	if raw, err := g.st.Launched(ent.Gid); err == nil {
		var info launch.Info
		if err := json.Unmarshal(raw, &info); err != nil {
			log.Error("the record of how the entity was launched is unreadable: not stopped", "err", err)
			return failed(id, fault.Wrap(fault.Software, fault.KindInternal, err, "the launch record of %s is unreadable", ent.Name))
		}
		process = info.String()
		if err := launch.Stop(context.WithoutCancel(g.hardCtx), info); err != nil {
			log.Error("the process of the entity could not be stopped: it stays registered", "process", process, "err", err)
			return failed(id, fault.New(fault.LaunchFailed, fault.KindLaunchFailed,
				"the %s of %s could not be stopped: %v", process, ent.Name, err).
				WithHint("%s is still registered; stop the process by hand on host %s, then: fleet-roster leave %s", ent.Name, g.cfg.Host, ent.Name))
		}
	}
	n, err := g.unregister(ent.Gid, ent.Name)
	if err != nil {
		return failed(id, err)
	}
	g.audit.Write(audit.Line{Event: "stopped", TraceID: env.TraceID, MsgID: id, Sender: env.Sender.Gid, Entity: ent.Name, Recipient: ent.Gid})
	log.Info("entity stopped", "entity", ent.Name, "process", process, "dead_lettered", n, "requester", env.Sender.String())
	return &controlResult{RequestID: id, Stopped: &api.Stopped{
		Gid: ent.Gid, Name: ent.Name, Host: g.cfg.Host, DeadLettered: n, Process: process,
	}}
}

func groupsOf(e *store.Entity) []string {
	if e.Groups == nil {
		return []string{}
	}
	return e.Groups
}

// pruneControl forgets control requests answered before the dedup window.
func (g *Gateway) pruneControl() {
	n, err := g.st.PruneControl(time.Now().Add(-g.cfg.DedupWindow))
	if err != nil {
		g.log.Error("pruning control requests", "err", err)
	} else if n > 0 {
		g.log.Info("pruned control requests past the dedup window", "count", n)
	}
}
