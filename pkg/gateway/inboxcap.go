package gateway

// inboxcap.go — every inbox is capped. A local inbox (the embedded
// store's, for an entity of this host) keeps the same two limits as a
// broker inbox, from the same settings, and breaks them the same way:
//
//   - length (inbox-max-length): like the broker's reject-publish, a
//     message over the cap is refused, never an older one dropped. A send
//     or reply from this host is refused before it is stored: its sender
//     hears 75 inbox_full, and the message is dead here with the reason
//     and a BOUNCE, as when a broker inbox refuses it (route.go publish).
//     A broadcast copy is refused for that member only (the others have
//     theirs; the broadcast fails 75, as the broker's nack makes it). Mail
//     from another host is never taken past the cap: it stays on the
//     broker (back-pressure, Fits): the gateway stops taking from that
//     entity's broker inbox, and only that one, until the local inbox has
//     drained to resumeAt; past the broker inbox's own cap the broker
//     refuses new publishes, and their senders hear 75 at once. Nothing
//     that the broker confirmed dies for want of room here, and nothing
//     is held in memory: what the consumer had is given back in order.
//     A replay over the cap is refused and not made a new dead letter.
//     The gateway's own notices (BOUNCE, TOO_LATE) are never refused: they
//     tell an entity what became of what it sent. Like the broker's, the
//     cap is approximate: sends at the same instant may each find room.
//   - age (inbox-ttl): a message that waited longer than that since it
//     was stored in the inbox dies with reason "expired in the inbox", its
//     sender told (a BOUNCE here, a dead receipt to another host). A sweep
//     looks every inbox-ttl/10 (between 100 ms and a minute), at the head
//     of each inbox (its oldest), never at a message being handed over.
//     Notices expire like any message, and tell nobody.
//
// Both deaths count in fleet_messages_dead_total (reason inbox_full or
// expired), a refusal in fleet_inbox_full_total too.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/metrics"
	"github.com/fleetd/fleet/pkg/store"
)

// reasonLocalExpired opens the reason of a message that waited too long
// in a local inbox ("expired": its metrics label).
const reasonLocalExpired = "expired in the inbox"

// reasonLocalFull opens the reason of a message a full local inbox refused
// ("inbox full": its metrics label).
const reasonLocalFull = "inbox full"

// expireBatch bounds the messages one sweep kills in one inbox at once.
const expireBatch = 256

// inboxCaps is the part that holds local inboxes to inbox-max-length and
// inbox-ttl. It owns the sweep's goroutine and what it last said of each
// inbox; the gateway gives it the store and its hooks at its making.
type inboxCaps struct {
	st      *store.Store
	max     int           // inbox-max-length; 0: no cap
	ttl     time.Duration // inbox-ttl; 0: no expiry
	log     *slog.Logger
	audit   *audit.Log
	metrics *metrics.Metrics
	hooks   capHooks

	mu      sync.Mutex
	full    map[string]bool // inboxes that refused since they last had room: said once
	leaving map[string]bool // entities whose broker inbox is taken in whole (Leaving)
}

// capHooks is what the part asks of the rest of the gateway.
type capHooks struct {
	// held says a message of gid's inbox is being handed over now (a
	// pull batch not yet acknowledged, a reply going to an open send), or
	// gid is no live entity's. It runs inside a store operation: quick,
	// and no store call.
	held func(gid, key string) bool
	// bounce tells the sender of a refused message (not a quiet kind).
	bounce func(env *envelope.Envelope, reason string)
	// dead does what follows a death in a local inbox, already recorded
	// in the store: the audit line, bridge.dlq, the sender told (inboxes.Kill:
	// its store step finds the message dead and changes nothing).
	dead func(env *envelope.Envelope, reason string)
}

func newInboxCaps(st *store.Store, max int, ttl time.Duration, log *slog.Logger, a *audit.Log, m *metrics.Metrics, h capHooks) *inboxCaps {
	return &inboxCaps{st: st, max: max, ttl: ttl, log: log, audit: a, metrics: m, hooks: h, full: map[string]bool{}, leaving: map[string]bool{}}
}

// capped says whether the length cap can refuse a message of kind: the
// mail an entity sends, not the gateway's notices.
func capped(k envelope.Kind) bool {
	switch k {
	case envelope.Send, envelope.Reply, envelope.Broadcast:
		return true
	}
	return false
}

// fullReason is the reason a message refused by a full local inbox dies.
func (c *inboxCaps) fullReason() string {
	return fmt.Sprintf("%s: the recipient's inbox holds inbox-max-length (%d) messages", reasonLocalFull, c.max)
}

// Room says whether env's local inbox can take it: nil, or 75
// inbox_full. Nothing is recorded (a replay over the cap stays a replay
// not made).
func (c *inboxCaps) Room(env *envelope.Envelope) error {
	if c.max <= 0 || !capped(env.Kind) {
		return nil
	}
	gid := env.Recipient.Gid
	n := c.st.Pending(gid)
	c.mu.Lock()
	was := c.full[gid]
	if n < c.max {
		delete(c.full, gid)
	} else {
		c.full[gid] = true
	}
	c.mu.Unlock()
	if n < c.max {
		return nil
	}
	if !was {
		c.log.Warn("local inbox full: refusing new mail until it drains", "entity", env.Recipient.String(), "pending", n, "max", c.max)
	}
	return fault.New(fault.TempFail, fault.KindInboxFull,
		"the inbox of %s is full: it holds %d messages (inbox-max-length %d)", env.Recipient.String(), n, c.max).
		WithHint("try again once %s has read its mail (fleet-roster shows what waits)", env.Recipient.Name)
}

// Refuse is Room for a new message: over the cap, env is dead here with
// the reason, counted, and its sender bounced, and the fault is returned
// for the sender's call.
func (c *inboxCaps) Refuse(env *envelope.Envelope) error {
	err := c.Room(env)
	if err == nil {
		return nil
	}
	reason := c.fullReason()
	c.metrics.InboxFull(env.Kind)
	c.metrics.Dead(env.Kind, reason)
	c.audit.Message("dead", env, 0, reason)
	if derr := c.st.DeadOutbound(env, reason, time.Now().UTC()); derr != nil {
		c.log.Error("dead-lettering", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", derr)
		return err
	}
	if !quiet(env.Kind) {
		c.hooks.bounce(env, reason)
	}
	return err
}

// Fits is how many of envs, mail from the broker for one local inbox in
// the order it came, the inbox has room for: all of them, or up to the
// first that would take it past inbox-max-length, with the error that
// says so (broker.Backpressure). That one and what follows it stay on the
// broker, which holds them for this host, in order: its gateway does not
// take from that broker inbox until the local one has drained to a
// quarter under the cap (resumeAt). A message the inbox has already (a
// redelivery) and the gateway's notices take no room; an entity that is
// leaving takes in all that waits (its inbox dies with it).
func (c *inboxCaps) Fits(envs []*envelope.Envelope) (int, error) {
	if c.max <= 0 || len(envs) == 0 {
		return len(envs), nil
	}
	gid := envs[0].Recipient.Gid
	c.mu.Lock()
	leaving := c.leaving[gid]
	c.mu.Unlock()
	free := c.max - c.st.Pending(gid)
	if leaving || free >= len(envs) {
		return len(envs), nil
	}
	for i, env := range envs {
		if !capped(env.Kind) {
			continue
		}
		if _, err := c.st.Record(store.Key(env)); err == nil {
			continue // a redelivery: the dedup drops it
		}
		if free <= 0 {
			return i, c.backpressure(env)
		}
		free--
	}
	return len(envs), nil
}

// resumeAt is the length a full inbox drains to before its broker inbox
// is taken from again: a quarter of the cap under it (at least one), so
// that a reader taking one message at a time does not make the consumer
// stop and start for each.
func (c *inboxCaps) resumeAt() int { return c.max - max(1, c.max/4) }

// backpressure is the broker's word for env's full inbox (the broker's
// consumer logs each hold and its end).
func (c *inboxCaps) backpressure(env *envelope.Envelope) error {
	gid := env.Recipient.Gid
	c.metrics.InboxHeld()
	err := fault.New(fault.TempFail, fault.KindInboxFull, "the inbox of %s is full (inbox-max-length %d; taken again at %d)",
		env.Recipient.String(), c.max, c.resumeAt())
	return broker.Backpressure(err, func() bool { return c.st.Pending(gid) <= c.resumeAt() })
}

// Leaving marks gid's entity as leaving (true: its broker inbox is being
// taken in whole before it is deleted, whatever the cap) or no longer.
func (c *inboxCaps) Leaving(gid string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if on {
		c.leaving[gid] = true
	} else {
		delete(c.leaving, gid)
	}
}

// interval is how often Run sweeps: a tenth of inbox-ttl, from 100 ms to
// a minute.
func (c *inboxCaps) interval() time.Duration {
	return min(max(c.ttl/10, 100*time.Millisecond), time.Minute)
}

// Sweep dead-letters every message that has waited in a local inbox
// longer than inbox-ttl at now, and returns how many.
func (c *inboxCaps) Sweep(now time.Time) int {
	if c.ttl <= 0 {
		return 0
	}
	cutoff := now.Add(-c.ttl)
	stats, err := c.st.Inboxes()
	if err != nil {
		c.log.Error("reading the inboxes for expired mail", "err", err)
		return 0
	}
	reason := fmt.Sprintf("%s: it waited longer than inbox-ttl (%v)", reasonLocalExpired, c.ttl)
	n := 0
	for _, s := range stats {
		// a head sent after the cutoff was stored after it too (a
		// message is stored after it is made): nothing there is due
		if s.Depth == 0 || s.Oldest.After(cutoff) {
			continue
		}
		for {
			gid := s.Gid
			envs, err := c.st.ExpireHead(gid, cutoff, reason, expireBatch, func(key string) bool { return c.hooks.held(gid, key) })
			if err != nil {
				c.log.Error("expiring mail", "entity", gid, "err", err)
				break
			}
			for _, env := range envs {
				c.hooks.dead(env, reason)
			}
			n += len(envs)
			if len(envs) < expireBatch {
				break
			}
		}
	}
	return n
}

// Run sweeps until ctx ends.
func (c *inboxCaps) Run(ctx context.Context) {
	if c.ttl <= 0 {
		return
	}
	t := time.NewTicker(c.interval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Sweep(time.Now())
		}
	}
}
