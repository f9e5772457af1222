package gateway

import (
	"errors"
	"io"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
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

// claimWaiter returns the open send waiting for replies to msgID addressed
// to gid, and marks the reply key as claimed so no other delivery path
// takes it meanwhile.
func (g *Gateway) claimWaiter(env *envelope.Envelope) *replyWaiter {
	if env.Kind != envelope.Reply || env.InReplyTo == "" {
		return nil
	}
	g.waitMu.Lock()
	defer g.waitMu.Unlock()
	w := g.waiters[env.InReplyTo]
	if w == nil || w.gid != env.Recipient.Gid {
		return nil
	}
	delete(g.waiters, env.InReplyTo)
	g.claimed[store.Key(env)] = true
	return w
}

func (g *Gateway) unclaim(key string) {
	g.waitMu.Lock()
	delete(g.claimed, key)
	g.waitMu.Unlock()
}

// isClaimed reports whether a message is being handed to an open send.
func (g *Gateway) isClaimed(key string) bool {
	g.waitMu.Lock()
	defer g.waitMu.Unlock()
	return g.claimed[key]
}

// sendWait serves a send with --wait: the Sent frame first, then the reply
// (or a timeout error) as a second frame.
func (g *Gateway) sendWait(c *conn, req *api.Request) {
	b, err := g.caller(req)
	if err != nil {
		c.fail(err)
		return
	}
	w := &replyWaiter{gid: b.snapshot().Gid, ch: make(chan *envelope.Envelope, 1)}
	var msgID string
	resp, err := g.sendWith(req, func(env *envelope.Envelope) {
		msgID = env.MsgID
		g.waitMu.Lock()
		g.waiters[msgID] = w
		g.waitMu.Unlock()
	})
	if err != nil {
		if msgID != "" {
			g.waitMu.Lock()
			delete(g.waiters, msgID)
			g.waitMu.Unlock()
		}
		c.fail(err)
		return
	}
	resp.OK = true
	if c.reply(resp) != nil {
		g.dropWaiter(msgID)
		return
	}
	gone := make(chan error, 1)
	go func() {
		_, err := c.read() // the client says nothing more: any read ends the wait
		gone <- err
	}()
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case env := <-w.ch:
		if env == nil { // the reply could not be stored
			c.fail(fault.New(fault.CantCreate, fault.KindStateDir, "the reply to %s arrived but could not be stored", msgID))
			return
		}
		key := store.Key(env)
		defer func() {
			g.unclaim(key)
			if bx := g.box(env.Recipient.Gid); bx != nil {
				bx.notify()
			}
		}()
		if err := c.reply(&api.Response{OK: true, Batch: []api.Delivery{{Envelope: env}}}); err != nil {
			return // the send went away: the reply stays in the inbox
		}
		if err := g.st.Delivered(key, time.Now().UTC()); err != nil {
			g.log.Error("recording a reply handed to its send", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
			return
		}
		g.audit.Message("delivered", env, 1, "rendezvous")
		g.settled(env, store.Delivered, "", 1)
	case <-t.C:
		g.abandon(msgID, w)
		c.fail(fault.New(fault.TempFail, fault.KindTimeout, "no reply to %s within %v", msgID, timeout).
			WithHint("a late reply waits in your inbox: fleet-recv"))
	case err := <-gone:
		g.abandon(msgID, w)
		if err != nil && !errors.Is(err, io.EOF) {
			g.log.Warn("waiting send ended", "msg_id", msgID, "err", err)
		}
	case <-g.runCtx.Done():
		g.abandon(msgID, w)
		c.fail(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))
	}
}

func (g *Gateway) dropWaiter(msgID string) bool {
	g.waitMu.Lock()
	defer g.waitMu.Unlock()
	_, ok := g.waiters[msgID]
	delete(g.waiters, msgID)
	return ok
}

// abandon ends a wait. If a reply already claimed the waiter, it is
// released to the inbox like any late reply, never left claimed.
func (g *Gateway) abandon(msgID string, w *replyWaiter) {
	if g.dropWaiter(msgID) {
		return
	}
	if env := <-w.ch; env != nil {
		g.unclaim(store.Key(env))
		if bx := g.box(env.Recipient.Gid); bx != nil {
			bx.notify()
		}
	}
}
