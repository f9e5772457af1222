package trust

import (
	"crypto/ed25519"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCertRoundTrip(t *testing.T) {
	_, host, _ := ed25519.GenerateKey(nil)
	_, op, _ := ed25519.GenerateKey(nil)
	req, err := MakeRequest("h4", host)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(req, RequestPrefix+".") || strings.ContainsAny(req, " \n") {
		t.Fatalf("request %q is not one line of its kind", req)
	}
	r, err := ParseRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Certify(op, r, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseCert(c.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Verify() || again.Host != "h4" || !again.PublicKey().Equal(host.Public()) || !again.OperatorKey().Equal(op.Public()) {
		t.Fatalf("certificate read back as %+v", again)
	}
	if why := again.Current(time.Now()); why != "" {
		t.Fatalf("a fresh certificate is %s", why)
	}
	if why := again.Current(time.Now().Add(25 * time.Hour)); !strings.HasPrefix(why, "expired") {
		t.Fatalf("a day later: %q", why)
	}
	if _, err := Certify(op, r, MaxCertLife+time.Hour); err == nil {
		t.Fatal("a certificate longer than MaxCertLife was made")
	}
}

// TestCertTampered: every byte of a certificate, request or list is bound
// by its signature, and the kinds cannot stand in for each other.
func TestCertTampered(t *testing.T) {
	_, host, _ := ed25519.GenerateKey(nil)
	_, op, _ := ed25519.GenerateKey(nil)
	req, _ := MakeRequest("h4", host)
	r, _ := ParseRequest(req)
	c, _ := Certify(op, r, time.Hour)
	parts := strings.Split(c.Raw, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := strings.Replace(string(payload), `"host":"h4"`, `"host":"h5"`, 1)
	raw := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + parts[2]
	f, err := ParseCert(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f.Verify() {
		t.Fatal("a certificate with its host changed verified")
	}
	// a request's signature made by the host is not a certificate
	rp := strings.Split(req, ".")
	if _, err := ParseCert(CertPrefix + "." + rp[1] + "." + rp[2]); err == nil {
		t.Fatal("a request read as a certificate")
	}
	// an unknown field is refused, not ignored
	extra := strings.Replace(string(payload), `{"v":1,`, `{"v":1,"admin":true,`, 1)
	if _, err := ParseCert(parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(extra)) + "." + parts[2]); err == nil {
		t.Fatal("an unknown field was accepted")
	}
	// a request whose key is not the signer's
	_, other, _ := ed25519.GenerateKey(nil)
	rq := Request{V: 1, Host: "h4", Key: base64.StdEncoding.EncodeToString(host.Public().(ed25519.PublicKey)), Made: time.Now()}
	bad, _ := seal(RequestPrefix, other, rq)
	if _, err := ParseRequest(bad); err == nil {
		t.Fatal("a request signed by another key than its own was accepted")
	}
}

func TestRevocations(t *testing.T) {
	_, op, _ := ed25519.GenerateKey(nil)
	_, host, _ := ed25519.GenerateKey(nil)
	req, _ := MakeRequest("h4", host)
	r, _ := ParseRequest(req)
	c, _ := Certify(op, r, time.Hour)
	l1, err := Revoke(op, nil, []string{"h4"})
	if err != nil {
		t.Fatal(err)
	}
	if l1.Serial != 1 || !l1.Verify() || !l1.Voids(c) {
		t.Fatalf("list 1 = %+v", l1)
	}
	// certified again after the revocation: valid
	time.Sleep(time.Millisecond)
	c2, _ := Certify(op, r, time.Hour)
	if l1.Voids(c2) {
		t.Fatal("a certificate issued after the revocation is void")
	}
	l2, err := Revoke(op, l1, []string{"h7"})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Serial != 2 || !l2.Voids(c) || len(l2.Hosts) != 2 {
		t.Fatalf("list 2 = %+v", l2)
	}
	// another operator's list voids nothing of this one's
	_, op2, _ := ed25519.GenerateKey(nil)
	l3, _ := Revoke(op2, nil, []string{"h4"})
	if l3.Voids(c) {
		t.Fatal("another operator's list voided a certificate")
	}
	if _, err := Revoke(op2, l2, nil); err == nil {
		t.Fatal("a list continued another operator's")
	}
	dir := t.TempDir()
	if err := SaveRevocations(dir, l1); err != nil {
		t.Fatal(err)
	}
	if err := SaveRevocations(dir, l2); err != nil {
		t.Fatal(err)
	}
	got, errs := LoadRevocations(dir)
	if len(errs) > 0 || got[l2.Operator].Serial != 2 {
		t.Fatalf("loaded %+v, %v", got, errs)
	}
	st, _ := os.Stat(filepath.Join(dir, "revoked", KeyID(l2.OperatorKey())+".list"))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("list mode %v", st.Mode())
	}
}

func TestOperatorKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "op.key")
	o, err := NewOperator(path, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewOperator(path, "ops"); err == nil {
		t.Fatal("an operator key was written over")
	}
	back, err := ReadOperator(path)
	if err != nil || back.Name != "ops" || !back.Key.Equal(o.Key) {
		t.Fatalf("read back %+v, %v", back, err)
	}
	e, err := ParseLine(o.Line())
	if err != nil || e.Operator != "ops" {
		t.Fatalf("operator line %q: %+v, %v", o.Line(), e, err)
	}
	// never in a gateway's state folder: named, or found by its host key
	state := filepath.Join(dir, "state")
	if _, err := HostKey(state); err != nil {
		t.Fatal(err)
	}
	if _, err := NewOperator(filepath.Join(state, "op.key"), "ops"); err == nil {
		t.Fatal("an operator key was written into a state folder holding host.key")
	}
	if _, err := NewOperator(filepath.Join(dir, "cfg", "op.key"), "ops", filepath.Join(dir, "cfg")); err == nil {
		t.Fatal("an operator key was written into the configured state folder")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadOperator(path); err == nil {
		t.Fatal("an operator key others may read was used")
	}
}

func TestTrustFileOperators(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trust")
	_, op, _ := ed25519.GenerateKey(nil)
	key := base64.StdEncoding.EncodeToString(op.Public().(ed25519.PublicKey))
	if _, err := Add(path, Entry{Host: "h1", Key: key}); err != nil {
		t.Fatal(err)
	}
	e, err := ParseLine("operator ops " + key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Add(path, e); err != nil {
		t.Fatal(err)
	}
	// a host called operator is still a host line
	if e, err := ParseLine("operator " + key); err != nil || e.Host != "operator" {
		t.Fatalf("host operator: %+v, %v", e, err)
	}
	f := Open(path)
	keys, err := f.Keys()
	if err != nil || len(keys) != 1 || keys["h1"] == nil {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if ops := f.Operators(); ops[key] != "ops" {
		t.Fatalf("operators %v", ops)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "\nh1 "+key+"\noperator ops "+key+"\n") {
		t.Fatalf("file:\n%s", data)
	}
	if was, err := RemoveOperator(path, "ops"); err != nil || !was {
		t.Fatal(was, err)
	}
	if ops := f.Operators(); len(ops) != 0 {
		t.Fatalf("operators after removal %v", ops)
	}
}
