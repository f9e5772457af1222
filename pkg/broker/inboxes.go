package broker

import (
	"errors"
	"slices"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The local entities' inboxes on the broker: declared, bound to their
// groups, consumed, kept across reconnects, and removed.

// StopConsuming cancels every inbox consumer, now and after any
// reconnect, and leaves publishing (and the control, roster and deaths
// consumers) as they are: a gateway stopping takes no new mail, while the
// work it is finishing still publishes its receipts and answers. What an
// inbox consumer had received and not taken goes back to its queue.
func (b *Broker) StopConsuming() {
	b.quiet.Store(true) // before gen.mu: a consumer starting after this sees it
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return
	}
	gen.mu.Lock()
	cs := make([]*consumer, 0, len(gen.consumers))
	for gid, c := range gen.consumers {
		cs = append(cs, c)
		delete(gen.consumers, gid)
	}
	gen.mu.Unlock()
	for _, c := range cs {
		c.stop()
	}
}

// AddInbox declares, binds and consumes the inbox of a local entity, and
// keeps it consumed after every reconnect. Connected, it returns once the
// inbox is consumed — a message sent the moment join returns is routed and
// taken — or with the error that kept it from being, and then forgets it
// (nothing half-made). Disconnected, it returns nil: the inbox is declared
// and consumed when the connection comes back.
func (b *Broker) AddInbox(gid string, groups []string) error {
	b.mu.Lock()
	b.inboxes[gid] = groups
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return nil
	}
	o, err := b.openInbox(gen, gid)
	if err != nil {
		b.mu.Lock()
		delete(b.inboxes, gid)
		b.mu.Unlock()
		// a queue declared and bound but never consumed would collect
		// broadcast copies for nobody until it is full — and a full inbox
		// bound to broadcast.all refuses every broadcast: delete it
		var nd *notDeclared
		if errors.As(err, &nd) {
			// nothing was made
		} else if derr := gen.setup.do(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(InboxQueue(gid), false, false, false)
			return err
		}); derr != nil {
			b.log.Error("a join failed and its half-made inbox could not be deleted: delete it by hand",
				"queue", InboxQueue(gid), "err", derr)
		}
		return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "could not declare and consume the inbox %s on the broker", InboxQueue(gid)).
			WithHint("check the broker and the gateway's log; the entity was not registered")
	}
	b.startConsumer(gen, gid, o)
	return nil
}

// KeepInbox makes gid's inbox one this gateway consumes, now in the
// background if connected, and after every reconnect: for the entities
// loaded at start, whose inboxes exist already.
func (b *Broker) KeepInbox(gid string, groups []string) {
	b.mu.Lock()
	b.inboxes[gid] = groups
	gen := b.gen
	b.mu.Unlock()
	if gen != nil {
		b.startConsumer(gen, gid, nil)
	}
}

// SetGroups rebinds gid's inbox to its new groups' broadcast keys at once
// (and on every reconnect after).
func (b *Broker) SetGroups(gid string, old, groups []string) error {
	b.mu.Lock()
	if _, ok := b.inboxes[gid]; ok {
		b.inboxes[gid] = groups
	}
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return errors.New("broker unreachable")
	}
	ch, err := gen.subConn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q := InboxQueue(gid)
	for _, gr := range groups {
		if err := ch.QueueBind(q, "broadcast."+gr, ExMsg, false, nil); err != nil {
			return err
		}
	}
	for _, gr := range old {
		if !slices.Contains(groups, gr) {
			if err := ch.QueueUnbind(q, "broadcast."+gr, ExMsg, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// RemoveInbox stops consuming gid's inbox, unbinds it so nothing new
// arrives, hands what is still queued to the handler, and deletes the
// queue. It needs the broker; without it, the queue stays (and is found
// again when the entity is registered anew or an operator removes it).
func (b *Broker) RemoveInbox(gid string, groups []string) error {
	b.mu.Lock()
	delete(b.inboxes, gid)
	gen := b.gen
	b.mu.Unlock()
	if gen == nil {
		return fault.New(fault.Unavailable, fault.KindBrokerDown, "broker unreachable: inbox queue %s left in place", InboxQueue(gid))
	}
	gen.mu.Lock()
	c := gen.consumers[gid]
	delete(gen.consumers, gid)
	gen.mu.Unlock()
	if c != nil {
		c.stop()
	}
	ch, err := gen.subConn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q := InboxQueue(gid)
	for _, k := range InboxKeys(gid, groups) {
		if err := ch.QueueUnbind(q, k, ExMsg, nil); err != nil {
			return err
		}
	}
	// take in what is queued, with a consumer of its own (basic.get is
	// refused on a quorum queue with a single active consumer), until the
	// queue has nothing ready
	if err := ch.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return err
	}
	tag := b.tag(gid) + "/leave"
	dl, err := ch.Consume(q, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	idle := time.NewTimer(300 * time.Millisecond)
	defer idle.Stop()
	for done := false; !done; {
		select {
		case d, ok := <-dl:
			if !ok {
				return errors.New("the channel closed while taking in the inbox")
			}
			if !b.take(d, gid, nil, nil) {
				_ = ch.Cancel(tag, false)
				_ = d.Nack(false, true)
				return errors.New("the host could not take in what waits in the inbox")
			}
		case <-idle.C:
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return err
			}
			done = st.Messages == 0
			idle.Reset(300 * time.Millisecond)
		}
	}
	if err := ch.Cancel(tag, false); err != nil {
		return err
	}
	for d := range dl { // sent before the cancel: taken in too
		if !b.take(d, gid, nil, nil) {
			_ = d.Nack(false, true)
		}
	}
	_, err = ch.QueueDelete(q, false, true, false)
	return err
}
