package gateway

import (
	"errors"
	"regexp"
	"time"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The entity verbs: join, leave, roster, status — what a request asks
// of this host's entities; and the inboxes part's Register and Unregister
// (inbox.go), the one path of an entity into and out of this host, which
// join and leave, fleet-spawn and fleet-stop (control_exec.go) all take.

// nameRE is the grammar of entity names (ident.NamePattern); group names
// are held to ident.ValidGroup.
var nameRE = regexp.MustCompile(ident.NamePattern)

func (g *Gateway) join(req *api.JoinRequest) (*api.Response, error) {
	e := &store.Entity{
		Name: req.Name, Mode: req.Mode,
		TmuxTarget: req.TmuxTarget, Exec: req.Exec, Nudge: req.Nudge, Groups: req.Groups,
		Program: req.Program, Turns: req.Turns, Paste: req.Paste, Header: req.Header, IdleScreen: req.IdleScreenMS,
		InterruptOnUrgent: req.InterruptOnUrgent,
	}
	if len(req.Accept) > 0 {
		rules, err := accept.ParseAll(req.Accept)
		if err != nil {
			return nil, fault.New(fault.Usage, fault.KindUsage, "%v", err)
		}
		e.Accept, e.OwnAccept = rawRules(rules), true
	}
	token, path, err := g.boxes.Register(e)
	if err != nil {
		return nil, err
	}
	row := g.row(*e, nil, nil)
	return &api.Response{Entity: &row, Token: token, CredFile: path}, nil
}

// checkEntity validates a new entity's name, groups, mode and targets.
func checkEntity(e *store.Entity) error {
	if err := ident.CheckName(e.Name); err != nil {
		return err
	}
	if err := ident.CheckMember(e.Groups); err != nil {
		return err
	}
	switch e.Mode {
	case "pull":
		if e.TmuxTarget != "" || e.Exec != "" {
			return fault.New(fault.Usage, fault.KindUsage, "a pull entity takes no --tmux-target or --exec")
		}
	case "hook":
		// held as for pull; the agent CLI's own hooks take it (fleet-recv
		// --hook). With a pane, the gateway types a wake notice there
		// (wake.go) — never a message — when its agent idles with mail
		if e.Exec != "" || e.Nudge != "" {
			return fault.New(fault.Usage, fault.KindUsage, "a hook entity takes no --exec or --nudge: its agent's hooks run fleet-recv --hook")
		}
		if e.Turns == turnsNone {
			return fault.New(fault.Usage, fault.KindUsage, "a hook entity's agent runs turn hooks: --turns none is for inject entities")
		}
	case "inject":
		if (e.TmuxTarget == "") == (e.Exec == "") {
			return fault.New(fault.Usage, fault.KindUsage, "an inject entity needs exactly one of --tmux-target or --exec")
		}
		if e.Nudge != "" {
			return fault.New(fault.Usage, fault.KindUsage, "--nudge is for pull entities")
		}
	default:
		return fault.New(fault.Usage, fault.KindUsage, "mode must be pull, inject or hook, not %q", e.Mode)
	}
	if err := checkPane(e); err != nil {
		return err
	}
	return checkInterrupt(e) // urgent.go
}

// Register validates e and registers it as a local entity: the one path of
// fleet-roster join and fleet-spawn. It fills in the gid (unless preset),
// host, credential hash, status and times; issues the credential and saves
// it owner-only; starts delivery and announces the entity.
func (ib *inboxes) Register(e *store.Entity) (token, credFile string, err error) {
	if err := checkEntity(e); err != nil {
		return "", "", err
	}
	if ib.br() != nil { // a name is one entity across the trusted hosts (names.go)
		now := time.Now()
		away := func(host string) string {
			state, heard := ib.peers.HostState(host, now, ib.br().Connected(), ib.cfg.PresenceTTL)
			return hostAway(host, state, heard, now)
		}
		if err := ib.names.Free(e.Name, ib.peers.ByName(e.Name, "", ib.admit().trusted), away); err != nil {
			return "", "", err
		}
	}
	if e.Gid == "" {
		e.Gid = ident.NewGid(ib.cfg.Host)
	}
	gid := e.Gid
	token, hash := ident.Issue(gid)
	now := time.Now().UTC()
	e.Host, e.TokenHash, e.Status, e.StatusAt, e.Created = ib.cfg.Host, hash, stIdle, now, now
	if e.TmuxTarget != "" {
		// its pane and program, and starting until its agent's first hook
		if err := bindPane(ib.run(), e); err != nil {
			return "", "", err
		}
		if other := paneTaken(ib.reg, e.PaneID, e.PanePID); other != "" {
			return "", "", fault.New(fault.Usage, fault.KindNameTaken, "tmux pane %s is %s's already", e.TmuxTarget, other).
				WithHint("one entity per pane: fleet-roster leave %s first", other)
		}
	}
	// With a broker, the inbox is declared, bound and consumed while the
	// store records the entity (both must succeed before join does; what
	// one made is undone when the other fails).
	var inbox chan error
	if ib.br() != nil {
		inbox = make(chan error, 1)
		go func() { inbox <- ib.br().AddInbox(gid, e.Groups) }()
	}
	undoInbox := func() {
		if inbox != nil && <-inbox == nil {
			if err := ib.br().RemoveInbox(gid, e.Groups); err != nil {
				ib.log.Warn("removing the inbox of a registration that failed", "gid", gid, "err", err)
			}
		}
	}
	if err := ib.st.CreateEntity(e); err != nil {
		undoInbox()
		if errors.Is(err, store.ErrNameTaken) {
			return "", "", fault.New(fault.Usage, fault.KindNameTaken, "%s is already registered on this host", e.Name).
				WithHint("choose another name, or remove it with: fleet-roster leave %s", e.Name)
		}
		return "", "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot register %s", e.Name)
	}
	if inbox != nil {
		if err := <-inbox; err != nil {
			ib.st.DeleteEntity(gid, "registration failed")
			return "", "", err
		}
	}
	ib.Add(e)
	// the credential file last: a spawned command waits for it and acts at
	// once, so the entity must be live before it exists
	path, err := ident.Save(ib.cfg.StateDir, e.Name, token)
	if err != nil {
		// undone as a leave is: the inbox first, then the mailbox, then
		// the entity (what reached it meanwhile is dead-lettered, told)
		if _, uerr := ib.Unregister(gid, e.Name); uerr != nil {
			ib.log.Error("undoing a registration whose credential could not be saved", "entity", e.Name, "err", uerr)
		}
		if fe := fault.NotPrivate(err); fe != nil {
			return "", "", fe
		}
		return "", "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot store the credential of %s", e.Name)
	}
	ib.change(gid)
	if ib.br() != nil { // heard of another one since it was checked: told at once
		ib.names.Tell(ib.cfg.Host, e.Name, append(ib.peers.ByName(e.Name, "", ib.admit().trusted), api.EntityRow{Name: e.Name, Host: e.Host, Gid: gid}))
	}
	ib.audit.Write(audit.Line{Event: "joined", Entity: e.Name, Recipient: gid})
	ib.log.Info("entity joined", "entity", e.Name, "gid", gid, "mode", e.Mode)
	return token, path, nil
}

func (g *Gateway) leave(req *api.LeaveRequest) (*api.Response, error) {
	gid, ok := g.reg.Named(req.Name)
	if !ok {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name).
			WithHint("list them with: fleet-roster")
	}
	n, err := g.boxes.Unregister(gid, req.Name)
	if err != nil {
		return nil, err
	}
	return &api.Response{Count: n}, nil
}

// Unregister removes local entity gid: the one path of fleet-roster leave
// and fleet-stop. Its broker inbox stops receiving and what is queued there
// is taken in; then everything waiting for it is dead-lettered ("recipient
// left the fleet") and its credential dies. It returns how many messages
// were dead-lettered.
func (ib *inboxes) Unregister(gid, name string) (int, error) {
	var groups []string
	if b := ib.reg.Get(gid); b != nil {
		groups = b.snapshot().Groups
	}
	if ib.OnBroker(gid) {
		// stop routing to it, take in what is queued, delete the queue.
		// Without the broker that cannot be done, and a queue left behind
		// would swallow mail nobody reads: refuse, and keep the entity.
		// whatever the cap: what waits there dies with the inbox below,
		// each sender told, rather than staying on the broker for nobody
		ib.caps.Leaving(gid, true)
		defer ib.caps.Leaving(gid, false)
		if err := ib.br().RemoveInbox(gid, groups); err != nil {
			ib.br().KeepInbox(gid, groups) // still ours: consumed again on reconnect
			return 0, fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "cannot remove %s now: its inbox queue on the broker must go with it", name).
				WithHint("try again once the broker is back")
		}
	}
	ib.Remove(gid)
	ib.follow.Forget(gid)
	// what waits is dead-lettered a page at a time, never the whole inbox
	// in memory: each sender hears why (bounce or receipt)
	const left, page = "recipient left the fleet", 256
	n := 0
	for {
		dead, err := ib.st.KillHead(gid, left, page)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return n, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot remove %s", name)
		}
		for _, env := range dead {
			ib.rcpt.Settled(env, store.Dead, left, 0)
		}
		if n += len(dead); len(dead) < page {
			break
		}
	}
	m, err := ib.st.DeleteEntity(gid, left)
	if err != nil {
		return n, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot remove %s", name)
	}
	n += m
	ident.Remove(ib.cfg.StateDir, name)
	if err := ib.st.DeleteLaunched(gid); err != nil { // spawned: how it was started (control.go)
		ib.log.Warn("forgetting how an entity was launched", "entity", name, "gid", gid, "err", err)
	}
	ib.change(gid) // announcer.go: in the chain's turn
	ib.audit.Write(audit.Line{Event: "left", Entity: name, Recipient: gid})
	ib.log.Info("entity left", "entity", name, "gid", gid, "dead_lettered", n)
	return n, nil
}

// row is e's roster row; dead and pending are the counts of every entity
// when the caller has them (one store operation each for a whole
// roster), nil to look up e's alone.
func (g *Gateway) row(e store.Entity, dead, pending map[string]int) api.EntityRow {
	groups := e.Groups
	if groups == nil {
		groups = []string{}
	}
	target := e.TmuxTarget
	if target == "" {
		target = e.Exec
	}
	waiting := pending[e.Gid] // PendingAll leaves an empty inbox out
	if pending == nil {
		waiting = g.st.Pending(e.Gid)
	}
	status := e.Status
	if status == "idle" && g.asks.Asking(e.Gid) {
		status = "waiting" // on an ask of its own (U2)
	}
	accepts, from := g.policy.Patterns(e)
	return api.EntityRow{
		Name: e.Name, Gid: e.Gid, Host: e.Host, Mode: e.Mode, Target: target, Groups: groups,
		Accept: accepts, AcceptFrom: from, InterruptOnUrgent: e.InterruptOnUrgent,
		Status: status, StatusReason: e.StatusReason, Program: e.Program,
		Pending: waiting, Dead: dead[e.Gid], LastDelivery: e.LastDelivery, StatusSince: e.StatusAt.UTC(),
	}
}

// localRows is this host's entities, exact.
func (g *Gateway) localRows() ([]api.EntityRow, error) {
	ents, err := g.st.Entities()
	if err != nil {
		return nil, err
	}
	dead, pending := g.st.DeadCounts(), g.st.PendingAll()
	rows := make([]api.EntityRow, 0, len(ents))
	for _, e := range ents {
		rows = append(rows, g.row(*e, dead, pending))
	}
	return rows, nil
}

// roster is the union view: this host's entities, exact, and every other
// host's as last heard.
func (g *Gateway) roster() (*api.Response, error) {
	rows, err := g.localRows()
	if err != nil {
		return nil, err
	}
	rows = append(rows, g.remoteRows()...)
	mark(rows) // a name more than one trusted host has (names.go)
	return &api.Response{Entities: rows}, nil
}

// setStatus is an agent's turn hook: busy or idle, from the entity whose
// credential the request presents or, with Pane, whose tmux pane the
// calling process runs in (agent.go: agentOf).
func (g *Gateway) setStatus(pid int32, req *api.StatusRequest) (*api.Response, error) {
	var b *mailbox
	agent := 0
	if req.Pane {
		var why string
		if b, agent, why = agentOf(g.reg, int(pid)); b == nil {
			return nil, fault.New(fault.Refused, fault.KindNotAgent, "this process runs in no inject entity's tmux pane on this host").
				WithHint("join the pane first: fleet-roster join NAME --mode inject|hook --tmux-target \"$TMUX_PANE\"")
		}
		if why != "" {
			// its hooks run, and nothing may be typed: unhooked at once,
			// with the reason, on every hook (agent.go: agentOf)
			was := b.snapshot()
			e, err := b.putStatus(g.st, stUnhooked, why, false, "")
			if err != nil {
				return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the status")
			}
			if was.Status != stUnhooked || was.StatusReason != why {
				g.log.Warn("the agent cannot be told from its pane's shell: its mail is held", "entity", e.Name, "reason", why)
				g.notes.Change(e.Gid)
			}
			row := g.row(*e, nil, nil)
			return &api.Response{Entity: &row}, nil
		}
	} else {
		var err error
		if b, err = g.caller(req.Token); err != nil {
			return nil, err
		}
	}
	e, program, err := b.hook(g.runCtx, g.st, req.Status, agent)
	if err != nil {
		return nil, err
	}
	if program != "" {
		g.log.Info("agent's program learnt from its first hook", "entity", e.Name, "program", program)
	}
	g.notes.Change(e.Gid)
	row := g.row(*e, nil, nil)
	return &api.Response{Entity: &row}, nil
}
