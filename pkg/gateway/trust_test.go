package gateway

import (
	"crypto/ed25519"
	"testing"
)

// The verification memo admits only exact repeats of what verified: other
// bytes, another signature or another key are checked afresh and refused.
func TestVerifiedAdmitsOnlyExactRepeats(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	other, _, _ := ed25519.GenerateKey(nil)
	body := []byte(`{"kind":"BROADCAST","body":"to all"}`)
	sig := ed25519.Sign(priv, body)
	v := newVerified(2)
	for i := range 3 {
		if !v.check(pub, body, sig) {
			t.Fatalf("copy %d of a signed broadcast refused", i)
		}
	}
	forged := append([]byte(nil), body...)
	forged[len(forged)-3] = 'X'
	badSig := append([]byte(nil), sig...)
	badSig[0] ^= 1
	for name, c := range map[string]func() bool{
		"altered bytes":     func() bool { return v.check(pub, forged, sig) },
		"altered signature": func() bool { return v.check(pub, body, badSig) },
		"another key":       func() bool { return v.check(other, body, sig) },
	} {
		if c() {
			t.Errorf("%s admitted after the genuine one was remembered", name)
		}
	}
	// evicted entries are verified again, and still pass
	for i := range 4 {
		b := []byte{byte(i)}
		if !v.check(pub, b, ed25519.Sign(priv, b)) {
			t.Fatalf("message %d refused", i)
		}
	}
	if !v.check(pub, body, sig) {
		t.Error("the broadcast, evicted and verified again, refused")
	}
}
