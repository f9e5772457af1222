package gateway

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/trust"
)

// certRig is host h2's admission with an operator in its trust file (and
// h1 by a line), and the operator's key to certify and revoke with.
type certRig struct {
	t    *testing.T
	dir  string // h2's state folder
	a    *admission
	op   ed25519.PrivateKey
	h1   ed25519.PrivateKey
	log  *bytes.Buffer
	list *trust.Revocations
}

func newCertRig(t *testing.T) *certRig {
	dir := t.TempDir()
	_, op, _ := ed25519.GenerateKey(nil)
	_, h1, _ := ed25519.GenerateKey(nil)
	path := filepath.Join(dir, "trust")
	for _, e := range []trust.Entry{
		{Host: "h1", Key: base64.StdEncoding.EncodeToString(h1.Public().(ed25519.PublicKey))},
		{Operator: "ops", Key: base64.StdEncoding.EncodeToString(op.Public().(ed25519.PublicKey))},
	} {
		if _, err := trust.Add(path, e); err != nil {
			t.Fatal(err)
		}
	}
	r := &certRig{t: t, dir: dir, op: op, h1: h1, log: &bytes.Buffer{}}
	r.restart()
	return r
}

// restart makes h2's admission afresh from its state folder, as a
// restarted gateway does.
func (r *certRig) restart() {
	own, _, _ := ed25519.GenerateKey(nil)
	file, memo := trust.Open(filepath.Join(r.dir, "trust")), newVerified(16)
	log := slog.New(slog.NewJSONHandler(r.log, nil))
	r.a = &admission{host: "h2", own: own, file: file, memo: memo,
		certs:       newCerts(r.dir, "h2", own, file, memo, log),
		dedupWindow: time.Hour, presenceTTL: 15 * time.Second, untrusted: map[string]time.Time{}}
}

// certify makes host a key and the operator's certificate for it.
func (r *certRig) certify(host string, op ed25519.PrivateKey) (ed25519.PrivateKey, *trust.Cert) {
	_, key, _ := ed25519.GenerateKey(nil)
	req, err := trust.MakeRequest(host, key)
	if err != nil {
		r.t.Fatal(err)
	}
	q, err := trust.ParseRequest(req)
	if err != nil {
		r.t.Fatal(err)
	}
	c, err := trust.Certify(op, q, time.Hour)
	if err != nil {
		r.t.Fatal(err)
	}
	return key, c
}

// revoke signs the operator's next list revoking hosts.
func (r *certRig) revoke(hosts ...string) *trust.Revocations {
	l, err := trust.Revoke(r.op, r.list, hosts)
	if err != nil {
		r.t.Fatal(err)
	}
	r.list = l
	return l
}

// presence is a presence message of host carrying cert (and lists),
// signed by key.
func presenceFrom(t *testing.T, host string, key ed25519.PrivateKey, cert string, lists ...string) (*envelope.Envelope, []byte, []byte) {
	body, _ := json.Marshal(presenceBody{Host: host, Seq: time.Now().UnixNano(), IntervalMS: 5000,
		Snapshot: &snapshotPage{ID: 1, Pages: 1, Rows: []json.RawMessage{}}, Cert: cert, Revoked: lists})
	env := envelope.New(envelope.Presence, envelope.Party{Host: host}, envelope.Party{Group: "roster"}, string(body))
	b, s := signed(t, key, env)
	return env, b, s
}

// certReason is an admission's outcome: its refusal reason, or admitted.
func certReason(err error) string {
	if err == nil {
		return "admitted"
	}
	return reasonOf(err)
}

// A host with no line here is admitted by the certificate its presence
// carries; the certificate is kept, so its other messages — and after a
// restart, all of them — are admitted without it.
func TestCertAdmitsHostWithoutLine(t *testing.T) {
	r := newCertRig(t)
	h4, cert := r.certify("h4", r.op)
	send := sendFrom("h4")
	b, s := signed(t, h4, send)
	if got := certReason(r.a.check("h4", b, s, send)); got != broker.ReasonUntrusted {
		t.Fatalf("a send of h4 before any certificate was heard: %s", got)
	}
	env, pb, ps := presenceFrom(t, "h4", h4, cert.Raw)
	if err := r.a.check("h4", pb, ps, env); err != nil {
		t.Fatalf("presence with a valid certificate refused: %v", err)
	}
	if err := r.a.check("h4", b, s, send); err != nil {
		t.Fatalf("a send of h4 after its certificate was heard refused: %v", err)
	}
	if !r.a.trusted("h4") || !r.a.trustedNow()("h4") || len(r.a.trustedHosts()) != 2 {
		t.Fatalf("h4 not trusted: %v %v", r.a.trusted("h4"), r.a.trustedHosts())
	}
	st, err := os.Stat(filepath.Join(r.dir, "certs", "h4.cert"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("kept certificate: %v, %v", st, err)
	}
	r.restart()
	if err := r.a.check("h4", b, s, send); err != nil {
		t.Fatalf("after a restart, a send of h4 refused: %v", err)
	}
	// its certificate does not lend its name to another key
	_, thief, _ := ed25519.GenerateKey(nil)
	env, pb, ps = presenceFrom(t, "h4", thief, cert.Raw)
	if got := certReason(r.a.check("h4", pb, ps, env)); got != broker.ReasonForged {
		t.Fatalf("h4's certificate presented by another key: %s", got)
	}
}

// What a certificate must be to admit: its operator trusted here, for the
// host that signs, the newest of that host's.
func TestCertRefusals(t *testing.T) {
	r := newCertRig(t)
	_, stranger, _ := ed25519.GenerateKey(nil)
	h4, foreign := r.certify("h4", stranger)
	env, b, s := presenceFrom(t, "h4", h4, foreign.Raw)
	if got := certReason(r.a.check("h4", b, s, env)); got != broker.ReasonUntrusted {
		t.Fatalf("a certificate of an operator not trusted: %s", got)
	}
	h5, c5 := r.certify("h5", r.op)
	env, b, s = presenceFrom(t, "h4", h5, c5.Raw)
	if got := certReason(r.a.check("h4", b, s, env)); got != broker.ReasonWrongHost {
		t.Fatalf("h5's certificate presented by h4: %s", got)
	}
	env, b, s = presenceFrom(t, "h4", h4, "fleet-cert-v1.e30.AAAA")
	if got := certReason(r.a.check("h4", b, s, env)); got != broker.ReasonMalformed {
		t.Fatalf("a certificate that does not read: %s", got)
	}
	// superseded: h4 enrolled again with a new key; the old certificate
	// (and so the old key) no longer speaks for it
	old, oldCert := r.certify("h4", r.op)
	time.Sleep(time.Millisecond)
	cur, curCert := r.certify("h4", r.op)
	env, b, s = presenceFrom(t, "h4", cur, curCert.Raw)
	if err := r.a.check("h4", b, s, env); err != nil {
		t.Fatal(err)
	}
	env, b, s = presenceFrom(t, "h4", old, oldCert.Raw)
	if got := certReason(r.a.check("h4", b, s, env)); got != broker.ReasonUntrusted {
		t.Fatalf("an older certificate after a newer one: %s", got)
	}
	// the operator removed from the trust file: its hosts are refused
	if _, err := trust.RemoveOperator(filepath.Join(r.dir, "trust"), "ops"); err != nil {
		t.Fatal(err)
	}
	send := sendFrom("h4")
	b, s = signed(t, cur, send)
	if got := certReason(r.a.check("h4", b, s, send)); got != broker.ReasonUntrusted || r.a.trusted("h4") {
		t.Fatalf("h4 after its operator was removed: %s", got)
	}
}

// A revocation list heard from any admitted peer refuses the revoked host
// from then on, is kept, and holds after a restart; a host certified
// again after it is admitted; a trust line is not affected.
func TestCertRevocation(t *testing.T) {
	r := newCertRig(t)
	h4, cert := r.certify("h4", r.op)
	env, b, s := presenceFrom(t, "h4", h4, cert.Raw)
	if err := r.a.check("h4", b, s, env); err != nil {
		t.Fatal(err)
	}
	send := sendFrom("h4")
	sb, ss := signed(t, h4, send)
	// a list of an operator not trusted here is not taken
	_, stranger, _ := ed25519.GenerateKey(nil)
	foreign, _ := trust.Revoke(stranger, nil, []string{"h4"})
	r.a.certs.Hear([]string{foreign.Raw}, "h1")
	if err := r.a.check("h4", sb, ss, send); err != nil {
		t.Fatalf("another operator's list revoked h4: %v", err)
	}
	l := r.revoke("h4", "h1")
	r.a.certs.Hear([]string{l.Raw}, "h1")
	if got := certReason(r.a.check("h4", sb, ss, send)); got != broker.ReasonUntrusted || r.a.trusted("h4") {
		t.Fatalf("h4 after its revocation: %s", got)
	}
	// its own presence, certificate and all, is refused too
	env, b, s = presenceFrom(t, "h4", h4, cert.Raw)
	if got := certReason(r.a.check("h4", b, s, env)); got != broker.ReasonUntrusted {
		t.Fatalf("h4's presence after its revocation: %s", got)
	}
	// h1 has a line: the local decision stands
	s1 := sendFrom("h1")
	b1, sg1 := signed(t, r.h1, s1)
	if err := r.a.check("h1", b1, sg1, s1); err != nil {
		t.Fatalf("h1, trusted by its line, refused: %v", err)
	}
	// an older list does not undo it; the list is carried on
	older, _ := trust.Revoke(r.op, nil, []string{"h9"})
	r.a.certs.Hear([]string{older.Raw}, "h1")
	if _, lists := r.a.certs.Present(); len(lists) != 1 || lists[0] != l.Raw {
		t.Fatalf("lists carried: %v", lists)
	}
	r.restart()
	if got := certReason(r.a.check("h4", sb, ss, send)); got != broker.ReasonUntrusted {
		t.Fatalf("h4 after a restart: %s", got)
	}
	// enrolled again after its revocation: admitted
	time.Sleep(time.Millisecond)
	h4b, again := r.certify("h4", r.op)
	env, b, s = presenceFrom(t, "h4", h4b, again.Raw)
	if err := r.a.check("h4", b, s, env); err != nil {
		t.Fatalf("h4 certified again after its revocation: %v", err)
	}
}

// A list imported into the state folder is read at the next Refresh, as
// is this host's own certificate (which must be for this host's key).
func TestCertRefreshReadsImports(t *testing.T) {
	r := newCertRig(t)
	h4, cert := r.certify("h4", r.op)
	env, b, s := presenceFrom(t, "h4", h4, cert.Raw)
	if err := r.a.check("h4", b, s, env); err != nil {
		t.Fatal(err)
	}
	if err := trust.SaveRevocations(r.dir, r.revoke("h4")); err != nil {
		t.Fatal(err)
	}
	r.a.certs.Refresh()
	if r.a.trusted("h4") {
		t.Fatal("h4 trusted after a list revoking it was imported")
	}
	// a certificate of another key is not presented
	_, other := r.certify("h2", r.op)
	if err := os.WriteFile(trust.HostCertPath(r.dir), []byte(other.Raw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.a.certs.Refresh()
	if mine, _ := r.a.certs.Present(); mine != "" {
		t.Fatal("a certificate of another key was presented")
	}
	if !bytes.Contains(r.log.Bytes(), []byte("not for this host and its key")) {
		t.Fatalf("not said:\n%s", r.log)
	}
}
