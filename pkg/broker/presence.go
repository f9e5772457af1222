package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// PresenceHandler receives every authentic PRESENCE message heard on this
// gateway's roster queue (its own included). A *Refusal it returns sends
// the message to bridge.dlq with that reason.
type PresenceHandler func(env *envelope.Envelope) error

// OnPresence sets the presence handler; call before Run.
func (b *Broker) OnPresence(h PresenceHandler) { b.presence = h }

// OnUntrustedPresence sets a function told of every presence message
// refused because its host is not trusted, with the host its header
// claims and the envelope as it decoded (its fields checked, nothing of
// it proven): what such a host says may be repeated as a hint, never
// believed. Call before Run.
func (b *Broker) OnUntrustedPresence(f UntrustedHandler) { b.untrusted = f }

// UntrustedHandler is told of a presence message refused as not trusted.
type UntrustedHandler func(claimedHost string, env *envelope.Envelope)

// PublishPresence announces env on bridge.roster with key
// roster.<host>.<what>. Presence is soft state: not persistent, not
// mandatory, short-lived; a failure only means the next snapshot carries
// it. It returns once the message is written on the publishing channel
// (an error: it was not), so messages published one after another reach
// the broker in that order; confirmed waits for the broker's confirm.
func (b *Broker) PublishPresence(env *envelope.Envelope, what string, ttl time.Duration) (confirmed func() error, err error) {
	b.mu.Lock()
	gen, blocked := b.gen, b.blocked
	b.mu.Unlock()
	if gen == nil || blocked != "" {
		return nil, errors.New("broker unavailable")
	}
	body, err := envelope.Encode(env)
	if err != nil {
		return nil, err
	}
	msg := amqp.Publishing{
		ContentType: "application/json", MessageId: env.MsgID, Type: string(env.Kind), Body: body,
		Expiration: itoa(ttl.Milliseconds()),
		Headers:    amqp.Table{"fleet-host": b.cfg.Host},
	}
	b.signHeaders(&msg)
	written, wait := gen.publisher().publishOrdered(context.Background(), ExRoster, "roster."+b.cfg.Host+"."+what, msg, time.Now().Add(b.cfg.PublishTimeout))
	confirmed = func() error {
		if wait() != resAck {
			return errors.New("presence not confirmed")
		}
		return nil
	}
	if !written {
		return nil, confirmed()
	}
	return confirmed, nil
}

func itoa(n int64) string {
	if n < 1 {
		n = 1
	}
	buf := [20]byte{}
	i := len(buf)
	for n > 0 {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
	}
	return string(buf[i:])
}

// consumeRoster reads this gateway's roster queue (auto-ack: soft state)
// until the generation ends. One goroutine owns its channel.
func (b *Broker) consumeRoster(gen *generation) {
	defer gen.wg.Done()
	ch, err := gen.subConn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	d, err := ch.Consume(RosterQueue(b.cfg.Host), "fleet-gw/"+b.cfg.Host+"/roster", true, true, false, false, nil)
	if err != nil {
		if gen.ctx.Err() == nil {
			b.log.Error("cannot consume the roster queue", "err", err)
		}
		return
	}
	for {
		select {
		case <-gen.ctx.Done():
			return
		case m, ok := <-d:
			if !ok {
				return
			}
			b.takePresence(m)
		}
	}
}

// takePresence checks one presence message and hands it on; what is
// refused goes to bridge.dlq (a copy: the roster queue is auto-ack).
func (b *Broker) takePresence(m amqp.Delivery) {
	q := RosterQueue(b.cfg.Host)
	env, err := envelope.Decode(m.Body, 1<<20)
	if err != nil {
		b.refusePresence(m, q, nil, asRefusal(err, ReasonMalformed))
		return
	}
	if env.Kind != envelope.Presence {
		b.refusePresence(m, q, env, Refuse(ReasonMisrouted, "kind %s on bridge.roster", env.Kind))
		return
	}
	if err := b.authentic(m, env); err != nil {
		// an untrusted or not yet enrolled host, a bad signature: its
		// presence comes again every interval, so it is held to the
		// once-a-minute rule like any other refused presence
		r := asRefusal(err, ReasonForged)
		if host, _ := m.Headers["fleet-host"].(string); r.Reason == ReasonUntrusted && b.untrusted != nil {
			b.untrusted(host, env)
		}
		b.refusePresence(m, q, env, r)
		return
	}
	if b.presence == nil {
		return
	}
	var r *Refusal
	if err := b.presence(env); errors.As(err, &r) {
		b.refusePresence(m, q, env, r)
	}
}

// refusePresence refuses a presence message, whatever the cause (it does
// not decode, is misrouted, is not authentic, or lies). Presence repeats
// every interval for every entity, so an untrusted or misconfigured host
// would put a stream of identical refusals in bridge.dlq and the log: the
// first of identical refusals (reason, claimed host, error) is logged and
// copied, repeats within a minute are counted (and in the refusals
// metric) and reported with the next.
func (b *Broker) refusePresence(m amqp.Delivery, q string, env *envelope.Envelope, r *Refusal) {
	host, _ := m.Headers["fleet-host"].(string)
	key := r.Reason + "|" + host + "|" + r.Err.Error() // the same refusal, again
	now := time.Now()
	b.mu.Lock()
	if b.presRefused == nil {
		b.presRefused = map[string]*refusedRun{}
	}
	run := b.presRefused[key]
	if run != nil && now.Sub(run.last) < time.Minute {
		run.quiet++
		b.mu.Unlock()
		b.refused(r.Reason, host)
		return
	}
	quiet := 0
	if run != nil {
		quiet = run.quiet
	}
	if len(b.presRefused) > 1024 {
		clear(b.presRefused)
	}
	b.presRefused[key] = &refusedRun{last: now}
	b.mu.Unlock()
	if quiet > 0 {
		r = &Refusal{Reason: r.Reason, Err: fmt.Errorf("%w (and %d more like it in the last minute, not copied)", r.Err, quiet)}
	}
	b.refuse(m, q, env, r, false)
}

// refusedRun counts the refused presence messages of one reason and host.
type refusedRun struct {
	last  time.Time
	quiet int
}
