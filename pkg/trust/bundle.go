package trust

import (
	"bytes"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// A join bundle is everything a new host needs to join a fleet, in one
// line the operator makes (fleet-gw operator bundle) and the host installs
// (fleet-gw join):
//
//	fleet-bundle-v1.PAYLOAD.SIG   signed by the operator key
//
// It holds the host's certificate, the operator's PUBLIC trust line
// (operator NAME KEY: never the operator's private key), the host's broker
// URI with its login and password, and the TLS files its broker
// connection needs. It is a secret (the broker password, the client key):
// the operator writes it 0600 or prints it once.
//
// What the signature proves: the bundle was not altered after the holder
// of the operator key it names made it, and the certificate inside is that
// operator's. It cannot prove that operator is the right one: on first use
// the host takes the operator from the bundle (trust on first use); a host
// that already trusts operators takes a bundle of one of them only.
const BundlePrefix = "fleet-bundle-v1"

// maxBundleBytes bounds a bundle (three PEM files and a few lines).
const maxBundleBytes = 256 << 10

// Bundle is a join bundle's content.
type Bundle struct {
	V          int       `json:"v"`
	Host       string    `json:"host"`
	Cert       string    `json:"cert"`     // the host's certificate line
	Operator   string    `json:"operator"` // the operator's trust line: operator NAME KEY (public)
	Broker     string    `json:"broker"`   // amqp(s):// URI with the host's own login
	CA         string    `json:"ca,omitempty"`
	ClientCert string    `json:"client_cert,omitempty"`
	ClientKey  string    `json:"client_key,omitempty"`
	Made       time.Time `json:"made"`

	// Parsed is the certificate, checked.
	Parsed *Cert `json:"-"`
	// OperatorName is the operator's name in the trust line.
	OperatorName string `json:"-"`
}

// MakeBundle checks b and signs it with the operator key.
func MakeBundle(op *Operator, b Bundle) (string, error) {
	b.V, b.Operator = 1, op.Line()
	b.Made = time.Now().UTC().Truncate(time.Second)
	if err := b.check(); err != nil {
		return "", err
	}
	if !bytes.Equal(b.Parsed.OperatorKey(), op.Key.Public().(ed25519.PublicKey)) {
		return "", errors.New("the certificate is not this operator key's")
	}
	return seal(BundlePrefix, op.Key, b)
}

// ParseBundle reads a bundle and checks it whole: its form, its
// certificate, and the signature of the operator it names.
func ParseBundle(s string) (*Bundle, error) {
	var b Bundle
	signed, sig, err := open("join bundle", BundlePrefix, s, maxBundleBytes, &b)
	if err != nil {
		return nil, err
	}
	if b.V != 1 {
		return nil, fmt.Errorf("join bundle version %d (this fleet reads 1)", b.V)
	}
	if err := b.check(); err != nil {
		return nil, err
	}
	if !ed25519.Verify(b.Parsed.OperatorKey(), signed, sig) {
		return nil, errors.New("join bundle: its signature is not its operator's (altered)")
	}
	return &b, nil
}

// OperatorKey is the operator's public key.
func (b *Bundle) OperatorKey() ed25519.PublicKey { return b.Parsed.OperatorKey() }

func (b *Bundle) check() error {
	if !HostRE.MatchString(b.Host) {
		return fmt.Errorf("join bundle: %q is not a host id", b.Host)
	}
	e, err := ParseLine(b.Operator)
	if err != nil || e.Operator == "" {
		return fmt.Errorf("join bundle: %q is not an operator trust line", b.Operator)
	}
	b.OperatorName = e.Operator
	c, err := ParseCert(b.Cert)
	if err != nil {
		return fmt.Errorf("join bundle: %v", err)
	}
	switch {
	case c.Host != b.Host:
		return fmt.Errorf("join bundle: its certificate is for host %s, not %s", c.Host, b.Host)
	case c.Operator != e.Key:
		return errors.New("join bundle: its certificate is not by its operator")
	case !c.Verify():
		return errors.New("join bundle: the certificate's signature is not its operator's (altered)")
	}
	b.Parsed = c
	u, err := url.Parse(b.Broker)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" || strings.Contains(b.Broker, ",") {
		return errors.New("join bundle: the broker is not one amqp:// or amqps:// URI")
	}
	if u.User == nil || u.User.Username() == "" {
		return errors.New("join bundle: the broker URI has no login (make it with fleet-gw broker-setup --output FILE)")
	}
	for _, f := range []struct{ what, pem, want string }{
		{"ca", b.CA, "CERTIFICATE"}, {"client_cert", b.ClientCert, "CERTIFICATE"}, {"client_key", b.ClientKey, "PRIVATE KEY"}} {
		if f.pem == "" {
			continue
		}
		blk, _ := pem.Decode([]byte(f.pem))
		if blk == nil || !strings.HasSuffix(blk.Type, f.want) {
			return fmt.Errorf("join bundle: %s is not a PEM %s", f.what, strings.ToLower(f.want))
		}
	}
	if (b.ClientCert == "") != (b.ClientKey == "") {
		return errors.New("join bundle: a client certificate goes with its key")
	}
	if u.Scheme == "amqp" && (b.CA != "" || b.ClientCert != "") {
		return errors.New("join bundle: TLS files for an amqp:// (not amqps://) broker")
	}
	return nil
}

// OperatorID is the short id of the bundle's operator key, for a person to
// compare with the one the operator announced.
func (b *Bundle) OperatorID() string { return KeyID(b.OperatorKey()) }
