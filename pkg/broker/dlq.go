package broker

import (
	"errors"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// bridge.dlq as an operator sees it (fleet-dlq), with an operator's login
// (fleet-gw broker-setup --operator NAME): read, and remove what was
// replayed or purged. Reading leaves every message in its place: the walk
// consumes them unacknowledged and closes its channel, and RabbitMQ puts
// requeued messages back where they were in a classic queue. (On a quorum
// bridge.dlq each walk counts as a delivery attempt: RabbitMQ 3.10 sets no
// delivery limit, and none is set on it; 4.x sets 20 by default.)

// DLQMessage is one dead letter in bridge.dlq, as the broker holds it.
type DLQMessage struct {
	MessageID string
	Type      string
	Timestamp time.Time
	Headers   amqp.Table
	Body      []byte
}

// DLQ is an open operator connection.
type DLQ struct {
	conn *amqp.Connection
}

// OpenDLQ connects to the broker at url (one node) with the TLS files in
// tlsFiles (CAFile, CertFile, KeyFile; the rest is ignored).
//
//	fault.Unavailable (69)  the broker cannot be reached
//	fault.Refused (77)      the broker refused the login
func OpenDLQ(url string, tlsFiles Config) (*DLQ, error) {
	b := &Broker{cfg: tlsFiles}
	tc, err := b.tlsConfig(url)
	if err != nil {
		return nil, fault.Wrap(fault.Usage, fault.KindBadConfig, err, "operator broker URI")
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("fleet-dlq")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(dialTimeout), TLSClientConfig: tc, Properties: props, Locale: "en_US"})
	if err != nil {
		if loginRefused(err) {
			return nil, fault.Wrap(fault.Refused, fault.KindBrokerLogin, err, "the broker refused the operator login at %s", Redact(url)).
				WithHint("make one with: fleet-gw broker-setup --operator NAME")
		}
		return nil, fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "broker unreachable at %s", Redact(url))
	}
	return &DLQ{conn: conn}, nil
}

// Close closes the connection.
func (q *DLQ) Close() error { return q.conn.Close() }

// Walk visits the messages of bridge.dlq in order. visit returns whether
// to remove the message (acked: gone for good); every other one goes back
// in its place when the walk ends. Messages that arrive during the walk
// wait for the next one.
func (q *DLQ) Walk(visit func(m *DLQMessage) (remove bool, err error)) error {
	ch, err := q.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close() // what was not acked goes back
	st, err := ch.QueueDeclarePassive(QDLQ, true, false, false, false, nil)
	if err != nil {
		return fault.Wrap(fault.Unavailable, fault.KindBrokerRefused, err, "bridge.dlq is not on the broker").
			WithHint("make the fleet's topology with: fleet-gw broker-setup")
	}
	if st.Messages == 0 {
		return nil
	}
	// no prefetch limit: every message must be held unacked at once to
	// see them all without taking any
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	d, err := ch.Consume(QDLQ, "fleet-dlq", false, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return fault.Wrap(fault.Refused, fault.KindBrokerLogin, err, "this login may not read bridge.dlq").
				WithHint("use an operator login: fleet-gw broker-setup --operator NAME")
		}
		return err
	}
	for seen := 0; seen < st.Messages; seen++ {
		var m amqp.Delivery
		var ok bool
		select {
		case m, ok = <-d:
		case <-time.After(2 * time.Second):
			return nil // fewer than counted: some were taken meanwhile
		}
		if !ok {
			// the channel closed under the walk (consumer_timeout, the
			// connection lost): what was seen is not all there is
			if ce := <-closed; ce != nil {
				return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, ce, "bridge.dlq read cut short after %d of %d messages", seen, st.Messages)
			}
			return fault.New(fault.Unavailable, fault.KindBrokerDown, "bridge.dlq read cut short after %d of %d messages", seen, st.Messages)
		}
		remove, err := visit(&DLQMessage{MessageID: m.MessageId, Type: m.Type, Timestamp: m.Timestamp, Headers: m.Headers, Body: m.Body})
		if remove {
			if aerr := m.Ack(false); aerr != nil && err == nil {
				err = aerr
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
