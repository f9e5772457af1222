package broker

import (
	"errors"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	amqp "github.com/rabbitmq/amqp091-go"
)

// bridge.dlq as an operator sees it (fleet-dlq), with an operator's login
// (fleet-gw broker-setup --operator NAME): read, and remove what was
// replayed or purged. Reading leaves every message in its place: a read
// consumes them unacknowledged and closes its channel, and RabbitMQ puts
// requeued messages back where they were in a classic queue. (On a quorum
// bridge.dlq each read counts as a delivery attempt: RabbitMQ 3.10 sets no
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
//	fault.Usage (64)        a TLS file that cannot be used, a bad URI
//	fault.Unavailable (69)  the broker cannot be reached (the hint says
//	                        which TLS setting a failed handshake wants)
//	fault.Refused (77)      the broker refused the login
func OpenDLQ(url string, tlsFiles Config) (*DLQ, error) {
	b := &Broker{cfg: tlsFiles}
	if (tlsFiles.CertFile == "") != (tlsFiles.KeyFile == "") {
		return nil, fault.New(fault.Usage, fault.KindBadConfig, "a client certificate needs its key, and a key its certificate").
			WithHint("set both FLEET_BROKER_CERT and FLEET_BROKER_KEY (or --broker-cert and --broker-key)")
	}
	tc, err := b.tlsConfig(url)
	if err != nil {
		return nil, fault.Wrap(fault.Usage, fault.KindBadConfig, err, "operator broker login").
			WithHint("check the files named by FLEET_BROKER_CA, FLEET_BROKER_CERT and FLEET_BROKER_KEY (or --broker-ca, --broker-cert, --broker-key)")
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("fleet-dlq")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(dialTimeout), TLSClientConfig: tc, Properties: props, Locale: "en_US"})
	if err != nil {
		var ae *amqp.Error
		if loginRefused(err) || (errors.As(err, &ae) && ae.Code == amqp.NotAllowed) {
			return nil, fault.Wrap(fault.Refused, fault.KindBrokerLogin, err, "the broker refused the operator login at %s", Redact(url)).
				WithHint("make one with: fleet-gw broker-setup --operator NAME")
		}
		return nil, fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "broker unreachable at %s", Redact(url)).
			WithHint("%s", dialHint(url, tlsFiles, err))
	}
	return &DLQ{conn: conn}, nil
}

// dialHint says what to try when a dial failed: the TLS setting a failed
// handshake points at, else the address.
func dialHint(url string, tlsFiles Config, err error) string {
	msg := err.Error()
	tlsURL := strings.HasPrefix(url, "amqps:")
	switch {
	case strings.Contains(msg, "unknown authority") || strings.Contains(msg, "x509:"):
		return "trust the CA that signs the broker's certificate: FLEET_BROKER_CA=FILE (or --broker-ca)"
	case tlsURL && tlsFiles.CertFile == "" && !strings.Contains(msg, "connection refused") &&
		!strings.Contains(msg, "no such host") && !strings.Contains(msg, "i/o timeout"):
		// the broker got the connection and dropped it: without a client
		// certificate that is the likely cause, however the drop surfaces
		// (a TLS alert, a reset, EOF, or a connection "not open" when
		// TLS 1.3 lets the handshake finish before the server's alert)
		return "the broker may want a client certificate: FLEET_BROKER_CERT=FILE FLEET_BROKER_KEY=FILE (or --broker-cert, --broker-key)"
	case tlsURL && (strings.Contains(msg, "certificate") || strings.Contains(msg, "tls:")):
		return "the broker refused the TLS handshake: check FLEET_BROKER_CERT and FLEET_BROKER_KEY (a certificate its CA signed)"
	case !tlsURL && (strings.Contains(msg, "EOF") || strings.Contains(msg, "reset by peer")):
		return "the port may speak TLS only: use an amqps:// URI"
	}
	return "check that the broker runs at that address and port"
}

// Close closes the connection.
func (q *DLQ) Close() error { return q.conn.Close() }

// DLQRead is bridge.dlq as one read saw it: every message it held when
// the read began, each held unacknowledged until Close puts back what was
// not removed.
type DLQRead struct {
	ch       *amqp.Channel
	Messages []*DLQMessage
	tags     []uint64
	removed  []bool
}

// Read takes every message bridge.dlq holds now, unacknowledged: nothing
// leaves the queue until Remove, and Close puts every other one back in
// its place. Messages that arrive during the read wait for the next one.
//
//	fault.Unavailable (69)  bridge.dlq is missing, or the read was cut short
//	fault.Refused (77)      this login may not read it
func (q *DLQ) Read() (*DLQRead, error) {
	ch, err := q.conn.Channel()
	if err != nil {
		return nil, fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "no channel on the broker")
	}
	r := &DLQRead{ch: ch}
	if err := r.fill(); err != nil {
		ch.Close()
		return nil, err
	}
	return r, nil
}

func (r *DLQRead) fill() error {
	ch := r.ch
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
		return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "bridge.dlq could not be read")
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
			// the channel closed under the read (consumer_timeout, the
			// connection lost): what was seen is not all there is
			if ce := <-closed; ce != nil {
				return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, ce, "bridge.dlq read cut short after %d of %d messages", seen, st.Messages)
			}
			return fault.New(fault.Unavailable, fault.KindBrokerDown, "bridge.dlq read cut short after %d of %d messages", seen, st.Messages)
		}
		r.Messages = append(r.Messages, &DLQMessage{MessageID: m.MessageId, Type: m.Type, Timestamp: m.Timestamp, Headers: m.Headers, Body: m.Body})
		r.tags = append(r.tags, m.DeliveryTag)
		r.removed = append(r.removed, false)
	}
	return nil
}

// Remove takes message i out of bridge.dlq for good (acked); removing one
// twice does nothing.
func (r *DLQRead) Remove(i int) error {
	if r.removed[i] {
		return nil
	}
	if err := r.ch.Ack(r.tags[i], false); err != nil {
		return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "bridge.dlq: a message could not be removed")
	}
	r.removed[i] = true
	return nil
}

// Close ends the read: every message not removed goes back in its place.
func (r *DLQRead) Close() error { return r.ch.Close() }
