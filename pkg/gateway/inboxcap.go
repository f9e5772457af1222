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
//     theirs; the broadcast fails 75, as the broker's nack makes it). A
//     message from another host is taken in first (its broker delivery
//     must be acked or refused) and dead at once if it took the inbox past
//     the cap: its sender's host is told by a dead receipt, and bounces.
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

	mu   sync.Mutex
	full map[string]bool // inboxes that refused since they last had room: said once
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
	return &inboxCaps{st: st, max: max, ttl: ttl, log: log, audit: a, metrics: m, hooks: h, full: map[string]bool{}}
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

// Trim dead-letters a message from another host just taken into its
// inbox (rec, not a duplicate) when that took the inbox past the cap:
// taken in, so its broker delivery is acked, and dead, so its sender's
// host is told. It reports whether it did.
func (c *inboxCaps) Trim(env *envelope.Envelope, rec *store.Record) bool {
	if c.max <= 0 || !capped(env.Kind) || rec.State != store.Accepted || c.st.Pending(env.Recipient.Gid) <= c.max {
		return false
	}
	reason := c.fullReason()
	if err := c.st.Kill(store.Key(env), reason, 0); err != nil {
		c.log.Error("dead-lettering", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		return false
	}
	c.mu.Lock()
	was := c.full[env.Recipient.Gid]
	c.full[env.Recipient.Gid] = true
	c.mu.Unlock()
	if !was {
		c.log.Warn("local inbox full: mail from other hosts is dead-lettered until it drains", "entity", env.Recipient.String(), "max", c.max)
	}
	c.metrics.InboxFull(env.Kind)
	c.hooks.dead(env, reason)
	return true
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
