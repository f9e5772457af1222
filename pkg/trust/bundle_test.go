package trust

import (
	"crypto/ed25519"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func testBundle(t *testing.T, op *Operator, host string) Bundle {
	t.Helper()
	_, hk, _ := ed25519.GenerateKey(nil)
	req, err := MakeRequest(host, hk)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Certify(op.Key, r, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return Bundle{Host: host, Cert: c.Raw, Broker: "amqps://fleet-gw-" + host + ":pw@broker:5671/fleet"}
}

func TestBundle(t *testing.T) {
	_, k, _ := ed25519.GenerateKey(nil)
	op := &Operator{Name: "ops", Key: k}
	raw, err := MakeBundle(op, testBundle(t, op, "b1"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(raw, BundlePrefix+".") || strings.ContainsAny(raw, " \n") {
		t.Fatalf("bundle %q is not one line of its kind", raw)
	}
	b, err := ParseBundle(raw)
	if err != nil {
		t.Fatal(err)
	}
	if b.Host != "b1" || b.Operator != op.Line() || b.OperatorName != "ops" || !b.OperatorKey().Equal(k.Public()) {
		t.Fatalf("bundle read back as %+v", b)
	}
	// the operator's private key is nowhere in it
	payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(raw, ".")[1])
	if strings.Contains(string(payload), base64.StdEncoding.EncodeToString(k.Seed())) {
		t.Fatal("the bundle carries the operator's private key")
	}

	// tampered: the broker URI changed, the signature kept
	parts := strings.Split(raw, ".")
	altered := strings.Replace(string(payload), "broker:5671", "evil:5671", 1)
	bad := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(altered)) + "." + parts[2]
	if _, err := ParseBundle(bad); err == nil || !strings.Contains(err.Error(), "altered") {
		t.Fatalf("a tampered bundle: %v", err)
	}
	// re-signed by another operator, the certificate kept: refused
	_, k2, _ := ed25519.GenerateKey(nil)
	other := &Operator{Name: "ops", Key: k2}
	if _, err := MakeBundle(other, testBundle(t, op, "b1")); err == nil {
		t.Fatal("a bundle of another operator's certificate was made")
	}
	// a certificate of another host
	tb := testBundle(t, op, "b2")
	tb.Host = "b1"
	if _, err := MakeBundle(op, tb); err == nil || !strings.Contains(err.Error(), "for host b2, not b1") {
		t.Fatalf("a bundle for b1 with b2's certificate: %v", err)
	}
	// no login, or TLS files that are not PEM
	tb = testBundle(t, op, "b1")
	tb.Broker = "amqps://broker:5671/fleet"
	if _, err := MakeBundle(op, tb); err == nil || !strings.Contains(err.Error(), "no login") {
		t.Fatalf("a bundle with no login: %v", err)
	}
	tb = testBundle(t, op, "b1")
	tb.CA = "not pem"
	if _, err := MakeBundle(op, tb); err == nil || !strings.Contains(err.Error(), "ca is not a PEM") {
		t.Fatalf("a bundle with a bad CA: %v", err)
	}
}
