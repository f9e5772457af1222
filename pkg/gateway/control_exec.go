package gateway

// control_exec.go — the executing side of the control plane (see
// control.go for the whole flow): a SPAWN or STOP for this host, carried
// out once per request id with the profile's launcher, and answered to the
// requester.

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/launch"
	"github.com/fleetd/fleet/pkg/store"
)

// controlExec carries out the SPAWN and STOP asked of this host: each
// request id once (the store's control records), one at a time, with the
// profile's launcher, answered to the requester. What it needs of the rest
// of the gateway comes as hooks, wired once (gateway.go open).
type controlExec struct {
	cfg    *config.Config // the host, its profiles, socket and state folder, the dedup window
	st     *store.Store
	log    *slog.Logger
	audit  *audit.Log
	reg    *registry
	follow *followers
	policy *policy // policy.go: who may spawn here, or stop an entity
	crash  crashpoint
	run    sync.Mutex // one control request carried out at a time on this host

	ctx        func() context.Context                                              // the work in flight's: cancelled past the drain bound
	answer     func(ctx context.Context, gid string, env *envelope.Envelope) error // to the requester's inbox (the broker)
	trace      func(env *envelope.Envelope) error                                  // a trace query, on the control queue too (trace.go)
	free       func(name string) error                                             // no other trusted host has the name (names.go); nil: not checked
	register   func(e *store.Entity) error                                         // entities.go
	unregister func(gid, name string) (int, error)                                 // entities.go: what fleet-roster leave does
}

// Take is the broker's handler for this host's control queue: carry
// the request out, then answer the requester. An error requeues the
// request; carried out already, it is then answered from the record.
func (x *controlExec) Take(env *envelope.Envelope) error {
	if env.Kind == envelope.Trace {
		return x.trace(env) // trace.go
	}
	if env.Sender.Gid == "" {
		// a request speaks for an entity of the signing host (admit.go)
		return broker.Refuse(broker.ReasonMalformed, "a %s that names no requester", env.Kind)
	}
	res := x.CarryOut(env)
	log := x.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "peer", env.Sender.Host)
	kind := envelope.SpawnResult
	if env.Kind == envelope.Stop {
		kind = envelope.StopResult
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	ans := envelope.New(kind, envelope.Party{Host: x.cfg.Host}, env.Sender, string(data))
	ans.TraceID, ans.InReplyTo, ans.Expires = env.TraceID, env.MsgID, env.Expires
	err = x.answer(x.ctx(), env.Sender.Gid, ans)
	switch {
	case err == nil:
		return nil
	case fault.CodeOf(err) == fault.NoRecipient:
		log.Warn("the requester's inbox is gone: answer dropped", "requester", env.Sender.String())
		return nil
	}
	return err
}

// CarryOut carries out one control request on this host.
func (x *controlExec) CarryOut(env *envelope.Envelope) *controlResult {
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
		return x.spawn(env, b)
	case envelope.Stop:
		var b stopBody
		if err := json.Unmarshal([]byte(env.Body), &b); err != nil {
			return bad(err)
		}
		return x.stop(env, b)
	}
	return failed(id, fault.New(fault.Data, fault.KindBadEnvelope, "%s is not a control request", env.Kind))
}

// claim records request id as being carried out. It returns the answer to
// give instead when the id was handled before.
func (x *controlExec) claim(env *envelope.Envelope, subject string, log *slog.Logger) *controlResult {
	id := env.MsgID
	prev, err := x.st.BeginControl(id, env.Kind, subject, time.Now().UTC())
	if err != nil {
		return failed(id, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the request"))
	}
	if prev == nil {
		if env.Expired(time.Now()) {
			x.st.ForgetControl(id)
			log.Warn("control request expired before it was taken up: not carried out")
			return failed(id, fault.New(fault.TempFail, fault.KindTimeout, "the request expired before host %s took it up; not carried out", x.cfg.Host))
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
	return x.cutShort(env, subject, log)
}

// cutShort answers a request found running: the gateway died while
// carrying it out. A STOP is simply carried out again (stopping twice
// stops once); a SPAWN is not — what it started is unknown — and the
// answer says so, now and for every later delivery.
func (x *controlExec) cutShort(env *envelope.Envelope, subject string, log *slog.Logger) *controlResult {
	if env.Kind == envelope.Stop {
		return nil
	}
	log.Warn("spawn request was cut short by a gateway stop: not carried out again", "entity", subject)
	res := failed(env.MsgID, fault.New(fault.LaunchFailed, fault.KindSpawnUncertain,
		"the gateway of host %s stopped while spawning %s (request %s): whether it was started is unknown", x.cfg.Host, subject, env.MsgID).
		WithHint("look for it with: fleet-roster --host %s; stop it with: fleet-stop %s@%s", x.cfg.Host, subject, x.cfg.Host))
	x.record(env.MsgID, res, log)
	return res
}

// unclaim forgets request id claimed and then refused before anything of
// it was done: the same request may be tried again.
func (x *controlExec) unclaim(id string, log *slog.Logger) {
	if err := x.st.ForgetControl(id); err != nil {
		log.Error("forgetting a refused control request", "err", err)
	}
}

func (x *controlExec) record(id string, res *controlResult, log *slog.Logger) {
	data, err := json.Marshal(res)
	if err == nil {
		err = x.st.EndControl(id, data, time.Now().UTC())
	}
	if err != nil {
		log.Error("recording the answer of a control request", "err", err)
	}
}

func (x *controlExec) spawn(env *envelope.Envelope, b spawnBody) *controlResult {
	log := x.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "entity", b.Name, "profile", b.Profile)
	x.run.Lock()
	defer x.run.Unlock()
	// claimed first: a request carried out before is answered from its
	// record whatever the policy says now (it was allowed then); a new one
	// meets the host's accept-default (policy.go)
	if res := x.claim(env, b.Name, log); res != nil {
		return res
	}
	if err := x.policy.CheckControl(nil, env); err != nil {
		x.unclaim(env.MsgID, log) // not recorded: allowed later, the same request may be tried again
		return failed(env.MsgID, err)
	}
	res := x.spawnNow(env, b, log)
	if res.Error != nil {
		// nothing was left behind: the same request may be tried again
		if err := x.st.ForgetControl(env.MsgID); err != nil {
			log.Error("forgetting a failed spawn request", "err", err)
		}
		return res
	}
	x.record(env.MsgID, res, log)
	return res
}

// spawnNow starts the profile's command and registers the entity. The
// command waits for its credential, so it never runs unregistered; a
// command that dies within the profile's grace undoes the registration.
func (x *controlExec) spawnNow(env *envelope.Envelope, b spawnBody, log *slog.Logger) *controlResult {
	id := env.MsgID
	p := x.cfg.Profiles[b.Profile]
	if p == nil {
		have := strings.Join(x.cfg.ProfileNames(), ", ")
		if have == "" {
			have = "none"
		}
		return failed(id, fault.New(fault.Usage, fault.KindUnknownProfile, "host %s has no profile %q (it has: %s)", x.cfg.Host, b.Profile, have).
			WithHint("define profile.%s.command in the config file of fleet-gw on %s", b.Profile, x.cfg.Host))
	}
	e := &store.Entity{Name: b.Name, Mode: p.Mode, Groups: b.Groups, Nudge: p.Nudge}
	check := *e // validated before anything starts; the pane is not known yet
	if p.Mode == "inject" {
		if p.Launcher == launch.Tmux {
			check.TmuxTarget = "(new window)"
			check.Program, check.Turns, check.Paste, check.Header = p.Program, p.Turns, p.Paste, p.Header
			check.IdleScreen = p.IdleScreen.Milliseconds()
		} else {
			check.Exec = p.Deliver
		}
	}
	if err := checkEntity(&check); err != nil {
		return failed(id, err)
	}
	_, taken := x.reg.Named(b.Name)
	if taken {
		return failed(id, fault.New(fault.Usage, fault.KindNameTaken, "%s is already registered on host %s", b.Name, x.cfg.Host).
			WithHint("choose another name, or stop it first with: fleet-stop %s@%s", b.Name, x.cfg.Host))
	}
	if x.free != nil { // before anything starts; register checks again
		if err := x.free(b.Name); err != nil {
			return failed(id, err)
		}
	}
	launchFailed := func(err error) *controlResult {
		log.Warn("launch failed", "launcher", p.Launcher, "err", err)
		return failed(id, fault.New(fault.LaunchFailed, fault.KindLaunchFailed,
			"the %s launcher of profile %s failed on host %s: %v", p.Launcher, p.Name, x.cfg.Host, err).
			WithHint("check profile.%s in the config file of fleet-gw on %s, and that gateway's log", p.Name, x.cfg.Host))
	}
	dir := p.Dir
	if dir == "" {
		dir, _ = os.Getwd()
	}
	dir, _ = filepath.Abs(dir)
	socket, _ := filepath.Abs(x.cfg.Socket)
	cred, _ := filepath.Abs(ident.File(x.cfg.StateDir, b.Name))
	logDir, _ := filepath.Abs(filepath.Join(x.cfg.StateDir, "spawn"))
	gid := ident.NewGid(x.cfg.Host)
	proc, err := launch.Start(x.ctx(), launch.Spec{
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
			e.Program, e.Turns, e.Paste, e.Header = p.Program, p.Turns, p.Paste, p.Header
			e.IdleScreen = p.IdleScreen.Milliseconds()
		} else {
			e.Exec = p.Deliver
		}
	}
	// recorded first, so fleet-stop finds the process even if this gateway
	// dies right after registering
	if info, err := json.Marshal(proc.Info); err == nil {
		if err := x.st.PutLaunched(gid, info); err != nil {
			log.Error("recording how the entity was launched: fleet-stop will not stop its process", "err", err)
		}
	}
	if err := x.register(e); err != nil { // the command starts now
		_ = launch.Stop(x.ctx(), proc.Info)
		_ = x.st.DeleteLaunched(gid)
		return failed(id, err)
	}
	x.crash.at(x.log, "spawn-after-register")
	if err := proc.Settle(x.ctx(), p.Grace); err != nil {
		if _, uerr := x.unregister(gid, b.Name); uerr != nil {
			log.Error("removing an entity whose command died at once", "err", uerr)
		}
		_ = launch.Stop(x.ctx(), proc.Info)
		return launchFailed(err)
	}
	if bx := x.reg.Get(gid); bx != nil {
		x.follow.Spawned(bx, proc.Info) // a pull entity reads detached once its process is gone
	}
	x.audit.Write(audit.Line{Event: "spawned", TraceID: env.TraceID, MsgID: id, Sender: env.Sender.Gid, Entity: b.Name, Recipient: gid})
	log.Info("entity spawned", "gid", gid, "launcher", p.Launcher, "process", proc.Info.String(), "requester", env.Sender.String())
	return &controlResult{RequestID: id, Spawned: &api.Spawned{
		Gid: gid, Name: b.Name, Host: x.cfg.Host, RequestID: id, Profile: p.Name, Mode: p.Mode, Groups: groupsOf(e),
	}}
}

func (x *controlExec) stop(env *envelope.Envelope, b stopBody) *controlResult {
	log := x.log.With("request_id", env.MsgID, "trace_id", env.TraceID, "gid", b.Gid)
	x.run.Lock()
	defer x.run.Unlock()
	// as a spawn: the record first, then the target's policy, read under
	// the same lock as the stop that follows (policy.go)
	if res := x.claim(env, b.Gid, log); res != nil {
		return res
	}
	if bx := x.reg.Get(b.Gid); bx != nil {
		e := bx.snapshot()
		if err := x.policy.CheckControl(&e, env); err != nil {
			x.unclaim(env.MsgID, log)
			return failed(env.MsgID, err)
		}
	}
	res := x.stopNow(env, b, log)
	x.record(env.MsgID, res, log)
	return res
}

// stopNow stops what the entity's launcher started, then removes the
// entity exactly as fleet-roster leave does: what still waits in its inbox
// is dead-lettered ("recipient left the fleet") and its credential dies.
// In this order every step may be repeated: a STOP cut short by a crash and
// delivered again finds the process gone and finishes the leave. A process
// that cannot be stopped leaves the entity registered, for another try.
func (x *controlExec) stopNow(env *envelope.Envelope, b stopBody, log *slog.Logger) *controlResult {
	id := env.MsgID
	bx := x.reg.Get(b.Gid)
	if bx == nil {
		what := b.Gid
		if b.Name != "" {
			what = b.Name + " (" + b.Gid + ")"
		}
		return failed(id, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity %s on host %s", what, x.cfg.Host).
			WithHint("list entities with: fleet-roster --host %s", x.cfg.Host))
	}
	ent := bx.snapshot()
	process := ""
	if raw, err := x.st.Launched(ent.Gid); err == nil {
		var info launch.Info
		if err := json.Unmarshal(raw, &info); err != nil {
			log.Error("the record of how the entity was launched is unreadable: not stopped", "err", err)
			return failed(id, fault.Wrap(fault.Software, fault.KindInternal, err, "the launch record of %s is unreadable", ent.Name))
		}
		process = info.String()
		if err := launch.Stop(context.WithoutCancel(x.ctx()), info); err != nil {
			log.Error("the process of the entity could not be stopped: it stays registered", "process", process, "err", err)
			return failed(id, fault.New(fault.LaunchFailed, fault.KindLaunchFailed,
				"the %s of %s could not be stopped: %v", process, ent.Name, err).
				WithHint("%s is still registered; stop the process by hand on host %s, then: fleet-roster leave %s", ent.Name, x.cfg.Host, ent.Name))
		}
	}
	n, err := x.unregister(ent.Gid, ent.Name)
	if err != nil {
		return failed(id, err)
	}
	x.audit.Write(audit.Line{Event: "stopped", TraceID: env.TraceID, MsgID: id, Sender: env.Sender.Gid, Entity: ent.Name, Recipient: ent.Gid})
	log.Info("entity stopped", "entity", ent.Name, "process", process, "dead_lettered", n, "requester", env.Sender.String())
	return &controlResult{RequestID: id, Stopped: &api.Stopped{
		Gid: ent.Gid, Name: ent.Name, Host: x.cfg.Host, DeadLettered: n, Process: process,
	}}
}

func groupsOf(e *store.Entity) []string {
	if e.Groups == nil {
		return []string{}
	}
	return e.Groups
}

// Prune forgets control requests answered before the dedup window.
func (x *controlExec) Prune() {
	n, err := x.st.PruneControl(time.Now().Add(-x.cfg.DedupWindow))
	if err != nil {
		x.log.Error("pruning control requests", "err", err)
	} else if n > 0 {
		x.log.Info("pruned control requests past the dedup window", "count", n)
	}
}
