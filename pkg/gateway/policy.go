package gateway

// policy.go — who may reach an entity of this host (issue 37.1). Each
// entity has an inbound policy: its own (fleet-roster join --accept,
// fleet-roster accept), or the host's accept-default. The policy is
// checked where a message meets its recipient, on the recipient's host:
//
//   - a local sender's SEND, REPLY and ASK in the router and the asks
//     part, before anything is stored (exit 77, not_accepted), and each
//     local broadcast member's copy (skipped, said in the audit log);
//   - a message from another host in the intake (intake.go box), refused
//     to bridge.dlq with reason not_accepted: its sender's host gets the
//     refusal notice (refusals.go), so the sender's record goes dead and
//     the sender gets a BOUNCE;
//   - a SPAWN against the host's accept-default, a STOP against its
//     target's policy (control_exec.go), after the request's record and
//     under the same lock as its carrying out: one carried out before
//     gets its recorded answer whatever the policy says now.
//
// Who the sender is comes from what proved it: a local credential, or a
// message admission verified as signed by the sender's own host (admit.go).
// A group: rule matches the sender's groups as the sender's own host says
// them (this host's registry, or the signed presence of the sender's host).
// A REPLY to a message the recipient itself sent to the replier is
// always taken: the recipient asked for it (checked against this host's
// own record of the original — its sender and its recipient — never the
// message's word). A reply to a broadcast meets the policy as any send.

import (
	"slices"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// policy decides, for an entity of this host, whether a proven sender may
// reach it. It holds no state of its own beyond the host default: each
// entity's own rules are in its stored entity.
type policy struct {
	host    string        // this host
	def     []accept.Rule // accept-default
	st      *store.Store  // a REPLY's original, as this host recorded it
	reg     *registry     // local senders' groups
	peers   *peerView     // remote senders' groups, as their host announced them
	audit   *audit.Log
	metrics *metrics.Metrics // nil: off
}

func newPolicy(host string, def []accept.Rule, st *store.Store, reg *registry, peers *peerView, al *audit.Log, m *metrics.Metrics) *policy {
	return &policy{host: host, def: def, st: st, reg: reg, peers: peers, audit: al, metrics: m}
}

// Rules is e's policy in force, and whether it is its own ("own") or the
// host's ("default").
func (p *policy) Rules(e store.Entity) ([]accept.Rule, string) {
	if !e.OwnAccept {
		return p.def, "default"
	}
	rules, err := accept.ParseAll(e.Accept)
	if err != nil {
		// written by this gateway after a parse: a file edited by hand.
		// Nothing is accepted rather than everything.
		return nil, "own"
	}
	return rules, "own"
}

// Patterns is e's policy in force as text, and where it comes from.
func (p *policy) Patterns(e store.Entity) ([]string, string) {
	rules, from := p.Rules(e)
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Raw
	}
	return out, from
}

// policyKind is the policy kind of a message ("": not one a policy governs).
func policyKind(k envelope.Kind) accept.Kind {
	switch k {
	case envelope.Send, envelope.Reply:
		return accept.Send
	case envelope.Ask:
		return accept.Ask
	case envelope.Broadcast:
		return accept.Broadcast
	case envelope.Spawn:
		return accept.Spawn
	case envelope.Stop:
		return accept.Stop
	}
	return ""
}

// Check decides whether env may reach e, the local entity it is for;
// where is "send" (a local sender's) or "arrival" (from the broker). A
// refusal is audited and counted, and is a fault (77, not_accepted) that
// names the policy.
func (p *policy) Check(e store.Entity, env *envelope.Envelope, where string) error {
	if p == nil { // a part test's, with no policy
		return nil
	}
	rules, from, ok := p.decide(e, env)
	if ok {
		return nil
	}
	return p.refuse(e, env, where, rules, from)
}

// Allows is Check without its side effects: whether env may reach e.
func (p *policy) Allows(e store.Entity, env *envelope.Envelope) bool {
	if p == nil {
		return true
	}
	_, _, ok := p.decide(e, env)
	return ok
}

// Arrival is Check for a message from another host, as the intake takes
// it: a copy of one this host took before (a redelivery, after the
// policy changed) is left to the dedup, never refused — its sender was
// told it was delivered.
func (p *policy) Arrival(e store.Entity, env *envelope.Envelope) error {
	if p == nil {
		return nil
	}
	rules, from, ok := p.decide(e, env)
	if ok {
		return nil
	}
	if _, err := p.st.Record(store.Key(env)); err == nil {
		return nil
	}
	return p.refuse(e, env, "arrival", rules, from)
}

// refuse audits, counts and says a refusal.
func (p *policy) refuse(e store.Entity, env *envelope.Envelope, where string, rules []accept.Rule, from string) error {
	what := "its own policy"
	if from == "default" {
		what = "this host's accept-default"
	}
	return p.refused(env, where, fault.New(fault.Refused, fault.KindNotAccepted,
		"%s@%s does not accept %s from %s@%s (%s: %s)", e.Name, e.Host, policyKind(env.Kind), env.Sender.Name, env.Sender.Host, what, accept.String(rules)).
		WithHint("%s's host may allow it: fleet-roster accept %s add %s@%s (on %s)", e.Name, e.Name, env.Sender.Name, env.Sender.Host, e.Host))
}

// CheckControl decides a SPAWN (by the host's accept-default) or a STOP
// (by its target's policy; target nil: the default) from the proven
// requester.
func (p *policy) CheckControl(target *store.Entity, env *envelope.Envelope) error {
	if p == nil {
		return nil
	}
	if target != nil {
		return p.Check(*target, env, "arrival")
	}
	rules, _, ok := p.decide(store.Entity{Host: p.host}, env)
	if ok {
		return nil
	}
	return p.refused(env, "arrival", fault.New(fault.Refused, fault.KindNotAccepted,
		"host %s does not accept %s from %s@%s (its accept-default: %s)", p.host, policyKind(env.Kind), env.Sender.Name, env.Sender.Host, accept.String(rules)).
		WithHint("on %s, name %s@%s/%s in accept-default (fleet-config(5))", p.host, env.Sender.Name, env.Sender.Host, policyKind(env.Kind)))
}

// decide is the policy in force for e, where it comes from, and whether
// it accepts env.
func (p *policy) decide(e store.Entity, env *envelope.Envelope) ([]accept.Rule, string, bool) {
	kind := policyKind(env.Kind)
	rules, from := p.Rules(e)
	if kind == "" || accept.Everyone(rules) {
		return rules, from, true // the default's fast path: no look at the sender
	}
	if env.Kind == envelope.Reply && p.repliesTo(e, env) {
		return rules, from, true
	}
	s := accept.Sender{Name: env.Sender.Name, Host: env.Sender.Host}
	if accept.NeedsGroups(rules) {
		s.Groups = p.groups(env.Sender.Gid)
	}
	_, ok := accept.Decide(rules, s, kind)
	return rules, from, ok
}

// refused audits and counts a refusal.
func (p *policy) refused(env *envelope.Envelope, where string, err *fault.Error) error {
	p.audit.Message("not_accepted", env, 0, err.Msg)
	p.metrics.NotAccepted(where)
	return err
}

// repliesTo reports whether env answers a message e sent: this host's
// record of its original names e as the sender.
func (p *policy) repliesTo(e store.Entity, env *envelope.Envelope) bool {
	if env.InReplyTo == "" {
		return false
	}
	// e sent the original, to the entity that replies (its gid proven:
	// a local credential, or admission's check that the signing host is
	// the sender's): knowing a msg id of e's is not enough
	r, err := p.st.Record(env.InReplyTo)
	return err == nil && r.Sender == e.Gid && r.Recipient == env.Sender.Gid
}

// groups are a sender's groups as its own host says them.
func (p *policy) groups(gid string) []string {
	if b := p.reg.Get(gid); b != nil {
		return slices.Clone(b.snapshot().Groups)
	}
	return p.peers.Groups(gid)
}

// rawRules are rules as they are stored: each as given, once.
func rawRules(rules []accept.Rule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		if !slices.Contains(out, r.Raw) {
			out = append(out, r.Raw)
		}
	}
	return out
}

// Change is fleet-roster accept NAME add|remove|reset|list: the entity's
// own policy changed in its stored entity's transaction (a change made
// at the same time is kept too), or read. Its row is the answer.
func (p *policy) Change(b *mailbox, req *api.AcceptRequest) (store.Entity, error) {
	rules, err := accept.ParseAll(req.Patterns)
	if err != nil {
		return store.Entity{}, fault.New(fault.Usage, fault.KindUsage, "%v", err)
	}
	var change func(e *store.Entity)
	switch req.Action {
	case "list":
		if len(rules) > 0 {
			return store.Entity{}, fault.New(fault.Usage, fault.KindUsage, "accept list takes no pattern")
		}
		return b.snapshot(), nil
	case "reset":
		if len(rules) > 0 {
			return store.Entity{}, fault.New(fault.Usage, fault.KindUsage, "accept reset takes no pattern: it goes back to the host's accept-default")
		}
		change = func(e *store.Entity) { e.Accept, e.OwnAccept = nil, false }
	case "add", "remove":
		if len(rules) == 0 {
			return store.Entity{}, fault.New(fault.Usage, fault.KindUsage, "accept %s needs a PATTERN (NAME, NAME@HOST, @HOST, group:G or *, optionally /KIND,...)", req.Action)
		}
		add := req.Action == "add"
		change = func(e *store.Entity) {
			if !e.OwnAccept {
				// an entity that follows the default: an add gives it a
				// policy of just those patterns (a * in the default would
				// make it moot), a remove starts from the default's
				e.Accept = nil
				if !add {
					e.Accept, _ = p.Patterns(*e)
				}
				e.OwnAccept = true
			}
			for _, raw := range rawRules(rules) {
				has := slices.Contains(e.Accept, raw)
				switch {
				case add && !has:
					e.Accept = append(slices.Clip(e.Accept), raw)
				case !add && has:
					e.Accept = slices.DeleteFunc(slices.Clone(e.Accept), func(s string) bool { return s == raw })
				}
			}
		}
	default:
		return store.Entity{}, fault.New(fault.Usage, fault.KindUsage, "accept: %q is not add, remove, reset or list", req.Action)
	}
	_, e, err := b.update(p.st, func(e *store.Entity) error { change(e); return nil })
	if err != nil {
		return store.Entity{}, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the policy")
	}
	return *e, nil
}
