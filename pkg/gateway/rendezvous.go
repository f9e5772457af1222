package gateway

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// Rendezvous (U1/U3, U6/U7): `fleet-send --wait` holds its send open. The
// recipient's REPLY — from any host — is handed straight to the open send
// and counts as delivered once written to it. A reply that arrives after
// the send has gone stays in the sender's inbox like any message: pulled by
// fleet-recv (and nudged meanwhile) or injected.

type replyWaiter struct {
	gid string // the sender, who receives the reply
	ch  chan *envelope.Envelope
}

// rendezvous owns the open sends waiting for their replies, and the reply
// keys being handed to one — and its claim rule: a reply claimed for an
// open send is taken by no other delivery path (Free, Claimed), and is
// released to the inbox if the send goes first (Abandon). Its store and
// hooks are wired once the store is open (wire); its lock guards only its
// maps, never the store or a client.
type rendezvous struct {
	mu      sync.Mutex
	waiters map[string]*replyWaiter // msg id of an open send -> its waiter
	claimed map[string]bool         // reply keys being handed to an open send

	st      *store.Store
	reg     *registry
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics                                                 // nil: off
	settled func(env *envelope.Envelope, state, reason string, attempts int) // receipt.go: a reply handed is delivered
}

func newRendezvous() *rendezvous {
	return &rendezvous{waiters: map[string]*replyWaiter{}, claimed: map[string]bool{}}
}

// wire gives the rendezvous the store and what it tells once a reply is
// handed (set in open, before any client is served).
func (r *rendezvous) wire(st *store.Store, reg *registry, log *slog.Logger, a *audit.Log, m *metrics.Metrics,
	settled func(env *envelope.Envelope, state, reason string, attempts int)) {
	r.st, r.reg, r.log, r.audit, r.metrics, r.settled = st, reg, log, a, m, settled
}

// replyConn is the client an open send holds (conn.go's conn).
type replyConn interface {
	reply(*api.Response) error
	fail(error) error
	read() (api.Request, error)
}

// Open registers w as waiting for the replies to msgID.
func (r *rendezvous) Open(msgID string, w *replyWaiter) {
	r.mu.Lock()
	r.waiters[msgID] = w
	r.mu.Unlock()
}

// Claim returns the open send waiting for env (a reply addressed to its
// sender), and marks the reply key as claimed so no other delivery path
// takes it meanwhile.
func (r *rendezvous) Claim(env *envelope.Envelope) *replyWaiter {
	if env.Kind != envelope.Reply || env.InReplyTo == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waiters[env.InReplyTo]
	if w == nil || w.gid != env.Recipient.Gid {
		return nil
	}
	delete(r.waiters, env.InReplyTo)
	r.claimed[store.Key(env)] = true
	return w
}

// Unclaim releases a claimed reply key.
func (r *rendezvous) Unclaim(key string) {
	r.mu.Lock()
	delete(r.claimed, key)
	r.mu.Unlock()
}

// Claimed reports whether a message is being handed to an open send: no
// other path may take it.
func (r *rendezvous) Claimed(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claimed[key]
}

// Free is items (an inbox read, in order) less the replies being handed
// to an open send, and how many those were: what the other delivery
// paths (inject, fleet-recv) may take.
func (r *rendezvous) Free(items []store.Item) (free []store.Item, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.claimed) == 0 {
		return items, 0
	}
	free = make([]store.Item, 0, len(items))
	for _, it := range items {
		if r.claimed[store.Key(it.Env)] {
			held++
			continue
		}
		free = append(free, it)
	}
	return free, held
}

// ClaimStored claims env, a reply to msgID already in the inbox, for w —
// if w still waits for it (an arriving reply may have claimed w first).
func (r *rendezvous) ClaimStored(msgID string, w *replyWaiter, env *envelope.Envelope) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiters[msgID] != w || r.claimed[store.Key(env)] {
		return false
	}
	delete(r.waiters, msgID)
	r.claimed[store.Key(env)] = true
	return true
}

// Close ends the wait for msgID's replies; it reports whether the send was
// still waiting (false: a reply claimed it first).
func (r *rendezvous) Close(msgID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.waiters[msgID]
	delete(r.waiters, msgID)
	return ok
}

// sendWait serves a send with --wait: the Sent frame first, then the reply
// (or a timeout error) as a second frame.
func (g *Gateway) sendWait(c *conn, req *api.SendRequest) {
	b, err := g.caller(req.Token)
	if err != nil {
		c.fail(err)
		return
	}
	w := &replyWaiter{gid: b.snapshot().Gid, ch: make(chan *envelope.Envelope, 1)}
	var msgID string
	resp, err := g.route.SendWith(req, func(env *envelope.Envelope) {
		msgID = env.MsgID
		g.rdv.Open(msgID, w)
	})
	if err != nil {
		if msgID != "" {
			g.rdv.Close(msgID)
		}
		c.fail(err)
		return
	}
	resp.OK = true
	if c.reply(resp) != nil {
		g.rdv.Close(msgID)
		return
	}
	g.rdv.Await(g.runCtx.Done(), c, b, msgID, w, time.Duration(req.TimeoutMS)*time.Millisecond)
}

// waitReply serves fleet-send --wait-reply MSGID: the wait of an earlier
// send of the caller's for its reply, resumed (after an ask ended it, or
// after a timeout). A reply that came while nobody waited is in the
// caller's inbox: it is handed here, once, as a new one would be.
func (g *Gateway) waitReply(c *conn, req *api.WaitReplyRequest) {
	b, err := g.caller(req.Token)
	if err != nil {
		c.fail(err)
		return
	}
	gid := b.snapshot().Gid
	if r, err := g.st.Record(req.MsgID); err != nil || r.Sender != gid {
		c.fail(fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent by you", req.MsgID).
			WithHint("delivery records are kept for the dedup window (%s)", g.cfg.DedupWindow))
		return
	}
	w := g.rdv.Resume(gid, req.MsgID)
	g.rdv.Await(g.runCtx.Done(), c, b, req.MsgID, w, time.Duration(req.TimeoutMS)*time.Millisecond)
}

// Resume opens a wait of gid's for the reply to msgID, an earlier send of
// its: a reply that came while nobody waited, still in its inbox, is
// claimed for it at once.
func (r *rendezvous) Resume(gid, msgID string) *replyWaiter {
	w := &replyWaiter{gid: gid, ch: make(chan *envelope.Envelope, 1)}
	r.Open(msgID, w)
	if env := r.stored(gid, msgID); env != nil && r.ClaimStored(msgID, w, env) {
		w.ch <- env
	}
	return w
}

// stored is the first undelivered REPLY to msgID in gid's inbox.
func (r *rendezvous) stored(gid, msgID string) *envelope.Envelope {
	env, _ := r.st.ReplyTo(gid, msgID) // one seek in the store's reply index, whatever the inbox holds
	return env
}

// Await holds an open wait of b's for the reply to msgID: the reply
// (handed and recorded as delivered), or — for a pull entity, which would
// otherwise not see it until the wait ends (U1 + U2: a main waiting on a
// worker that asks it something) — a live ASK to b, handed instead with
// WaitingFor, which ends this wait (the reply, when it comes, waits for
// --wait-reply or fleet-recv); or a timeout.
// It ends, too, when stop is closed (the gateway shuts down).
func (r *rendezvous) Await(stop <-chan struct{}, c replyConn, b *mailbox, msgID string, w *replyWaiter, timeout time.Duration) {
	gone := make(chan error, 1)
	go func() {
		_, err := c.read() // the client says nothing more: any read ends the wait
		gone <- err
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	pull := b.snapshot().Mode != "inject" // pull and hook: held for a taker
	for {
		var changed <-chan struct{}
		if pull {
			changed = b.watch()
			if asks := b.liveHead(time.Now()); len(asks) > 0 && b.liveDone(asks[0].MsgID) {
				r.Abandon(msgID, w)
				a := asks[0]
				if c.reply(&api.Response{OK: true, Batch: []api.Delivery{{Envelope: a}}, WaitingFor: msgID}) != nil {
					b.liveReturn(a) // the wait went away first: the ask is still to be shown
					return
				}
				r.audit.Message("drained", a, 1, "ask surfaced on a wait for "+msgID)
				r.metrics.Delivered(a.Kind)
				return
			}
		}
		select {
		case env := <-w.ch:
			r.Hand(c, msgID, env)
			return
		case <-changed:
			continue
		case <-t.C:
			r.Abandon(msgID, w)
			c.fail(fault.New(fault.TempFail, fault.KindTimeout, "no reply to %s within %v", msgID, timeout).
				WithHint("wait again with: fleet-send --wait-reply %s (a late reply also waits in your inbox: fleet-recv)", msgID))
			return
		case err := <-gone:
			r.Abandon(msgID, w)
			if err != nil && !errors.Is(err, io.EOF) {
				r.log.Warn("waiting send ended", "msg_id", msgID, "err", err)
			}
			return
		case <-stop:
			r.Abandon(msgID, w)
			c.fail(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))
			return
		}
	}
}

// Hand writes a claimed reply to the waiting send and records it
// delivered.
func (r *rendezvous) Hand(c replyConn, msgID string, env *envelope.Envelope) {
	if env == nil { // the reply could not be stored
		c.fail(fault.New(fault.CantCreate, fault.KindStateDir, "the reply to %s arrived but could not be stored", msgID))
		return
	}
	key := store.Key(env)
	defer func() {
		r.Unclaim(key)
		if bx := r.reg.Get(env.Recipient.Gid); bx != nil {
			bx.notify()
		}
	}()
	if err := c.reply(&api.Response{OK: true, Batch: []api.Delivery{{Envelope: env}}}); err != nil {
		return // the send went away: the reply stays in the inbox
	}
	if err := r.st.Delivered(key, time.Now().UTC()); err != nil {
		r.log.Error("recording a reply handed to its send", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		return
	}
	r.audit.Message("drained", env, 1, "by the waiting send")
	r.settled(env, store.Delivered, "", 1)
}

// Abandon ends a wait. If a reply already claimed the waiter, it is
// released to the inbox like any late reply, never left claimed.
func (r *rendezvous) Abandon(msgID string, w *replyWaiter) {
	if r.Close(msgID) {
		return
	}
	if env := <-w.ch; env != nil {
		r.Unclaim(store.Key(env))
		if bx := r.reg.Get(env.Recipient.Gid); bx != nil {
			bx.notify()
		}
	}
}
