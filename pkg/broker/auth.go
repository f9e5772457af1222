package broker

import (
	"encoding/base64"
	"errors"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Across hosts, identity comes from the key (design decision 6): every
// gateway signs the exact bytes it publishes with its Ed25519 key
// (header fleet-sig) and names itself (header fleet-host); the receiver
// checks both before anything is taken in.

// Signer signs the bytes of a published body.
type Signer func(body []byte) []byte

// Verifier checks that body, signed by host, is authentic and that env's
// claims fit the signing host. A nil error admits the message.
type Verifier func(host string, body, sig []byte, env *envelope.Envelope) error

// SetAuth sets the signer and the verifier; call before Run.
func (b *Broker) SetAuth(sign Signer, verify Verifier) { b.sign, b.verify = sign, verify }

// signHeaders adds the signature headers to msg.
func (b *Broker) signHeaders(msg *amqp.Publishing) {
	if b.sign == nil {
		return
	}
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	msg.Headers["fleet-host"] = b.cfg.Host
	msg.Headers["fleet-sig"] = base64.StdEncoding.EncodeToString(b.sign(msg.Body))
}

// ErrUnsigned is what a verifier returns for a message without the
// signature headers.
var ErrUnsigned = errors.New("unsigned: no fleet-host or fleet-sig header")

// authentic checks a delivery's signature and claims. An unsigned one
// reaches the verifier with an empty host and signature: whether that is
// admitted (no trust file yet) is the verifier's call.
func (b *Broker) authentic(d amqp.Delivery, env *envelope.Envelope) error {
	if b.verify == nil {
		return nil
	}
	host, _ := d.Headers["fleet-host"].(string)
	s, _ := d.Headers["fleet-sig"].(string)
	sig, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return errors.New("malformed fleet-sig header")
	}
	return b.verify(host, d.Body, sig, env)
}
