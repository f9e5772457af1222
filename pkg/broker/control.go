package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The control plane (U4): SPAWN and STOP go to bridge.control with the
// target host as routing key, and so to that gateway's durable
// control.<host> queue (declared and bound in connect). Each gateway
// consumes its own control queue with one exclusive, manual-ack consumer
// and hands every request to its ControlHandler; the answer travels back
// on bridge.msg to the requester's inbox (the gateway does that, with
// Publish).

// ControlHandler carries out one control request. nil means it was handled
// (answered, or dropped on purpose) and the delivery is acked; an error
// requeues it, up to the configured attempts.
type ControlHandler func(env *envelope.Envelope) error

// OnControl sets the control handler; call before Run. Without one, the
// control queue is not consumed.
func (b *Broker) OnControl(h ControlHandler) { b.control = h }

// PublishControl sends a control request to host's control queue:
// persistent, mandatory, confirmed; the envelope's expiry becomes its
// per-message TTL, so a request nobody took in time is never carried out.
//
//	fault.Unavailable (69)  broker down, blocked, or no confirm in time
//	fault.NoRecipient (67)  returned unroutable: no gateway ever ran as host
func (b *Broker) PublishControl(ctx context.Context, host string, env *envelope.Envelope) error {
	return b.publishControl(ctx, host, env, true)
}

// PublishQuery sends a query (TRACE) to host's control queue as
// PublishControl does, but not persistent: a query is worth nothing after
// its expiry, nor after a broker restart.
func (b *Broker) PublishQuery(ctx context.Context, host string, env *envelope.Envelope) error {
	return b.publishControl(ctx, host, env, false)
}

func (b *Broker) publishControl(ctx context.Context, host string, env *envelope.Envelope, persistent bool) error {
	msg, err := b.publishing(env, persistent)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(b.cfg.PublishTimeout)
	maybeSent := false // an attempt was written and not confirmed
	unknown := func() error {
		return fault.New(fault.OutcomeUnknown, fault.KindOutcomeUnknown,
			"the broker connection was lost before it confirmed the %s request to %s: the outcome is unknown", env.Kind, host).
			WithHint("the request may still reach %s, which carries out each request id once: the same request again is safe", host)
	}
	for attempt := 1; ; attempt++ {
		gen, err := b.current("request not sent", "requests to other hosts work again once the gateway reconnects")
		if err != nil {
			if maybeSent {
				return unknown()
			}
			return err
		}
		pub := gen.publisher()
		written, res := pub.publishWritten(ctx, ExControl, host, msg, deadline)
		switch res {
		case resAck:
			return nil
		case resReturned:
			return fault.New(fault.NoRecipient, fault.KindUnknownHost, "no host %s: no gateway has a control queue for it on the broker", host).
				WithHint("list the hosts with: fleet-roster")
		case resNack:
			return fault.New(fault.TempFail, fault.KindBrokerRefused, "the broker refused the request to %s", host)
		case resTimeout:
			if !written && !maybeSent {
				return fault.New(fault.Unavailable, fault.KindBrokerDown,
					"the broker did not take the request to %s within %v: not sent", host, b.cfg.PublishTimeout).
					WithHint("check the broker (a memory or disk alarm blocks publishers)")
			}
			return fault.New(fault.OutcomeUnknown, fault.KindBrokerTimeout,
				"the broker did not confirm the request within %v; it may still reach %s", b.cfg.PublishTimeout, host)
		case resClosed:
			if reason, ok := pub.refused(host); ok {
				return refusedFault(host, reason, b.cfg.Host)
			}
			// unknown outcome: the same request id again is safe, the
			// target carries out each request id once
			maybeSent = maybeSent || written
		}
		if time.Now().After(deadline) || attempt >= 5 {
			if maybeSent {
				return unknown()
			}
			return fault.New(fault.Unavailable, fault.KindBrokerDown, "the broker connection failed before the request was written: not sent")
		}
		backoff.Sleep(ctx, 50*time.Millisecond*time.Duration(attempt))
	}
}

// publishing is env as an AMQP message, as Publish builds it.
func (b *Broker) publishing(env *envelope.Envelope, persistent bool) (amqp.Publishing, error) {
	env, err := b.sealed(env) // seal, encode, sign
	if err != nil {
		return amqp.Publishing{}, err
	}
	body, err := envelope.Encode(env)
	if err != nil {
		return amqp.Publishing{}, err
	}
	msg := amqp.Publishing{
		ContentType: "application/json",
		MessageId:   env.MsgID,
		Type:        string(env.Kind),
		Timestamp:   env.Created,
		Body:        body,
		Headers:     amqp.Table{"fleet-schema": env.Schema, "fleet-trace-id": env.TraceID, "fleet-host": b.cfg.Host},
	}
	if persistent {
		msg.DeliveryMode = amqp.Persistent
	}
	if env.Urgent { // ahead of normal mail the broker holds (inboxArgs)
		msg.Priority = UrgentPriority
	}
	if !env.Expires.IsZero() {
		ms := time.Until(env.Expires).Milliseconds()
		if ms < 1 {
			ms = 1
		}
		msg.Expiration = fmt.Sprint(ms)
	}
	if env.Sender.Gid != "" { // for a receiver that cannot read the body (auth.go, unreadHead)
		msg.Headers["fleet-sender"] = env.Sender.Gid
	}
	b.signHeaders(&msg)
	return msg, nil
}

// consumeControl consumes this host's control queue, one request at a
// time, until the generation ends. The consumer is exclusive: a second
// gateway with the same host id is refused (loudly) and keeps retrying, as
// does this one while the broker still holds the queue for our previous,
// dying connection.
func (b *Broker) consumeControl(gen *generation) {
	defer gen.wg.Done()
	q := ControlQueue(b.cfg.Host)
	log := b.log.With("queue", q)
	reported := false
	for gen.ctx.Err() == nil {
		ch, err := gen.subConn.Channel()
		if err != nil {
			return // the connection is gone: the next generation starts over
		}
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		var d <-chan amqp.Delivery
		if err = ch.Qos(1, 0, false); err == nil {
			d, err = ch.Consume(q, "fleet-gw/"+b.cfg.Host+"/control", false, true, false, false, nil)
		}
		if err != nil {
			ch.Close()
			var ae *amqp.Error
			refused := errors.As(err, &ae) && ae.Code == amqp.AccessRefused
			b.mu.Lock()
			since := b.reconnected
			b.mu.Unlock()
			switch {
			case gen.ctx.Err() != nil || reported:
			case refused && !since.IsZero() && time.Since(since) < b.rivalGrace():
				log.Info("control queue still held by our previous connection: retrying until the broker reaps it")
			case refused:
				log.Error("the control queue is consumed by another connection (another gateway as host "+b.cfg.Host+"?): retrying",
					"err", ae.Reason)
				reported = true
			default:
				log.Error("cannot consume the control queue: retrying", "err", err)
				reported = true
			}
			backoff.Sleep(gen.ctx, time.Second)
			continue
		}
		if reported {
			log.Info("consuming the control queue")
			reported = false
		}
	serve:
		for {
			select {
			case <-gen.ctx.Done():
				ch.Close() // an unacked request goes back to the queue
				return
			case <-closed:
				break serve
			case m, ok := <-d:
				if !ok {
					break serve
				}
				b.takeControl(m)
			}
		}
	}
}

// takeControl hands one control request to the handler and settles it.
// Whatever is not an authentic SPAWN, STOP or TRACE for this host is refused to
// bridge.dlq with its reason, loudly.
func (b *Broker) takeControl(d amqp.Delivery) {
	q := ControlQueue(b.cfg.Host)
	env, err := envelope.Decode(d.Body, b.cfg.MaxBody)
	if err != nil {
		b.refuse(d, q, nil, asRefusal(err, ReasonMalformed), true)
		return
	}
	if env.Kind != envelope.Spawn && env.Kind != envelope.Stop && env.Kind != envelope.Trace {
		b.refuse(d, q, env, Refuse(ReasonMisrouted, "kind %s is not a control request", env.Kind), true)
		return
	}
	if env.Recipient.Host != b.cfg.Host {
		b.refuse(d, q, env, Refuse(ReasonMisrouted, "a request for host %q in the control queue of %q", env.Recipient.Host, b.cfg.Host), true)
		return
	}
	// a redelivery after a failed ack is answered from the handler's record
	b.hand(d, q, env, b.control, "control request failed", 500*time.Millisecond)
}
