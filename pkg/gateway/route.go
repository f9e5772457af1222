package gateway

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/near"
	"github.com/fleetd/fleet/pkg/store"
)

// router is the routing fork and the sender's side of a message: a
// recipient resolved (this host's registry, or the peers' view of the
// others), a send checked and stored here (intake) or published to the
// broker and recorded, and what became of it told to its sender (Lookup,
// WaitState). It holds no state of its own: what it reads is wired in once
// (gateway.go open); the broker and the admission are read at each use
// (set in Run, nil in single-host mode).
type router struct {
	cfg     *config.Config
	st      *store.Store
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics // nil: off
	reg     *registry
	peers   *peerView
	names   *nameBook
	admits  *admitsView
	caps    *inboxCaps
	seal    *sealing    // sealing.go: a large message kept as published, sealed (nil: as it is)
	in      *intake     // a local message into its inbox
	rcpt    *receipts   // a message dead here bounces
	policy  *policy     // policy.go: who may reach an entity of this host
	loops   *loopGuard  // hops.go: past max-hops, cut
	pairs   *pairRates  // pairrate.go: the sends of one pair a minute
	urgent  *urgentRate // urgent.go: each sender's urgent messages a minute

	br      func() *broker.Broker                // nil: single-host mode
	admit   func() *admission                    // nil: single-host mode
	caller  func(token string) (*mailbox, error) // gateway.go: the entity whose credential a request presents
	remote  func() []api.EntityRow               // presence.go: the other hosts' entities
	heard   func()                               // presence.go: keep what was heard (saveHeard)
	ctx     func() context.Context               // the work in flight's: cancelled past the drain bound
	closing func() <-chan struct{}               // closed when shutdown starts: a wait ends
}

// target is where a message goes: a local mailbox, or a gid on another
// host reached through the broker.
type target struct {
	box        *mailbox
	gid        string // remote
	name, host string // remote, when resolved through the roster view
	warning    string // a bare name more than one trusted host has (names.go)
}

// Resolve finds a recipient by name, name@host or gid. This is the routing
// fork: a recipient on this host is served from the embedded store and
// never touches the broker; any other goes to the broker, which alone knows
// where its inbox is. Names are looked up in the union roster view: a name
// on two trusted hosts means the entity made first (names.go), a name
// nowhere is unknown (67).
func (rt *router) Resolve(to string) (target, error) {
	name, host, qualified := strings.Cut(to, "@")
	if ident.IsGid(to) {
		if b := rt.reg.Get(to); b != nil {
			return target{box: b}, nil
		}
		if rt.br() == nil {
			return target{}, fault.New(fault.NoRecipient, fault.KindUnknownRecipient,
				"no recipient %s on this host, and no broker is configured to reach other hosts", to).
				WithHint("list entities with: fleet-roster")
		}
		// named as this host last heard it (never from a body): a gid
		// names its host, and the view the name
		return target{gid: to, name: rt.peers.Name(to), host: ident.GidHost(to)}, nil
	}
	var local *mailbox
	if !qualified || host == rt.cfg.Host {
		local = rt.reg.ByName(name)
	}
	var remote []api.EntityRow
	if rt.br() != nil && (!qualified || host != rt.cfg.Host) {
		remote = rt.peers.ByName(name, host, rt.admit().trusted)
	}
	rows := remote
	if local != nil {
		e := local.snapshot()
		rows = append(slices.Clip(rows), api.EntityRow{Name: e.Name, Host: e.Host, Gid: e.Gid})
	}
	switch {
	case len(rows) == 0:
		if qualified && host != rt.cfg.Host && rt.br() == nil {
			return target{}, fault.New(fault.NoRecipient, fault.KindUnknownRecipient,
				"no recipient %s: host %s is not this host and no broker is configured", to, host)
		}
		if qualified && host != rt.cfg.Host && !rt.admit().trusted(host) {
			return target{}, untrustedName(to, name, host, rt.names.Rumoured(name, host, rt.admit().trustedNow()))
		}
		if err := rt.unsettled(to, host); err != nil {
			return target{}, err
		}
		if hosts := rt.names.Rumoured(name, host, rt.admit().trustedNow()); len(hosts) > 0 {
			// never "did you mean" another entity: the name is elsewhere
			return target{}, untrustedName(to, name, host, hosts)
		}
		e := fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient named %s", to)
		if n := rt.nearName(name, host); n != "" {
			return target{}, e.WithHint("did you mean %s? (list entities with: fleet-roster)", n)
		}
		return target{}, e.WithHint("list entities with: fleet-roster")
	case len(rows) == 1 && local != nil:
		return target{box: local}, nil
	case len(rows) == 1:
		return target{gid: remote[0].Gid, name: remote[0].Name, host: remote[0].Host}, nil
	}
	// on more than one trusted host (joined at once, or before they
	// trusted each other): the first made, on every host alike
	h := holder(rows)
	warning := conflictWarning(rows, h)
	if local != nil && h.Host == rt.cfg.Host && h.Gid == local.snapshot().Gid {
		return target{box: local, warning: warning}, nil
	}
	return target{gid: h.Gid, name: h.Name, host: h.Host, warning: warning}, nil
}

// unsettled says why a name known nowhere may still exist: the broker is
// down (other hosts cannot be heard: 69), or this gateway connected less
// than the settle window ago and has not yet heard since then every
// trusted host the name could be on (75). Otherwise — or for a name of
// this host (exact), or on a host not in the trust file (never heard) — it
// is nil and the name is unknown (67). Trusted hosts are those of the
// trust file's lines and the certified ones (admit.go). A name known before — heard, kept
// across a restart — never gets here: it resolves to its last gid and the
// broker decides.
func (rt *router) unsettled(to, host string) error {
	if rt.br() == nil || host == rt.cfg.Host {
		return nil
	}
	var hosts []string // the trusted hosts the name could be on
	for _, h := range rt.admit().trustedHosts() {
		if host == "" || h == host {
			hosts = append(hosts, h)
		}
	}
	// with an operator trusted, a host certified but not heard yet may
	// hold it too: no list of hosts says the roster is complete
	open := len(rt.admit().file.Operators()) > 0 && (host == "" || !slices.Contains(hosts, host))
	if len(hosts) == 0 && !open {
		return nil // no host it could be on is trusted: nothing of it can be heard
	}
	state, _, _, since := rt.br().State()
	if state != "connected" && state != "blocked" { // blocked: presence still comes in
		return fault.New(fault.Unavailable, fault.KindBrokerDown,
			"no entity %s is known here, and the broker is down: it may be on a host this gateway cannot hear", to).
			WithHint("local sends keep working; try again once the broker is back (fleet-gw status)")
	}
	wait := rosterSettle(rt.cfg.PresenceInterval) - time.Since(since)
	if wait <= 0 || (!open && rt.peers.HeardAllSince(hosts, since)) {
		return nil
	}
	return fault.New(fault.TempFail, fault.KindRosterSettling,
		"no entity %s is known here yet: the roster is still filling (connected to the broker %v ago)", to, time.Since(since).Round(time.Millisecond)).
		WithHint("try again in %v, or send by gid", wait.Round(100*time.Millisecond))
}

// rosterSettle is how long after connecting the roster may still be
// filling: every host sends a whole snapshot once per interval.
func rosterSettle(interval time.Duration) time.Duration { return interval + interval/2 }

// nearName is the known entity name nearest a mistyped one ("" if none
// is near): as NAME when it lives here, NAME@HOST when elsewhere.
func (rt *router) nearName(name, host string) string {
	cands := map[string]string{} // name -> as it is suggested
	if host == "" || host == rt.cfg.Host {
		for _, n := range rt.reg.Names() {
			cands[n] = n
		}
	}
	if rt.br() != nil {
		for _, r := range rt.remote() {
			if _, here := cands[r.Name]; !here && r.Status != "untrusted" && (host == "" || r.Host == host) {
				cands[r.Name] = r.Name + "@" + r.Host
			}
		}
	}
	names := make([]string, 0, len(cands))
	for n := range cands {
		names = append(names, n)
	}
	sort.Strings(names)
	if n := near.Closest(name, names); n != "" {
		return cands[n]
	}
	return ""
}

// Send accepts one message: who sends it comes from the credential, never
// from the request; the body is checked; a local message is durably in the
// recipient's inbox, a remote one confirmed by the broker, before the
// sender hears "accepted".
func (rt *router) Send(req *api.SendRequest) (*api.Response, error) { return rt.SendWith(req, nil) }

// SendWith is Send; before is called with the envelope just before it is
// stored or published (rendezvous.go registers an open send's waiter there,
// so no reply can arrive unseen).
func (rt *router) SendWith(req *api.SendRequest, before func(*envelope.Envelope)) (*api.Response, error) {
	from, err := rt.caller(req.Token)
	if err != nil {
		return nil, err
	}
	if err := envelope.CheckBody([]byte(req.Body), rt.cfg.MaxBody); err != nil {
		return nil, err
	}
	sender := from.snapshot()
	kind := envelope.Send
	to := req.To
	trace := ""
	var parent *store.Record // the message this one is a hop after (hops.go)
	if req.ReplyTo != "" {
		orig, err := rt.st.Record(req.ReplyTo)
		if err != nil { // a broadcast copy is recorded per member
			orig, err = rt.st.Record(req.ReplyTo + "/" + sender.Gid)
		}
		if err != nil || orig.Recipient != sender.Gid {
			// a message the caller did not receive is as good as unknown
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage,
				"no message %s was delivered to %s on this host", req.ReplyTo, sender.Name)
		}
		if to != "" {
			return nil, fault.New(fault.Usage, fault.KindUsage, "a reply goes to the original sender: give --reply-to or a recipient, not both")
		}
		kind, to, trace = envelope.Reply, orig.Sender, orig.TraceID
		parent = orig
	} else if parent = deliveredTo(rt.st, req.Cause, sender.Gid); parent != nil {
		trace = parent.TraceID // a send made while parent was delivered: a hop of its flow (hops.go)
	}
	if to == "" {
		return nil, fault.New(fault.Usage, fault.KindUsage, "no recipient")
	}
	// --wait-for-broker: a name unknown while the broker is down, or a
	// publish it could not take, waits for its return (brokerwait.go)
	bound := time.Duration(req.WaitBrokerMS) * time.Millisecond
	var t target
	if err := rt.brokerWait(bound).Do(bound, func(bool) (err error) { t, err = rt.Resolve(to); return err }); err != nil {
		return nil, err
	}
	rcpt := envelope.Party{Gid: t.gid, Name: t.name, Host: t.host}
	if t.box != nil {
		e := t.box.snapshot()
		rcpt = envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host}
	}
	env := envelope.New(kind, envelope.Party{Gid: sender.Gid, Name: sender.Name, Host: sender.Host}, rcpt, req.Body)
	if trace != "" {
		env.TraceID = trace
	}
	env.InReplyTo = req.ReplyTo
	if parent != nil {
		env.Hops = parent.Hops + 1
	}
	env.Urgent = req.Urgent // ahead of normal mail (urgent.go)
	retry := false
	if req.MsgID != "" {
		// the client minted the id (fleet-send does, so that a send whose
		// outcome it could not learn can be retried as the same message)
		prev, err := sameMessage(rt.st, req.MsgID, env)
		if err != nil {
			return nil, err
		}
		env.MsgID = req.MsgID
		if prev != nil {
			env.TraceID, env.Hops = prev.TraceID, prev.Hops
			if prev.State == store.Delivered || prev.State == store.Dead {
				// settled: told as it is, never sent again
				return &api.Response{Sent: &api.Sent{
					MsgID: env.MsgID, TraceID: env.TraceID, State: prev.State,
					Recipient: env.Recipient.String(), Gid: rcpt.Gid,
					Warning: "message " + env.MsgID + " was sent before: not sent again",
				}}, nil
			}
			// accepted or unknown: sent again under the same id; the
			// store (here) or the receiving gateway (across hosts) keeps
			// one copy per msg id
			retry = true
		}
	}
	// what refuses it spends no pair-rate token: past max-hops (hops.go),
	// the local recipient's policy (policy.go; on another host, its host
	// decides as it arrives), a host with no sealing key (sealing.go);
	// then the tokens (rate: pair-rate and urgent-rate), and only then a
	// full inbox (a death)
	if err := rt.loops.Send(env, parent); err != nil {
		return nil, err
	}
	if t.box != nil {
		if err := rt.policy.Check(t.box.snapshot(), env, "send"); err != nil {
			return nil, err
		}
	} else if _, err := rt.seal.Check(env); err != nil {
		return nil, err
	}
	if err := rt.rate(env, retry); err != nil {
		return nil, err
	}
	if kind == envelope.Reply {
		rt.audit.Message("replied", env, 0, "to "+req.ReplyTo)
	}
	if t.box != nil {
		// a full local inbox refuses it, as a full broker inbox does
		// (inboxcap.go): dead here, a bounce, 75 for the call
		if err := rt.caps.Refuse(env); err != nil {
			return nil, err
		}
	}
	if before != nil {
		before(env)
	}
	state := store.Accepted
	warning := t.warning
	var clear []string // the host that gets it in the clear (sealing.go)
	if t.box != nil {
		rec, err := rt.in.Accept(env)
		if err != nil {
			return nil, err
		}
		state = rec.State
	} else if err := rt.brokerWait(bound).Do(bound, func(again bool) (err error) {
		clear, err = rt.publish(env, retry || again)
		return err
	}); err != nil {
		return nil, err
	} else {
		// the broker holds it for the host's return; the sender hears
		// at once that a reply or a delivery may be long in coming
		hs, heard := rt.peers.HostState(rcpt.Host, time.Now(), rt.br().Connected(), rt.cfg.PresenceTTL)
		if away := hostAway(rcpt.Host, hs, heard, time.Now()); away != "" {
			if warning != "" {
				warning += "; "
			}
			warning += away + ": the broker holds the message until it is back"
		}
	}
	return &api.Response{Sent: &api.Sent{
		MsgID: env.MsgID, TraceID: env.TraceID, State: state,
		Recipient: env.Recipient.String(), Gid: rcpt.Gid, Warning: warning, ClearHosts: clear,
	}}, nil
}

// brokerWait is the wait of one send for the broker's return, up to
// bound: nil (no wait) for none, and nothing to wait for in single-host
// mode.
func (rt *router) brokerWait(bound time.Duration) *brokerWait {
	if bound <= 0 {
		return nil
	}
	w := &brokerWait{ctx: rt.ctx(), stop: rt.closing(), poll: 250 * time.Millisecond, broker: alwaysUp{}}
	if b := rt.br(); b != nil {
		w.broker = b
	}
	return w
}

// alwaysUp is the broker of a gateway that has none: a local send never
// waits for it.
type alwaysUp struct{}

func (alwaysUp) Connected() bool { return true }

// sameMessage checks a client-minted msg id: nil if no message has it yet,
// its record if env is a retry of that message (same sender, recipient and
// kind), and a usage error if the id is not a message id or is another
// message's.
func sameMessage(st *store.Store, id string, env *envelope.Envelope) (*store.Record, error) {
	if !envelope.ValidID(id) {
		return nil, fault.New(fault.Usage, fault.KindUsage, "%q is not a message id", id).
			WithHint("a message id is a UUID such as fleet-send prints; leave --id out and fleet-send mints one")
	}
	prev, err := st.Record(id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fault.Wrap(fault.Software, fault.KindInternal, err, "reading the record of %s", id)
	}
	if prev.Sender != env.Sender.Gid || prev.Recipient != env.Recipient.Gid || prev.Kind != env.Kind {
		return nil, fault.New(fault.Usage, fault.KindUsage, "message id %s is another message's", id).
			WithHint("a retry gives the id of the same send (same sender, recipient and kind); leave --id out for a new message")
	}
	return prev, nil
}

// reasonRemoteFull is why a message refused by a full broker inbox died.
const reasonRemoteFull = "inbox full: the broker refused it"

// publish hands a message for another host to the broker and records it,
// and says which host gets it in the clear (sealing.go). An inbox that is
// full there dead-letters it here, with that reason.
func (rt *router) publish(env *envelope.Envelope, retry bool) ([]string, error) {
	// a host with no sealing key that nothing allows text in the clear:
	// refused (77) before anything is recorded or published
	clear, err := rt.seal.Check(env)
	if err != nil {
		return nil, err
	}
	return clear, rt.publishSealed(env, retry, clearReason(clear))
}

func (rt *router) publishSealed(env *envelope.Envelope, retry bool, clear string) error {
	log := rt.log.With("msg_id", env.MsgID, "trace_id", env.TraceID)
	now := time.Now().UTC()
	if env.Kind == envelope.Send || env.Kind == envelope.Reply {
		// a host that says it does not admit this one would refuse it
		cert, _ := rt.admit().certified().Present()
		host := ident.GidHost(env.Recipient.Gid) // a gid names the host it lives on
		if host == "" {
			host = env.Recipient.Host
		}
		if err := rt.admits.check(host, cert != "", now); err != nil {
			return err
		}
	}
	// The record is queued first — the recipient's receipt may arrive
	// before the broker's confirm does, and its SettleOutbound, queued
	// after, finds it — and goes to disk while the broker confirms: the
	// sender hears once both are done.
	recorded := rt.st.RecordOutboundKeep(env, now, rt.seal.Kept(env)) // sealing.go, refusals.go
	rt.audit.Message("published", env, 0, clear)
	err := rt.br().Publish(rt.ctx(), env.Recipient.Gid, env, true)
	if rerr := recorded(); rerr != nil && err == nil {
		// sent and confirmed: said as it is (a retry would send it twice)
		log.Error("message sent, but its record could not be written: its status will be unknown here", "err", rerr,
			"fix", "free space in the state folder "+rt.cfg.StateDir)
		rt.audit.Message("confirmed", env, 0, "")
		return nil
	}
	switch kind := fault.KindOf(err); {
	case err == nil:
		rt.audit.Message("confirmed", env, 0, clear)
		if retry {
			// a retry confirmed: whatever the first attempt did, the
			// broker has it now (the receiver keeps one per msg id)
			if _, merr := rt.st.MarkOutbound(env.MsgID, store.Accepted); merr != nil {
				log.Error("marking a retried message accepted", "err", merr)
			}
		}
		return nil
	case kind == fault.KindInboxFull:
		err = namedFault(err, env.Recipient)
		rt.audit.Message("dead", env, 0, "inbox full")
		rt.metrics.Dead(env.Kind, "inbox full")
		log.Warn("remote inbox full: dead-lettered here", "recipient", env.Recipient.Gid)
		if derr := rt.st.DeadOutbound(env, reasonRemoteFull, now); derr != nil {
			log.Error("dead-lettering", "err", derr)
		} else {
			// the call fails with 75 too; the bounce is for whoever reads
			// the sender's inbox later (a script's exit status is gone)
			rt.rcpt.Notify()
			rt.rcpt.Bounce(env.MsgID, env.TraceID, env.Sender.Gid, env.Recipient.String(), reasonRemoteFull)
		}
	case kind == fault.KindBrokerTimeout || kind == fault.KindOutcomeUnknown:
		// outcome unknown: the record stays, and says so, until a receipt
		// settles it or a retry under the same msg id is confirmed
		rt.audit.Message("unconfirmed", env, 0, err.Error())
		if _, merr := rt.st.MarkOutbound(env.MsgID, store.Unknown); merr != nil {
			log.Error("marking a message's outcome unknown", "err", merr)
		}
	case kind == fault.KindUnknownRecipient:
		// the broker has no inbox for it: the name's last gid is no more
		rt.audit.Message("not_sent", env, 0, err.Error())
		rt.peers.Forget(env.Recipient.Gid)
		rt.heard()
		if derr := rt.st.ForgetRecord(env.MsgID); derr != nil {
			log.Error("forgetting an unsent message", "err", derr)
		}
		msg := "no recipient %s: the broker has no inbox for it"
		if env.Recipient.Name != "" {
			msg += " (it left the fleet)" // a name last heard on its host
		}
		return fault.New(fault.NoRecipient, fault.KindUnknownRecipient, msg, env.Recipient.String()).
			WithHint("list entities with: fleet-roster")
	default:
		rt.audit.Message("not_sent", env, 0, err.Error())
		// not sent (no route, broker down or blocked): no record
		if derr := rt.st.ForgetRecord(env.MsgID); derr != nil {
			log.Error("forgetting an unsent message", "err", derr)
		}
	}
	return err
}

// namedFault is err (the broker's, which knows only the routing key, a
// gid) with the gid named as the recipient is known here: NAME@HOST.
func namedFault(err error, p envelope.Party) error {
	var fe *fault.Error
	if p.Gid == "" || p.Name == "" || !errors.As(err, &fe) {
		return err
	}
	named := *fe
	named.Msg = strings.ReplaceAll(fe.Msg, p.Gid, p.String())
	return &named
}

// Record is r as its sender is told it: the recipient named as this host
// knows it (here, as last heard, or as it was sent to).
func (rt *router) Record(r *store.Record) api.Record {
	rcpt := r.Recipient
	if b := rt.reg.Get(r.Recipient); b != nil {
		e := b.snapshot()
		rcpt = e.Name + "@" + e.Host
	} else if n := rt.peers.Name(r.Recipient); n != "" {
		rcpt = n + "@" + ident.GidHost(r.Recipient) // a remote one, as last heard
	} else if r.Named != "" {
		rcpt = r.Named // as it was sent to, before it left and was forgotten
	}
	return api.Record{
		MsgID: r.MsgID, Kind: string(r.Kind), TraceID: r.TraceID, State: r.State,
		Recipient: rcpt, Gid: r.Recipient, Attempts: r.Attempts, Reason: r.Reason, Accepted: r.Accepted, Done: r.Done,
	}
}

// Lookup tells a message's sender (or recipient) its delivery state. To
// anyone else the message does not exist.
func (rt *router) Lookup(req *api.LookupRequest) (*api.Response, error) {
	b, err := rt.caller(req.Token)
	if err != nil {
		return nil, err
	}
	gid := b.snapshot().Gid
	r, err := rt.st.Record(req.MsgID)
	if err != nil || (r.Sender != gid && r.Recipient != gid) {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent or received by you", req.MsgID).
			WithHint("delivery records are kept for the dedup window (%s)", rt.cfg.DedupWindow)
	}
	rec := rt.Record(r)
	return &api.Response{Record: &rec}, nil
}

// WaitState blocks until msgID's record reaches state (or dies, which is
// final), or the timeout passes: then TempFail naming the state reached.
func (rt *router) WaitState(req *api.WaitRequest) (*api.Response, error) {
	b, err := rt.caller(req.Token)
	if err != nil {
		return nil, err
	}
	gid := b.snapshot().Gid
	deadline := time.Now().Add(time.Duration(req.TimeoutMS) * time.Millisecond)
	for {
		changed := rt.rcpt.Changed()
		r, err := rt.st.Record(req.MsgID)
		if err != nil || (r.Sender != gid && r.Recipient != gid) {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent or received by you", req.MsgID)
		}
		rec := rt.Record(r)
		if r.State == req.Until || r.State == store.Dead {
			if r.State != req.Until {
				return &api.Response{Record: &rec}, fault.New(fault.TempFail, fault.KindTimeout,
					"message %s is dead, not %s: %s", r.MsgID, req.Until, r.Reason)
			}
			return &api.Response{Record: &rec}, nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return &api.Response{Record: &rec}, fault.New(fault.TempFail, fault.KindTimeout,
				"message %s is still %s, not %s, after %v", r.MsgID, r.State, req.Until, time.Duration(req.TimeoutMS)*time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-rt.closing():
			t.Stop()
			return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
		}
		t.Stop()
	}
}
