package trust

import (
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	fseal "github.com/fleetd/fleet/pkg/seal"
)

// sealKey is a real age X25519 public key, as pkg/seal makes them.
func sealKey(t *testing.T) string {
	t.Helper()
	k, err := fseal.LoadKeyring(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return k.Public().String()
}

// A host's line carries its sealing key; a line of before (HOST KEY) is
// still read, as a host that announces none; an operator's line is never
// taken for a host's, nor a host's for an operator's.
func TestSealKeyLines(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	sk := sealKey(t)
	e, err := ParseLine(SealedLine("h1", pub, sk))
	if err != nil || e.Host != "h1" || e.SealKey != sk || !e.Sealing() || e.String() != SealedLine("h1", pub, sk) {
		t.Fatalf("sealed line: %+v %v", e, err)
	}
	old, err := ParseLine(Line("h2", pub))
	if err != nil || old.SealKey != "" || old.Sealing() || old.String() != Line("h2", pub) {
		t.Fatalf("a line without a sealing key: %+v %v", old, err)
	}
	// a host named "operator" may announce a sealing key
	if e, err := ParseLine(SealedLine("operator", pub, sk)); err != nil || e.Host != "operator" || e.Operator != "" || e.SealKey != sk {
		t.Fatalf("host operator: %+v %v", e, err)
	}
	op := "operator ops " + Line("x", pub)[2:]
	if e, err := ParseLine(op); err != nil || e.Operator != "ops" || e.SealKey != "" {
		t.Fatalf("operator line: %+v %v", e, err)
	}
	key := Line("x", pub)[2:]
	for _, bad := range []string{
		"h1 " + key + " " + key,                 // a signing key where the sealing key goes
		"h1 " + key + " " + typo(sk),            // a typo: the checksum fails
		"h1 " + key + " " + strings.ToUpper(sk), // upper case is Bech32 but not a trust line's
		"h1 " + key + " " + "age1" + sk[4:20],   // cut short
		"h1 " + key + " " + sk + " " + sk,       // four fields
		"h1 " + sk + " " + key,                  // swapped
	} {
		if e, err := ParseLine(bad); err == nil {
			t.Errorf("%q accepted: %+v", bad, e)
		}
	}
	// only the sealing key changed: the file changes, and a running
	// reader sees it; a line of before (re-added) means no sealing key
	path := filepath.Join(t.TempDir(), "trust")
	f := Open(path)
	if changed, err := Add(path, e); err != nil || !changed {
		t.Fatal(changed, err)
	}
	if k, ok := f.SealKey("h1"); !ok || k != sk {
		t.Fatalf("SealKey %q %v", k, ok)
	}
	e2 := e
	e2.SealKey = sealKey(t)
	if changed, err := Add(path, e2); err != nil || !changed {
		t.Fatalf("a new sealing key did not change the file: %v", err)
	}
	if k, _ := f.SealKey("h1"); k != e2.SealKey {
		t.Fatalf("SealKey %q after the change", k)
	}
	if changed, _ := Add(path, e2); changed {
		t.Fatal("the same line again changed the file")
	}
	if _, err := Add(path, old); err != nil {
		t.Fatal(err)
	}
	if k, ok := f.SealKey("h2"); ok {
		t.Fatalf("h2 announces no sealing key, got %q", k)
	}
	if _, ok := f.Key("h2"); !ok {
		t.Fatal("h2 is trusted all the same")
	}
	if _, ok := f.SealKey("h9"); ok {
		t.Fatal("an untrusted host has a sealing key")
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "\n"+e2.String()+"\n") || !strings.Contains(string(data), "\n"+old.String()+"\n") {
		t.Fatalf("file:\n%s", data)
	}
}

// A host's certificate binds its sealing key as it binds its signing key;
// one made before sealing keys (no seal_key) still verifies, and its
// host announces none. Altering the sealing key voids the signature.
func TestSealKeyCert(t *testing.T) {
	_, host, _ := ed25519.GenerateKey(nil)
	_, op, _ := ed25519.GenerateKey(nil)
	sk := sealKey(t)
	req, err := MakeSealedRequest("h4", host, sk)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRequest(req)
	if err != nil || r.SealKey != sk {
		t.Fatalf("request %+v %v", r, err)
	}
	c, err := Certify(op, r, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseCert(c.Raw)
	if err != nil || !again.Verify() || again.SealKey != sk {
		t.Fatalf("certificate %+v %v", again, err)
	}
	// another sealing key in the payload: the operator's signature fails
	parts := strings.Split(c.Raw, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	other := sealKey(t)
	forged := strings.Replace(string(payload), sk, other, 1)
	raw := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + parts[2]
	if f, err := ParseCert(raw); err != nil || f.SealKey != other || f.Verify() {
		t.Fatalf("a certificate with another sealing key: %v (verifies: %v)", err, err == nil && f.Verify())
	}
	// a certificate of before: no seal_key in its payload at all
	oldReq, err := MakeRequest("h5", host)
	if err != nil {
		t.Fatal(err)
	}
	or, _ := ParseRequest(oldReq)
	oc, err := Certify(op, or, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := base64.RawURLEncoding.DecodeString(strings.Split(oc.Raw, ".")[1])
	if strings.Contains(string(p), "seal_key") {
		t.Fatalf("an old certificate's payload names a sealing key: %s", p)
	}
	if back, err := ParseCert(oc.Raw); err != nil || !back.Verify() || back.SealKey != "" {
		t.Fatalf("an old certificate: %+v %v", back, err)
	}
	// a request naming a key that is not a sealing key is refused
	if _, err := MakeSealedRequest("h4", host, base64.StdEncoding.EncodeToString(make([]byte, 32))); err == nil {
		t.Fatal("a base64 sealing key was taken")
	}
}

// typo changes the last character of s to another of Bech32's.
func typo(s string) string {
	if s[len(s)-1] == 'q' {
		return s[:len(s)-1] + "p"
	}
	return s[:len(s)-1] + "q"
}
