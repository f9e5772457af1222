package gateway

import (
	"errors"
	"io"
	"log/slog"
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
func (g *Gateway) recv(c *conn, req *api.RecvRequest) {
	s, err := g.openRecv(c, req)
	if err != nil {
		c.fail(err)
		return
	}
	defer s.close()
	s.run()
}

// recvStream is one fleet-recv on one inbox. Its steps, in order: next
// (the next batch), then either idle (nothing to send: settle, end, or wait
// for mail) or hand (send the batch, take its acknowledgement, commit it),
// until enough (--max reached, or the gateway stops).
type recvStream struct {
	g      *Gateway
	c      *conn
	b      *mailbox
	ent    store.Entity
	follow bool
	// follower: --follow with no --max on a pull entity, a worker's
	// loop; the followers part knows when one opens and ends (follow.go)
	follower bool
	ended    bool // End is being sent: the drain reached the inbox's end or --max
	window   int  // messages per batch
	left     int  // messages still wanted (--max); 0: no limit
	log      *slog.Logger

	// frames from the client arrive on a channel, so that a follow stream
	// can wait for mail and notice a client that went away at once
	frames  chan api.Request
	readErr chan error
	gone    chan struct{}

	// The commit of one acknowledgement runs while the next batch goes
	// out (sharing its fsync with other writers): one at most in flight,
	// its messages kept out of later batches, and always finished before
	// End — so a fleet-recv that ends has every acknowledgement on disk.
	pend   *ackCommit
	closed bool // the drain lease was given back

	// quiet, when set, is the mailbox watch taken just before a read of
	// stored mail that reached the inbox's end with nothing left out,
	// all of which was then acknowledged: until it fires (mail is
	// accepted only with a notify), another read would find nothing new,
	// and is not made. A sender and a receiver one message at a time
	// make two reads less per message.
	quiet <-chan struct{}
}

// openRecv checks the caller and takes its inbox's drain lease.
func (g *Gateway) openRecv(c *conn, req *api.RecvRequest) (*recvStream, error) {
	b, err := g.caller(req.Token)
	if err != nil {
		return nil, err
	}
	ent := b.snapshot()
	if req.Hook && ent.Mode != "hook" {
		// a recipe's hook in an agent of a pull or inject entity: its
		// mail is fleet-recv's or its pane's, not the hook's
		return nil, fault.New(fault.Refused, fault.KindNotAgent, "%s is in %s mode: its agent's hooks hand it nothing", ent.Name, ent.Mode).
			WithHint("for hook delivery: fleet-roster join NAME --mode hook")
	}
	if ent.Mode != "pull" && ent.Mode != "hook" {
		return nil, fault.New(fault.Usage, fault.KindUsage, "%s is an inject entity: its messages go to %s, not to fleet-recv", ent.Name, g.row(ent, nil, nil).Target)
	}
	if !b.takeDrain(g.runCtx, handOver) {
		return nil, fault.New(fault.TempFail, fault.KindInboxBusy, "another fleet-recv is draining %s", ent.Name).
			WithHint("stop it, or wait for it to finish")
	}
	follower := req.Follow && req.Max <= 0 && ent.Mode == "pull"
	if follower {
		g.follow.Opened(b)
	}
	b.notify() // the nudge loop stands down while someone drains
	window := req.Window
	if window <= 0 || window > defaultWindow {
		window = defaultWindow
	}
	s := &recvStream{g: g, c: c, b: b, ent: ent, follow: req.Follow, follower: follower, window: window, left: max(req.Max, 0),
		log: g.log.With("entity", ent.Name), frames: make(chan api.Request), readErr: make(chan error, 1), gone: make(chan struct{})}
	go s.readFrames()
	return s, nil
}

// close gives the drain lease back (once): before End is sent, so a
// fleet-recv started the moment this one ends finds the inbox free.
func (s *recvStream) close() {
	if s.closed {
		return
	}
	s.closed = true
	close(s.gone)
	// a drain before the lease is given back: a follower that opens next
	// is seen after it
	if !s.follower && s.ended && !s.follow {
		s.g.follow.Drained(s.b)
	}
	s.b.mu.Lock()
	s.b.draining = false
	s.b.drains++
	s.b.mu.Unlock()
	// a follower's end after: a client that sees its entity detached and
	// opens the next follower at once never finds the inbox still held
	// (Closed leaves the status to that next one if it opened first)
	if s.follower {
		s.g.follow.Closed(s.b, s.g.runCtx.Err() != nil)
	}
	s.b.notify()
}

// end releases the inbox, then tells the client there is no more.
func (s *recvStream) end() {
	s.ended = true
	s.close()
	s.c.reply(&api.Response{OK: true, End: true})
}

func (s *recvStream) readFrames() {
	for {
		r, err := s.c.read()
		if err != nil {
			s.readErr <- err
			return
		}
		select {
		case s.frames <- r:
		case <-s.gone:
			return
		}
	}
}

func (s *recvStream) run() {
	for {
		changed := s.b.watch()
		batch, seqs, killed, err := s.next(changed)
		if err != nil {
			s.c.fail(err)
			return
		}
		if len(batch) == 0 {
			if !s.idle(changed, killed) {
				return
			}
			continue
		}
		if !s.hand(batch, seqs) || s.enough() {
			return
		}
	}
}

// next is the next batch: live asks first, alone (a turn waits for each,
// and the store need not be read to hand them out), else stored mail after
// what the pending acknowledgement covers. Mail that expired, or whose
// sender's host is no longer trusted, is dead-lettered on the way (killed
// counts it); a reply being handed to an open send is left alone.
func (s *recvStream) next(changed <-chan struct{}) (batch []api.Delivery, seqs map[string]uint64, killed int, err error) {
	n := s.window
	if s.left > 0 && s.left < n {
		n = s.left
	}
	now := time.Now()
	asks := s.b.liveHead(now)
	var items []store.Item
	read := false
	if len(asks) == 0 && !s.stillQuiet() {
		var after store.After // the head; past the pending acknowledgement, in each lane
		if s.pend != nil {
			after = s.pend.upTo
		}
		if items, err = s.g.st.HeadSoon(s.ent.Gid, after, n); err != nil {
			return nil, nil, 0, err
		}
		read = true
	}
	items, left := s.g.rdv.Free(items) // read and left out of the batch: replies being handed to an open send
	batch = make([]api.Delivery, 0, len(asks)+len(items))
	seqs = make(map[string]uint64, len(items))
	for _, a := range asks {
		batch = append(batch, api.Delivery{Envelope: a})
	}
	for _, it := range items {
		switch k := store.Key(it.Env); {
		case s.pend != nil && s.pend.keys[k]:
			left++
			continue // acknowledged; its commit is under way
		case it.Env.Expired(now):
			s.g.boxes.Kill(it.Env, "expired before delivery", 0)
			killed++
			continue
		case !s.g.admit.trusted(it.Env.Sender.Host): // its host was removed from the trust file since
			s.g.boxes.Kill(it.Env, "sender host "+it.Env.Sender.Host+" is no longer trusted", 0)
			killed++
			continue
		}
		batch = append(batch, api.Delivery{Envelope: it.Env})
		seqs[it.Env.MsgID] = it.Seq
	}
	if read {
		s.quiet = nil
		if len(items) < n && left == 0 && killed == 0 {
			s.quiet = changed // the end of the inbox: hand confirms it once the batch is acknowledged whole
		}
	}
	return batch, seqs, killed, nil
}

// stillQuiet says whether a read of stored mail would find nothing new
// (quiet): the watch taken before the last one, which reached the inbox's
// end, has not fired.
func (s *recvStream) stillQuiet() bool {
	if s.quiet == nil {
		return false
	}
	select {
	case <-s.quiet:
		s.quiet = nil
		return false
	default:
		return true
	}
}

// idle handles an empty batch: look again after killing some, settle the
// pending acknowledgement, end a drain, or wait for mail (follow). False
// ends the stream.
func (s *recvStream) idle(changed <-chan struct{}, killed int) bool {
	switch {
	case killed > 0:
		return true // only dead ones: look again
	case s.pend != nil: // settle the last acknowledgement, then look again
		return s.settle()
	case !s.follow:
		s.end()
		return false
	}
	select {
	case <-changed:
		return true
	case <-s.g.runCtx.Done():
		s.c.reply(&api.Response{Error: api.FromFault(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))})
	case err := <-s.readErr:
		s.g.logRecvEnd(s.log, err)
	case <-s.frames:
		s.c.fail(fault.New(fault.Data, fault.KindProtocol, "unexpected request while waiting for mail"))
	}
	return false
}

// hand sends a batch, takes its acknowledgement and starts its commit.
// False ends the stream (the client went away: the batch stays).
func (s *recvStream) hand(batch []api.Delivery, seqs map[string]uint64) bool {
	if err := s.c.reply(&api.Response{OK: true, Batch: batch}); err != nil {
		return false
	}
	var frame api.Request
	select {
	case frame = <-s.frames:
	case err := <-s.readErr:
		s.g.logRecvEnd(s.log, err)
		return false // unacknowledged: the batch stays in the inbox
	}
	ack, ok := frame.(*api.AckRequest)
	if !ok {
		s.c.fail(fault.New(fault.Data, fault.KindProtocol, "want ack, got %q", api.OpOf(frame)))
		return false
	}
	// test hook: the client has written the batch out; nothing is recorded
	s.g.crash.at(s.g.log, "recv-before-commit")
	if !s.settle() { // at most one acknowledgement in flight
		return false
	}
	if len(ack.Acks) > 0 {
		s.pend = s.g.commitAck(s.b, batch, seqs, ack.Acks)
	}
	if s.pend == nil || !s.pend.whole {
		s.quiet = nil // what was not acknowledged is read again
	}
	if s.left > 0 {
		s.left -= len(ack.Acks)
		if s.left <= 0 {
			s.left = -1 // done: enough says so
		}
	}
	return true
}

// enough ends the stream once --max messages were acknowledged, or the
// gateway stops: every acknowledgement on disk, then End — or, for a
// follow stream the stop cut short, shutting_down (as one waiting for
// mail gets): a follower then knows to come back, not that it is done.
func (s *recvStream) enough() bool {
	if s.left >= 0 && s.g.runCtx.Err() == nil {
		return false
	}
	if !s.settle() {
		return true
	}
	if s.follow && s.left >= 0 {
		s.close()
		s.c.reply(&api.Response{Error: api.FromFault(fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"))})
		return true
	}
	s.end()
	return true
}

// settle waits for the pending acknowledgement's commit; false (after
// telling the client) if it failed.
func (s *recvStream) settle() bool {
	if s.pend == nil {
		return true
	}
	err := <-s.pend.done
	s.pend = nil
	if err != nil {
		s.c.fail(fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not record the acknowledgement"))
		return false
	}
	return true
}

// ackCommit is an acknowledgement being recorded.
type ackCommit struct {
	keys  map[string]bool
	upTo  store.After // the highest inbox sequence it covers in each lane, when every message up to it was acknowledged
	whole bool        // every stored message of the batch was acknowledged
	done  chan error
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
			g.audit.Message("drained", d.Envelope, 1, "ask")
			g.metrics.Delivered(d.Envelope.Kind)
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
		a.whole = true
		for _, env := range done {
			a.upTo = a.upTo.Advance(seqs[env.MsgID])
		}
	}
	if len(keys) == 0 { // only live asks: nothing to write
		a.done <- nil
		return a
	}
	go func() {
		err := g.st.DeliveredSoon(keys, time.Now().UTC())
		if err == nil {
			g.audit.Messages("drained", done, 1, "")
			g.rcpt.SettledAll(done, store.Delivered, 1)
			g.crash.at(g.log, "after-ack")
		}
		a.done <- err
	}()
	return a
}

func (g *Gateway) logRecvEnd(log *slog.Logger, err error) {
	if errors.Is(err, io.EOF) || g.runCtx.Err() != nil {
		return
	}
	log.Warn("fleet-recv connection ended", "err", err)
}
