package broker

import (
	"context"
	"errors"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// PresenceHandler receives every PRESENCE message heard on this gateway's
// roster queue (its own included).
type PresenceHandler func(env *envelope.Envelope)

// OnPresence sets the presence handler; call before Run.
func (b *Broker) OnPresence(h PresenceHandler) { b.presence = h }

// PublishPresence announces env on bridge.roster with key
// roster.<host>.<what>. Presence is soft state: not persistent, not
// mandatory, short-lived; a failure only means the next heartbeat carries it.
func (b *Broker) PublishPresence(env *envelope.Envelope, what string, ttl time.Duration) error {
	b.mu.Lock()
	gen, blocked := b.gen, b.blocked
	b.mu.Unlock()
	if gen == nil || blocked != "" {
		return errors.New("broker unavailable")
	}
	body, err := envelope.Encode(env)
	if err != nil {
		return err
	}
	msg := amqp.Publishing{
		ContentType: "application/json", MessageId: env.MsgID, Type: string(env.Kind), Body: body,
		Expiration: itoa(ttl.Milliseconds()),
		Headers:    amqp.Table{"fleet-host": b.cfg.Host},
	}
	b.signHeaders(&msg)
	switch gen.pub.publishTo(context.Background(), ExRoster, "roster."+b.cfg.Host+"."+what, msg, time.Now().Add(b.cfg.PublishTimeout), false) {
	case resAck:
		return nil
	default:
		return errors.New("presence not confirmed")
	}
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
			env, err := envelope.Decode(m.Body, 16<<20)
			if err != nil || env.Kind != envelope.Presence {
				b.log.Warn("ignoring a bad presence message", "err", err)
				continue
			}
			if err := b.authentic(m, env); err != nil {
				b.log.Error("ignoring a presence message that is not authentic", "msg_id", env.MsgID, "err", err)
				continue
			}
			if b.presence != nil {
				b.presence(env)
			}
		}
	}
}
