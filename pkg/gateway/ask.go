package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// Asks (U2, §7.4) are live-only: an ASK carries a TTL and the asking
// turn's id and lives only in memory — in the asker's open fleet-ask and in
// the askee's mailbox — and, across hosts, as a non-persistent message with
// a per-message expiry. Nothing of an ask or its answer is written to a
// durable store. An answer whose turn is gone (expired, interrupted, the
// asking process killed, the gateway restarted) is never injected anywhere:
// the answerer is told TOO_LATE — at once when its fleet-send can know, or
// by a notice in its inbox.

type askWaiter struct {
	gid, turn string // the asker, and its turn
	to        string // the askee's gid: only it may answer
	ch        chan *envelope.Envelope
	refused   chan string        // the askee's host refused the ask: why (refusals.go)
	env       *envelope.Envelope // the ask, as the open asks list it (asklist.go)
}

// sentAnswer is an answer this host sent to an ask from another host,
// kept until a grace period after the ask expired, so that what comes
// back about it (the "answered" receipt, a TOO_LATE notice) is believed
// only from the asker's host and only for the answerer.
type sentAnswer struct {
	from string      // the answerer's gid
	host string      // the asker's host
	ch   chan string // the answerer's fleet-send while it waits; nil after
	keep time.Time
}

// askSeen is an ask this host delivered, kept (in memory) so an answer
// can find its asker, until a grace period after it expired.
type askSeen struct {
	env      *envelope.Envelope
	keep     time.Time
	answered bool // an answer was sent: no longer open (asklist.go)
}

const askGrace = 10 * time.Minute

// asks owns the asks of this host: the open fleet-asks waiting for an
// answer, the asks delivered here (so an answer finds its asker), and the
// answers sent from here to other hosts' asks.
type asks struct {
	mu      sync.Mutex
	waiting map[string]*askWaiter  // ask msg id -> the fleet-ask waiting for it
	seen    map[string]askSeen     // asks delivered here, for answering
	answers map[string]*sentAnswer // answer msg id -> where it went, and the fleet-send --answer waiting
	pruned  time.Time              // the last Prune that walked the maps
}

// pruneEvery spaces the walks of Prune: an ask is kept for askGrace after
// it expires anyway, so a second more costs nothing, while a walk on every
// ask cost a host answering thousands of asks a walk of thousands each.
const pruneEvery = time.Second

func newAsks() *asks {
	return &asks{waiting: map[string]*askWaiter{}, seen: map[string]askSeen{}, answers: map[string]*sentAnswer{}}
}

// Wait registers the fleet-ask waiting for ask id.
func (a *asks) Wait(id string, w *askWaiter) {
	a.mu.Lock()
	a.waiting[id] = w
	a.mu.Unlock()
}

// Done ends the wait for ask id: later answers are TOO_LATE.
func (a *asks) Done(id string) {
	a.mu.Lock()
	delete(a.waiting, id)
	a.mu.Unlock()
}

// Waiter returns the fleet-ask waiting for ask id, or nil.
func (a *asks) Waiter(id string) *askWaiter {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiting[id]
}

// Take hands over the waiter of the turn ans answers, removing it; nil if
// the turn is gone (or ans belongs to another turn: never crossed).
func (a *asks) Take(ans *envelope.Envelope) *askWaiter {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.waiting[ans.InReplyTo]
	if w == nil || w.turn != ans.TurnID || w.gid != ans.Recipient.Gid {
		return nil
	}
	delete(a.waiting, ans.InReplyTo)
	return w
}

// Asking reports whether gid has an ask of its own waiting for an answer.
func (a *asks) Asking(gid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range a.waiting {
		if w.gid == gid {
			return true
		}
	}
	return false
}

// See records an ask delivered here; false if it was seen before.
func (a *asks) See(env *envelope.Envelope) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, dup := a.seen[env.MsgID]; dup {
		return false
	}
	a.seen[env.MsgID] = askSeen{env: env, keep: env.Expires.Add(askGrace)}
	return true
}

// Seen returns an ask delivered here.
func (a *asks) Seen(id string) (askSeen, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.seen[id]
	return s, ok
}

// Answered records an answer sent to another host's ask.
func (a *asks) Answered(id string, s *sentAnswer) {
	a.mu.Lock()
	a.answers[id] = s
	a.mu.Unlock()
}

// StopWaiting detaches the answerer's fleet-send from answer id.
func (a *asks) StopWaiting(id string) {
	a.mu.Lock()
	if s := a.answers[id]; s != nil {
		s.ch = nil
	}
	a.mu.Unlock()
}

// SentFrom returns the answer msgID sent from here, checked against what
// claims to come back about it: from host, to recipient ("": any).
func (a *asks) SentFrom(msgID, host, recipient string) (*sentAnswer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.answers[msgID]
	switch {
	case s == nil:
		return nil, broker.Refuse(broker.ReasonMisrouted, "no answer %s was sent from this host (or it is long gone)", msgID)
	case s.host != host:
		return nil, broker.Refuse(broker.ReasonWrongHost, "news of answer %s from host %s; it went to %s", msgID, host, s.host)
	case recipient != "" && s.from != recipient:
		return nil, broker.Refuse(broker.ReasonMisrouted, "news of answer %s for %s, which did not send it", msgID, recipient)
	}
	cp := *s
	return &cp, nil
}

// Prune forgets asks and answers long past their expiry (at most once
// every pruneEvery).
func (a *asks) Prune(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.pruned) < pruneEvery && !now.Before(a.pruned) {
		return
	}
	a.pruned = now
	for id, s := range a.seen {
		if now.After(s.keep) {
			delete(a.seen, id)
		}
	}
	for id, s := range a.answers {
		if s.ch == nil && now.After(s.keep) {
			delete(a.answers, id)
		}
	}
}

// liveAdd puts an ask in an entity's in-memory live queue.
func (g *Gateway) liveAdd(b *mailbox, env *envelope.Envelope) {
	if env.Expired(time.Now()) {
		g.audit.Message("expired", env, 0, "expired before it reached its askee")
		g.log.Info("ask expired before it reached its askee: dropped", "msg_id", env.MsgID, "trace_id", env.TraceID)
		return
	}
	g.asks.Prune(time.Now())
	if !g.asks.See(env) {
		return // a redelivered or retransmitted copy: shown once at most
	}
	b.mu.Lock()
	for _, e := range b.live {
		if e.MsgID == env.MsgID {
			b.mu.Unlock()
			return // a redelivered copy
		}
	}
	b.live = append(b.live, env)
	b.mu.Unlock()
	g.metrics.Accepted(env.Kind)
	b.notify()
	// an ask its askee never took leaves memory when it expires, and the
	// audit log says so (fleet-trace shows it): never dropped unsaid
	if env.Expires.IsZero() {
		return // no expiry: it waits until taken
	}
	time.AfterFunc(time.Until(env.Expires), func() {
		if g.runCtx.Err() == nil && b.liveDone(env.MsgID) {
			g.audit.Message("expired", env, 0, "expired before its askee took it")
			g.log.Info("ask expired before its askee took it", "msg_id", env.MsgID, "trace_id", env.TraceID, "entity", env.Recipient.String())
		}
	})
}

// liveHead returns the live asks not yet expired, urgent ones first
// (each kind in the order they came). An expired one stays in the queue,
// unshown, until its expiry removes it (liveAdd).
func (b *mailbox) liveHead(now time.Time) []*envelope.Envelope {
	b.mu.Lock()
	defer b.mu.Unlock()
	var kept []*envelope.Envelope
	for _, urgent := range [2]bool{true, false} {
		for _, e := range b.live {
			if e.Urgent == urgent && !e.Expired(now) {
				kept = append(kept, e)
			}
		}
	}
	return kept
}

// liveReturn puts back, first in line, an ask taken to be shown that was
// not shown after all.
func (b *mailbox) liveReturn(env *envelope.Envelope) {
	b.mu.Lock()
	b.live = append([]*envelope.Envelope{env}, b.live...)
	b.mu.Unlock()
	b.notify()
}

// liveDone removes an ask that was shown to its askee.
func (b *mailbox) liveDone(msgID string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, e := range b.live {
		if e.MsgID == msgID {
			b.live = append(b.live[:i], b.live[i+1:]...)
			return true
		}
	}
	return false
}

// ask serves fleet-ask: the Sent frame, then the answer or a timeout.
func (g *Gateway) ask(c *conn, req *api.AskRequest) {
	from, err := g.caller(req.Token)
	if err != nil {
		c.fail(err)
		return
	}
	if err := envelope.CheckBody([]byte(req.Body), g.cfg.MaxBody); err != nil {
		c.fail(err)
		return
	}
	ttl := time.Duration(req.TimeoutMS) * time.Millisecond
	if ttl <= 0 {
		ttl = g.cfg.AskTTL
	}
	// --wait-for-broker: within the ask's own TTL (brokerwait.go)
	bound := min(time.Duration(req.WaitBrokerMS)*time.Millisecond, ttl)
	wait := g.route.brokerWait(bound)
	var t target
	if err := wait.Do(bound, func(bool) (err error) { t, err = g.route.Resolve(req.To); return err }); err != nil {
		c.fail(err)
		return
	}
	if t.box == nil && g.br != nil && !req.WaitHost {
		// An ask lives only its TTL: to a host that reads stale or gone
		// it would wait all of it for nothing. Said at once instead.
		state, heard := g.peers.HostState(t.host, time.Now(), g.br.Connected(), g.cfg.PresenceTTL)
		if away := hostAway(t.host, state, heard, time.Now()); away != "" {
			c.fail(fault.New(fault.Unavailable, fault.KindHostGone, "%s: no answer can come from %s", away, t.name).
				WithHint("fleet-ask --wait-for-host asks anyway (it waits its TTL); or check fleet-gw on %s (fleet-gw status lists the peers)", t.host))
			return
		}
	}
	sender := from.snapshot()
	rcpt := envelope.Party{Gid: t.gid, Name: t.name, Host: t.host}
	if t.box != nil {
		e := t.box.snapshot()
		rcpt = envelope.Party{Gid: e.Gid, Name: e.Name, Host: e.Host}
	}
	env := envelope.New(envelope.Ask, envelope.Party{Gid: sender.Gid, Name: sender.Name, Host: sender.Host}, rcpt, req.Body)
	env.TurnID = req.TurnID
	if env.TurnID == "" {
		env.TurnID = envelope.NewID()
	}
	var parent *store.Record // the message this ask is a hop after (hops.go)
	if req.ReplyTo != "" {   // fleet-ask --about: a hop of that message's flow
		r, err := g.st.Record(req.ReplyTo)
		if err != nil || (r.Sender != sender.Gid && r.Recipient != sender.Gid) {
			c.fail(fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent or received by you", req.ReplyTo))
			return
		}
		parent = r
	} else {
		parent = deliveredTo(g.st, req.Cause, sender.Gid) // asked while it was delivered
	}
	if parent != nil {
		env.TraceID, env.Hops = parent.TraceID, parent.Hops+1
	}
	env.Expires = time.Now().Add(ttl).UTC()
	env.Urgent = req.Urgent // ahead of the askee's other live asks (urgent.go)
	// what refuses it spends no pair-rate token: past max-hops (hops.go),
	// the recipient's policy (policy.go; across hosts its host decides),
	// a host with no sealing key (sealing.go: refused 77 before anything
	// is sent or waited for, unless seal-fallback = clear or
	// plaintext-hosts allows text in the clear; then named in
	// clear_hosts and the audit lines fleet-trace shows, as a send is)
	if err := g.route.loops.Send(env, parent); err != nil {
		c.fail(err)
		return
	}
	var clear []string
	if t.box != nil {
		if err := g.policy.Check(t.box.snapshot(), env, "send"); err != nil {
			c.fail(err)
			return
		}
	} else if clear, err = g.seal.Check(env); err != nil {
		c.fail(err)
		return
	}
	if err := g.route.rate(env, false); err != nil { // pairrate.go, urgent.go
		c.fail(err)
		return
	}
	w := &askWaiter{gid: sender.Gid, turn: env.TurnID, to: rcpt.Gid, ch: make(chan *envelope.Envelope, 1), refused: make(chan string, 1), env: env}
	g.asks.Wait(env.MsgID, w)
	g.said.Soon(sender.Gid) // reads "waiting" in the roster
	defer func() {
		g.asks.Done(env.MsgID) // the turn is gone: later answers are TOO_LATE
		g.said.Soon(sender.Gid)
	}()
	g.audit.Message("asked", env, 0, "")
	if t.box != nil {
		g.liveAdd(t.box, env)
	} else {
		g.audit.Message("published", env, 0, clearReason(clear))
		// the same ask again, if the broker was down: its receiver keeps
		// one (asks.seen), and the time waited comes out of its TTL
		if err := wait.Do(min(bound, time.Until(env.Expires)), func(bool) error {
			return g.br.Publish(g.hardCtx, rcpt.Gid, env, false)
		}); err != nil {
			g.audit.Message("not_sent", env, 0, err.Error())
			c.fail(err)
			return
		}
		g.audit.Message("confirmed", env, 0, clearReason(clear))
	}
	if c.reply(&api.Response{OK: true, Sent: &api.Sent{
		MsgID: env.MsgID, TraceID: env.TraceID, State: "asked", Recipient: rcpt.String(), Gid: rcpt.Gid, ClearHosts: clear,
	}}) != nil {
		return
	}
	gone := make(chan struct{})
	go func() {
		_, _ = c.read() // any read ends the wait: the asking process went away
		close(gone)
	}()
	timer := time.NewTimer(ttl)
	defer timer.Stop()
	select {
	case ans := <-w.ch:
		c.reply(&api.Response{OK: true, Batch: []api.Delivery{{Envelope: ans}}})
	case why := <-w.refused:
		c.fail(refusedAskFault(env, why))
	case <-timer.C:
		c.fail(fault.New(fault.TempFail, fault.KindTimeout, "no answer to ask %s within %v", env.MsgID, ttl).
			WithHint("fleet-trace %s shows where the ask stopped (drained or injected: the askee was shown it; expired: it never was)", env.TraceID))
	case <-gone:
	case <-g.runCtx.Done():
		c.fail(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))
	}
}

// handAnswer gives an answer to the turn that waits for it; false: the
// turn is gone.
func (g *Gateway) handAnswer(ans *envelope.Envelope) bool {
	w := g.asks.Take(ans)
	if w == nil {
		return false
	}
	w.ch <- ans
	g.audit.Message("answered", ans, 0, "")
	return true
}

// answer serves fleet-send --answer ASK_ID.
func (g *Gateway) answer(req *api.SendRequest) (*api.Response, error) {
	from, err := g.caller(req.Token)
	if err != nil {
		return nil, err
	}
	if err := envelope.CheckBody([]byte(req.Body), g.cfg.MaxBody); err != nil {
		return nil, err
	}
	me := from.snapshot()
	s, ok := g.asks.Seen(req.AnswerTo)
	if !ok || s.env.Recipient.Gid != me.Gid {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no ask %s was put to %s (or it is long gone)", req.AnswerTo, me.Name)
	}
	ask := s.env
	ans := envelope.New(envelope.Answer, envelope.Party{Gid: me.Gid, Name: me.Name, Host: me.Host}, ask.Sender, req.Body)
	ans.TraceID, ans.InReplyTo, ans.TurnID = ask.TraceID, ask.MsgID, ask.TurnID
	ans.Expires = ask.Expires
	ans.Hops = ask.Hops + 1 // a hop after its ask (hops.go)
	sent := &api.Sent{MsgID: ans.MsgID, TraceID: ans.TraceID, Recipient: ask.Sender.String(), Gid: ask.Sender.Gid}
	tooLate := func(why string) error {
		g.audit.Message("too_late", ans, 0, why)
		// 11, not 75: answering again is refused the same way
		return fault.New(fault.TooLate, fault.KindTooLate, "too late: %s; the answer was not delivered", why).
			WithHint("the asker no longer waits for it: send it as a plain message instead: fleet-send %s TEXT", ask.Sender.String())
	}
	if ask.Expired(time.Now()) {
		return nil, tooLate("the ask expired at " + ask.Expires.Format(time.RFC3339))
	}
	// past max-hops, cut here (the asker told by a NOTICE, hops.go), and
	// the pair-rate of answerer→asker, before anything is sent: an ask
	// is never recorded, so its asker stands for the parent's sender
	if err := g.route.loops.Send(ans, &store.Record{MsgID: ask.MsgID, Sender: ask.Sender.Gid, TraceID: ask.TraceID, Hops: ask.Hops}); err != nil {
		return nil, err
	}
	if ask.Sender.Host != g.cfg.Host {
		// the asker's host with no sealing key refuses it (77) before a
		// token is spent, unless text in the clear is allowed there
		// (sealing.go): then the answer names that host, as a send does
		if sent.ClearHosts, err = g.seal.Check(ans); err != nil {
			return nil, err
		}
	}
	if err := g.route.rate(ans, false); err != nil {
		return nil, err
	}
	g.asks.Close(ask.MsgID) // answered: no longer an open ask (asklist.go)
	if ask.Sender.Host == g.cfg.Host {
		if !g.handAnswer(ans) {
			return nil, tooLate("the asking turn is gone")
		}
		sent.State = "answered"
		return &api.Response{Sent: sent}, nil
	}
	// across hosts: wait a moment for the asker's gateway to say
	g.asks.Prune(time.Now())
	w := make(chan string, 1)
	g.asks.Answered(ans.MsgID, &sentAnswer{from: me.Gid, host: ask.Sender.Host, ch: w, keep: ask.Expires.Add(askGrace)})
	defer g.asks.StopWaiting(ans.MsgID)
	g.audit.Message("published", ans, 0, clearReason(sent.ClearHosts))
	if err := g.br.Publish(g.hardCtx, ask.Sender.Gid, ans, false); err != nil {
		g.audit.Message("not_sent", ans, 0, err.Error())
		return nil, err
	}
	g.audit.Message("confirmed", ans, 0, clearReason(sent.ClearHosts))
	select {
	case outcome := <-w:
		if outcome != "answered" {
			return nil, tooLate("the asking turn is gone")
		}
		sent.State = "answered"
	case <-time.After(g.cfg.PublishTimeout):
		sent.State = "sent" // no word yet: a TOO_LATE notice would reach the inbox
	}
	return &api.Response{Sent: sent}, nil
}

// onAnswer takes an ANSWER from another host: to its turn, or TOO_LATE
// back to the answerer. Only the askee may answer an ask.
func (g *Gateway) onAnswer(ans *envelope.Envelope) error {
	if w := g.asks.Waiter(ans.InReplyTo); w != nil && w.to != ans.Sender.Gid {
		return broker.Refuse(broker.ReasonWrongHost, "an answer to ask %s from %s, which was not asked", ans.InReplyTo, ans.Sender.String())
	}
	outcome := "answered"
	if !g.handAnswer(ans) {
		outcome = "too_late"
		g.audit.Message("too_late", ans, 0, "the asking turn is gone")
		g.log.Info("answer for a turn that is gone: TOO_LATE to the answerer", "msg_id", ans.MsgID, "trace_id", ans.TraceID)
	}
	n := envelope.New(envelope.TooLate, envelope.Party{Host: g.cfg.Host}, ans.Sender, outcome)
	n.TraceID, n.InReplyTo, n.TurnID = ans.TraceID, ans.MsgID, ans.TurnID
	if outcome == "answered" {
		n.Kind = envelope.Receipt
		n.Body = `{"msg_id":"` + ans.MsgID + `","state":"answered"}`
	} else {
		n.Body = "too late: the asking turn for ask " + ans.InReplyTo + " is gone; your answer " + ans.MsgID + " was not delivered"
	}
	g.side.Go(func() {
		ctx, cancel := context.WithTimeout(g.hardCtx, g.cfg.PublishTimeout)
		defer cancel()
		_ = g.br.Publish(ctx, ans.Sender.Gid, n, false)
	})
	return nil
}

// onTooLate takes a TOO_LATE from another host: to the answerer's waiting
// fleet-send if it still waits, else as a notice in its inbox.
func (g *Gateway) onTooLate(n *envelope.Envelope) error {
	a, err := g.asks.SentFrom(n.InReplyTo, n.Sender.Host, n.Recipient.Gid)
	if err != nil {
		return err
	}
	if a.ch != nil {
		select {
		case a.ch <- "too_late":
		default:
		}
		return nil
	}
	_, err = g.in.Accept(n)
	return err
}

// Landed signals an answerer's waiting send that its answer landed on
// host (an "answered" receipt from it).
func (as *asks) Landed(msgID, host string) error {
	a, err := as.SentFrom(msgID, host, "")
	if err != nil {
		return err
	}
	if a.ch != nil {
		select {
		case a.ch <- "answered":
		default:
		}
	}
	return nil
}
