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

const defaultWindow = 256

// recv serves fleet-recv: the caller's inbox, oldest first, in batches. A
// batch stays in the inbox until the client acknowledges it — after writing
// it out — and the acknowledgement is on disk before the next batch is sent.
// A client that dies in between gets the same messages again next time. One
// fleet-recv drains an inbox at a time.
func (g *Gateway) recv(c *conn, req *api.Request) {
	b, err := g.caller(req)
	if err != nil {
		c.fail(err)
		return
	}
	ent := b.snapshot()
	if ent.Mode != "pull" {
		c.fail(fault.New(fault.Usage, fault.KindUsage, "%s is an inject entity: its messages go to %s, not to fleet-recv", ent.Name, g.row(ent, nil).Target))
		return
	}
	b.mu.Lock()
	if b.draining {
		b.mu.Unlock()
		c.fail(fault.New(fault.TempFail, fault.KindInboxBusy, "another fleet-recv is draining %s", ent.Name).
			WithHint("stop it, or wait for it to finish"))
		return
	}
	b.draining = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.draining = false
		b.mu.Unlock()
		b.notify()
	}()
	b.notify() // the nudge loop stands down while someone drains

	// Frames from the client arrive on a channel, so that a follow stream
	// can wait for mail and notice a client that went away at once.
	frames := make(chan *api.Request)
	readErr := make(chan error, 1)
	gone := make(chan struct{})
	defer close(gone)
	go func() {
		for {
			r, err := c.read()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case frames <- r:
			case <-gone:
				return
			}
		}
	}()

	window := req.Window
	if window <= 0 || window > defaultWindow {
		window = defaultWindow
	}
	left := req.Max // 0: no limit
	log := g.log.With("entity", ent.Name)
	// The commit of one acknowledgement runs while the next batch goes
	// out (sharing its fsync with other writers): one at most in flight,
	// its messages kept out of later batches, and always finished before
	// End — so a fleet-recv that ends has every acknowledgement on disk.
	var pend *ackCommit
	finish := func() bool {
		if pend == nil {
			return true
		}
		err := <-pend.done
		pend = nil
		if err != nil {
			c.fail(fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not record the acknowledgement"))
			return false
		}
		return true
	}
	for {
		changed := b.watch()
		n := window
		if left > 0 && left < n {
			n = left
		}
		now := time.Now()
		// Live asks go first, alone: a turn waits for each, and the store
		// need not be read to hand them out. Stored mail follows in the
		// next batch.
		asks := b.liveHead(now)
		var items []store.Item
		if len(asks) == 0 {
			after := uint64(0)
			if pend != nil { // what the pending acknowledgement covers is not read again
				after = pend.upTo
			}
			var err error
			if items, err = g.st.Head(ent.Gid, after, n); err != nil {
				c.fail(err)
				return
			}
		}
		batch := make([]api.Delivery, 0, len(asks)+len(items))
		seqs := make(map[string]uint64, len(items))
		for _, a := range asks {
			batch = append(batch, api.Delivery{Envelope: a})
		}
		expired := 0 // killed on the way: expired, or from a host no longer trusted
		for _, it := range items {
			if g.rdv.Claimed(store.Key(it.Env)) {
				continue // being handed to an open send
			}
			if pend != nil && pend.keys[store.Key(it.Env)] {
				continue // acknowledged; its commit is under way
			}
			if it.Env.Expired(now) {
				g.kill(it.Env, "expired before delivery", 0)
				expired++
				continue
			}
			if !g.admit.trusted(it.Env.Sender.Host) { // its host was removed from the trust file since
				g.kill(it.Env, "sender host "+it.Env.Sender.Host+" is no longer trusted", 0)
				expired++
				continue
			}
			batch = append(batch, api.Delivery{Envelope: it.Env})
			seqs[it.Env.MsgID] = it.Seq
		}
		if len(batch) == 0 {
			if expired > 0 {
				continue // only expired ones: look again
			}
			if pend != nil { // settle the last acknowledgement, then look again
				if !finish() {
					return
				}
				continue
			}
			if !req.Follow {
				c.reply(&api.Response{OK: true, End: true})
				return
			}
			select {
			case <-changed:
				continue
			case <-g.runCtx.Done():
				c.reply(&api.Response{Error: api.FromFault(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))})
				return
			case err := <-readErr:
				g.logRecvEnd(log, err)
				return
			case <-frames:
				c.fail(fault.New(fault.Data, fault.KindProtocol, "unexpected request while waiting for mail"))
				return
			}
		}
		if err := c.reply(&api.Response{OK: true, Batch: batch}); err != nil {
			return
		}
		var ack *api.Request
		select {
		case ack = <-frames:
		case err := <-readErr:
			g.logRecvEnd(log, err)
			return // unacknowledged: the batch stays in the inbox
		}
		if ack.Op != api.OpAck {
			c.fail(fault.New(fault.Data, fault.KindProtocol, "want ack, got %q", ack.Op))
			return
		}
		if !finish() { // at most one acknowledgement in flight
			return
		}
		if len(ack.Acks) > 0 {
			pend = g.commitAck(b, batch, seqs, ack.Acks)
		}
		if left > 0 {
			left -= len(ack.Acks)
			if left <= 0 {
				if finish() {
					c.reply(&api.Response{OK: true, End: true})
				}
				return
			}
		}
		if g.runCtx.Err() != nil {
			if finish() {
				c.reply(&api.Response{OK: true, End: true})
			}
			return
		}
	}
}

// ackCommit is an acknowledgement being recorded.
type ackCommit struct {
	keys map[string]bool
	upTo uint64 // the highest inbox sequence it covers, when every message up to it was acknowledged
	done chan error
}

// commitAck records the acknowledged messages of a batch as delivered,
// in the background; live asks leave memory at once.
func (g *Gateway) commitAck(b *mailbox, batch []api.Delivery, seqs map[string]uint64, acks []string) *ackCommit {
	acked := make(map[string]bool, len(acks))
	for _, id := range acks {
		acked[id] = true
	}
	a := &ackCommit{keys: map[string]bool{}, done: make(chan error, 1)}
	var keys []string
	var done []*envelope.Envelope
	for _, d := range batch {
		if !acked[d.Envelope.MsgID] {
			continue
		}
		if d.Envelope.Kind == envelope.Ask {
			b.liveDone(d.Envelope.MsgID) // shown: gone from memory
			g.audit.Message("delivered", d.Envelope, 1, "drained ask")
			continue
		}
		k := store.Key(d.Envelope)
		keys = append(keys, k)
		a.keys[k] = true
		done = append(done, d.Envelope)
	}
	// Reading on after the batch is right only when the whole batch was
	// acknowledged; otherwise the next read starts from the head again.
	if len(done) == len(seqs) {
		for _, env := range done {
			a.upTo = max(a.upTo, seqs[env.MsgID])
		}
	}
	if len(keys) == 0 { // only live asks: nothing to write
		a.done <- nil
		return a
	}
	go func() {
		err := g.st.DeliveredAll(keys, time.Now().UTC())
		if err == nil {
			g.audit.Messages("delivered", done, 1, "drained")
			for _, env := range done {
				g.settled(env, store.Delivered, "", 1)
			}
			g.crashAt("after-ack")
		}
		a.done <- err
	}()
	return a
}

func (g *Gateway) logRecvEnd(log interface{ Warn(string, ...any) }, err error) {
	if errors.Is(err, io.EOF) || g.runCtx.Err() != nil {
		return
	}
	log.Warn("fleet-recv connection ended", "err", err)
}
