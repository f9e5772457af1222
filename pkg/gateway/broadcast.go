package gateway

import (
	"github.com/fleetd/fleet/pkg/near"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// Broadcast (U8): one publish with key broadcast.all or broadcast.<group>;
// the broker copies it into every bound inbox, and each copy follows its
// entity's normal delivery. This host's members get their copies straight
// from the store — with the broker down too — and the broker's copies of
// them are dropped by the dedup (one record per msg id and member). The
// sender never gets its own broadcast.

func (g *Gateway) broadcast(req *api.BcastRequest) (*api.Response, error) {
	from, err := g.caller(req.Token)
	if err != nil {
		return nil, err
	}
	if err := envelope.CheckBody([]byte(req.Body), g.cfg.MaxBody); err != nil {
		return nil, err
	}
	// the group becomes the routing key: outside the grammar the broker
	// would refuse the publish (ident.ValidGroup)
	if err := ident.CheckGroup(req.Group); err != nil {
		return nil, err
	}
	group := req.Group
	if group == "" {
		group = "all"
	}
	sender := from.snapshot()
	env := envelope.New(envelope.Broadcast,
		envelope.Party{Gid: sender.Gid, Name: sender.Name, Host: sender.Host},
		envelope.Party{Group: group}, req.Body)
	// made while a message was delivered to the sender: a hop of it
	// (hops.go), cut past max-hops before anything is sent or stored
	parent := deliveredTo(g.st, req.Cause, sender.Gid)
	if parent != nil {
		env.TraceID, env.Hops = parent.TraceID, parent.Hops+1
	}
	if err := g.route.loops.Send(env, parent); err != nil {
		return nil, err
	}
	// sealing.go: a host with no sealing key that nothing allows text in
	// the clear refuses the whole broadcast (77), before anything is
	// published or stored; those allowed get copies in the clear, one
	// per member the peers' presence lists, under the same msg id
	var clearTo []envelope.Party
	var clearHosts []string
	if g.br != nil {
		hosts, err := g.seal.Check(env)
		if err != nil {
			return nil, err
		}
		clearTo, clearHosts = g.clearMembers(group, hosts)
		for _, p := range clearTo {
			env.ClearGids = append(env.ClearGids, p.Gid) // signed: their hosts drop the sealed copy there
		}
	}
	// the pair-rate of sender→group (pairrate.go), once every refusal
	// above left the token unspent
	if err := g.route.rate(env, false); err != nil {
		return nil, err
	}
	// The publish for other hosts starts at once; this host's copies are
	// stored meanwhile, concurrently, so they share group commits.
	var pubErr chan error
	if g.br != nil {
		pubErr = make(chan error, 1)
		g.audit.Message("published", env, 0, clearReason(clearHosts))
		// --wait-for-broker: the same broadcast again once the broker is
		// back (brokerwait.go); each member keeps one copy of a msg id
		bound := time.Duration(req.WaitBrokerMS) * time.Millisecond
		wait := g.route.brokerWait(bound)
		publish := func(bool) error { return g.publishBroadcast(group, env, clearTo) }
		if !g.side.Go(func() { pubErr <- wait.Do(bound, publish) }) {
			pubErr <- fault.New(fault.Unavailable, fault.KindBrokerDown, "the gateway is stopping: not published")
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var storeErr error
	var full []string // members here whose full inbox refused their copy (inboxcap.go)
	local := 0
	for _, b := range g.members(group) {
		e := b.snapshot()
		if e.Gid == sender.Gid {
			continue
		}
		cp := *env
		cp.ClearGids = nil
		cp.Recipient = envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host, Group: group}
		if g.policy.Check(e, &cp, "send") != nil {
			continue // a member that does not accept the sender (policy.go): audited, no copy
		}
		if g.caps.Refuse(&cp) != nil {
			full = append(full, e.Name)
			continue
		}
		local++
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.in.Accept(&cp); err != nil {
				mu.Lock()
				storeErr = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if storeErr != nil {
		if pubErr != nil {
			<-pubErr
		}
		return nil, storeErr
	}
	sent := &api.Sent{MsgID: env.MsgID, TraceID: env.TraceID, State: store.Accepted, Recipient: "broadcast." + group, ClearHosts: clearHosts}
	resp := &api.Response{Sent: sent, Count: local}
	var fullErr error
	if len(full) > 0 {
		// as a broker inbox's nack does: the call fails, the others have it
		sort.Strings(full)
		fullErr = fault.New(fault.TempFail, fault.KindInboxFull,
			"%s: the inbox of %s on this host is full and refused its copy; the other members have theirs", sent.Recipient, strings.Join(full, ", ")).
			WithHint("a member's inbox drains as it reads its mail (fleet-roster shows what waits)")
	}
	if g.br == nil {
		if fullErr != nil {
			return nil, fullErr
		}
		if local == 0 {
			return nil, g.nearGroup(group, fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no members of %s on this host", sent.Recipient))
		}
		return resp, nil
	}
	err = <-pubErr
	switch {
	case fullErr != nil && (err == nil || fault.KindOf(err) == fault.KindUnknownRecipient):
		if err == nil {
			g.audit.Message("confirmed", env, 0, "")
		}
		return nil, fullErr
	case err == nil:
		g.audit.Message("confirmed", env, 0, clearReason(clearHosts))
		return resp, nil
	case fault.KindOf(err) == fault.KindUnknownRecipient:
		if local > 0 {
			return resp, nil // members here only
		}
		return nil, g.nearGroup(group, fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no members of %s on any host", sent.Recipient))
	case fault.CodeOf(err) == fault.Partial:
		// sealed to the hosts with keys, and some members in the clear
		// not reached (publishBroadcast)
		g.audit.Message("confirmed", env, 0, clearReason(clearHosts))
		return resp, err
	case fault.KindOf(err) == fault.KindInboxFull:
		// reject-publish nacks the whole publish when any one bound inbox
		// is full; every other inbox has its copy: delivered in part (12,
		// not 75: a retry, under a new msg id, would give them a second)
		return resp, fault.New(fault.Partial, fault.KindInboxFull,
			"%s: the inbox of at least one member on another host is full and refused its copy; the other members have theirs", sent.Recipient).
			WithHint("do not run fleet-bcast again (the others would get it twice): once that inbox drains (its pending count in fleet-roster falls), send to its member with fleet-send NAME@HOST")
	}
	if local == 0 {
		return nil, err
	}
	// the local part is done; the command says which part failed, with
	// its own code (12, not the cause's 69 or 75): running it again would
	// give this host's members a second copy
	list := "fleet-roster --group " + group
	if group == "all" {
		list = "fleet-roster"
	}
	fe := fault.New(fault.Partial, fault.KindLocalOnly,
		"delivered to %d member(s) on this host; other hosts not reached: %v", local, err).
		WithHint("do not run fleet-bcast again (this host's %d member(s) would get it twice): once the broker is back "+
			"(fleet-gw status), reach the members on other hosts with fleet-send NAME@HOST (%s lists them)", local, list)
	return resp, fe
}

// clearMembers are the members of group on hosts (those with no sealing
// key allowed text in the clear), as the peers' presence lists them, by
// gid, and the hosts of those (sorted): what gets a copy in the clear.
func (g *Gateway) clearMembers(group string, hosts []string) ([]envelope.Party, []string) {
	if len(hosts) == 0 {
		return nil, nil
	}
	var to []envelope.Party
	var got []string
	for _, r := range g.peers.Rows(time.Now(), g.br.Connected(), g.cfg.PresenceTTL, g.admit.trusted) {
		if !slices.Contains(hosts, r.Host) || ident.GidHost(r.Gid) != r.Host || (group != "all" && !slices.Contains(r.Groups, group)) {
			continue
		}
		to = append(to, envelope.Party{Gid: r.Gid, Name: r.Name, Host: r.Host, Group: group})
		if !slices.Contains(got, r.Host) {
			got = append(got, r.Host)
		}
	}
	sort.Slice(to, func(i, j int) bool { return to[i].Gid < to[j].Gid })
	sort.Strings(got)
	return to, got
}

// publishBroadcast publishes a copy in the clear to each of clearTo's
// gids, then env once, sealed, to broadcast.<group>. The copies in the
// clear are confirmed first, so each such inbox holds its copy ahead of
// the sealed one: its host takes the readable one first, and drops the
// sealed one (clear_gids) or, an older fleet that ignores clear_gids,
// keeps one copy per msg id and member. The sealed publish's outcome is
// the broadcast's; a member in the clear gone from the broker (67) is
// let be, and any other failure of those copies is a delivery in part.
func (g *Gateway) publishBroadcast(group string, env *envelope.Envelope, clearTo []envelope.Party) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var missed []string
	var cause error
	for _, p := range clearTo {
		cp := *env
		cp.ClearGids, cp.Recipient = nil, p
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := g.br.Publish(g.hardCtx, p.Gid, &cp, true)
			switch {
			case err == nil:
			case fault.KindOf(err) == fault.KindUnknownRecipient:
				g.log.Info("broadcast: a member on a host without a sealing key has no inbox on the broker: no copy in the clear", "msg_id", env.MsgID, "trace_id", env.TraceID, "entity", p.Name, "peer", p.Host)
			default:
				mu.Lock()
				missed, cause = append(missed, p.Name+"@"+p.Host), err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	err := g.br.Publish(g.hardCtx, "broadcast."+group, env, true)
	if err != nil || len(missed) == 0 {
		return err
	}
	sort.Strings(missed)
	return fault.New(fault.Partial, fault.KindLocalOnly,
		"broadcast.%s: %s not reached with a copy in the clear: %v; every other member has it", group, strings.Join(missed, ", "), cause).
		WithHint("do not run fleet-bcast again (the others would get it twice): once the broker is back (fleet-gw status), send to each of them with fleet-send NAME@HOST")
}

// members are the local entities of a group ("all": every one).
func (g *Gateway) members(group string) []*mailbox {
	return g.reg.Members(group)
}

// setGroups changes an entity's groups; its inbox is rebound at once.
func (g *Gateway) setGroups(req *api.GroupsRequest) (*api.Response, error) {
	gid, ok := g.reg.Named(req.Name)
	if !ok {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name)
	}
	b := g.reg.Get(gid)
	if b == nil { // left meanwhile
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name)
	}
	if err := ident.CheckMember(req.Add); err != nil {
		return nil, err
	}
	// the groups are changed on the stored entity, in its transaction: a
	// change made at the same time is kept too, never overwritten
	before, e, err := b.update(g.st, func(e *store.Entity) error {
		for _, gr := range req.Add {
			if !slices.Contains(e.Groups, gr) {
				e.Groups = append(e.Groups, gr)
			}
		}
		e.Groups = slices.DeleteFunc(e.Groups, func(gr string) bool { return slices.Contains(req.Remove, gr) })
		return nil
	})
	if err != nil {
		return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the groups")
	}
	old := before.Groups
	if g.boxes.OnBroker(gid) {
		if err := g.br.SetGroups(gid, old, e.Groups); err != nil {
			g.log.Warn("inbox not rebound now; it will be on the next connection", "entity", e.Name, "err", err)
		}
	}
	g.notes.Change(gid)
	row := g.row(*e, nil, nil)
	return &api.Response{Entity: &row}, nil
}

// nearGroup adds to e the known group nearest a group with no members.
func (g *Gateway) nearGroup(group string, e *fault.Error) *fault.Error {
	seen := map[string]bool{}
	var groups []string
	add := func(gs []string) {
		for _, x := range gs {
			if !seen[x] {
				seen[x] = true
				groups = append(groups, x)
			}
		}
	}
	for _, b := range g.reg.Members("all") {
		add(b.snapshot().Groups)
	}
	if g.br != nil {
		for _, r := range g.remoteRows() {
			add(r.Groups)
		}
	}
	sort.Strings(groups)
	if n := near.Closest(group, groups); n != "" {
		return e.WithHint("did you mean --group %s? (fleet-roster lists the groups)", n)
	}
	return e.WithHint("fleet-roster lists each entity's groups")
}
