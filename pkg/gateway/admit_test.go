package gateway

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/trust"
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

// testAdmission is an admission for host h2 that trusts h1.
func testAdmission(t testing.TB) (a *admission, h1 ed25519.PrivateKey) {
	dir := t.TempDir()
	_, h1, _ = ed25519.GenerateKey(nil)
	own, _, _ := ed25519.GenerateKey(nil)
	path := filepath.Join(dir, "trust")
	if _, err := trust.Add(path, trust.Entry{Host: "h1", Key: base64.StdEncoding.EncodeToString(h1.Public().(ed25519.PublicKey))}); err != nil {
		t.Fatal(err)
	}
	a = &admission{
		host: "h2", own: own, file: trust.Open(path), memo: newVerified(16),
		dedupWindow: time.Hour, presenceTTL: 15 * time.Second, untrusted: map[string]time.Time{},
	}
	return a, h1
}

func sendFrom(host string) *envelope.Envelope {
	return envelope.New(envelope.Send,
		envelope.Party{Gid: host + ".01a22a93-8b62-7719-997e-dae6eae12382", Name: "alice", Host: host},
		envelope.Party{Gid: "h2.01a22a93-8b62-7719-997e-dae6eae12383", Name: "bob", Host: "h2"}, "hello")
}

func signed(t testing.TB, key ed25519.PrivateKey, env *envelope.Envelope) ([]byte, []byte) {
	body, err := envelope.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	return body, ed25519.Sign(key, body)
}

// Each way a message can fail to prove itself is refused with its reason.
func TestAdmissionRefusesWhatIsNotProven(t *testing.T) {
	a, h1 := testAdmission(t)
	_, stranger, _ := ed25519.GenerateKey(nil)
	reason := func(err error) string {
		var r *broker.Refusal
		if errors.As(err, &r) {
			return r.Reason
		}
		if err != nil {
			return "not a refusal: " + err.Error()
		}
		return "admitted"
	}
	env := sendFrom("h1")
	body, sig := signed(t, h1, env)
	if err := a.check("h1", body, sig, env); err != nil {
		t.Fatalf("a message signed by trusted h1 refused: %v", err)
	}
	spawn := envelope.New(envelope.Spawn, env.Sender, envelope.Party{Host: "h2", Group: "control"},
		`{"name":"carol","profile":"default","groups":["ops","team-2"]}`)
	spawn.Expires = time.Now().Add(time.Minute)
	if b, s := signed(t, h1, spawn); a.check("h1", b, s, spawn) != nil {
		t.Fatalf("a well-formed spawn refused: %v", a.check("h1", b, s, spawn))
	}
	cases := []struct {
		name, want string
		run        func() error
	}{
		{"unsigned", broker.ReasonUnsigned, func() error { return a.check("", body, nil, env) }},
		{"untrusted host", broker.ReasonUntrusted, func() error {
			e := sendFrom("h3")
			b, s := signed(t, stranger, e)
			return a.check("h3", b, s, e)
		}},
		{"another key naming h1", broker.ReasonForged, func() error {
			b, s := signed(t, stranger, env)
			return a.check("h1", b, s, env)
		}},
		{"altered after signing", broker.ReasonForged, func() error {
			return a.check("h1", append([]byte(" "), body...), sig, env)
		}},
		{"sender on another host than the signer", broker.ReasonWrongHost, func() error {
			e := sendFrom("h3")
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"sender gid made on another host", broker.ReasonWrongHost, func() error {
			e := sendFrom("h1")
			e.Sender.Gid = "h3.01a22a93-8b62-7719-997e-dae6eae12382"
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"sender gid without its host", broker.ReasonMalformed, func() error {
			e := sendFrom("h1")
			e.Sender.Gid = "01a22a93-8b62-7719-997e-dae6eae12382"
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"older than the dedup window", broker.ReasonReplay, func() error {
			e := sendFrom("h1")
			e.Created = time.Now().Add(-2 * time.Hour)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"from the future", broker.ReasonReplay, func() error {
			e := sendFrom("h1")
			e.Created = time.Now().Add(time.Hour)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"presence older than the presence TTL", broker.ReasonReplay, func() error {
			e := envelope.New(envelope.Presence, envelope.Party{Host: "h1"}, envelope.Party{Group: "roster"}, "{}")
			e.Created = time.Now().Add(-time.Minute)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a spawn that never expires", broker.ReasonReplay, func() error {
			e := envelope.New(envelope.Spawn, sendFrom("h1").Sender, envelope.Party{Host: "h2", Group: "control"}, `{"name":"carol"}`)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a msg id outside the grammar", broker.ReasonMalformed, func() error {
			e := sendFrom("h1")
			e.MsgID = "../../etc\n"
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a sender name with an escape", broker.ReasonMalformed, func() error {
			e := sendFrom("h1")
			e.Sender.Name = "alice\x1b[201~"
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a broadcast to no group", broker.ReasonMalformed, func() error {
			e := sendFrom("h1")
			e.Kind = envelope.Broadcast
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a broadcast to group #", broker.ReasonMalformed, func() error {
			e := envelope.New(envelope.Broadcast, sendFrom("h1").Sender, envelope.Party{Group: "#"}, "to everyone's inbox")
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a spawn into group 'x y'", broker.ReasonMalformed, func() error {
			e := envelope.New(envelope.Spawn, sendFrom("h1").Sender, envelope.Party{Host: "h2", Group: "control"},
				`{"name":"carol","profile":"default","groups":["ops","x y"]}`)
			e.Expires = time.Now().Add(time.Minute)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a spawn into group all", broker.ReasonMalformed, func() error {
			e := envelope.New(envelope.Spawn, sendFrom("h1").Sender, envelope.Party{Host: "h2", Group: "control"},
				`{"name":"carol","profile":"default","groups":["all"]}`)
			e.Expires = time.Now().Add(time.Minute)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a spawn of a name outside the grammar", broker.ReasonMalformed, func() error {
			e := envelope.New(envelope.Spawn, sendFrom("h1").Sender, envelope.Party{Host: "h2", Group: "control"},
				`{"name":"../carol","profile":"default"}`)
			e.Expires = time.Now().Add(time.Minute)
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
		{"a send to a group", broker.ReasonMalformed, func() error {
			e := sendFrom("h1")
			e.Recipient.Group = "ops"
			b, s := signed(t, h1, e)
			return a.check("h1", b, s, e)
		}},
	}
	for _, c := range cases {
		if got := reason(c.run()); got != c.want {
			t.Errorf("%s: %s, want refused as %s", c.name, got, c.want)
		}
	}
}

// Removing a host from the trust file takes effect at the next message,
// without a restart; so does adding one. Untrusted hosts heard are listed.
func TestAdmissionFollowsTheTrustFile(t *testing.T) {
	a, h1 := testAdmission(t)
	env := sendFrom("h1")
	body, sig := signed(t, h1, env)
	if err := a.check("h1", body, sig, env); err != nil {
		t.Fatal(err)
	}
	if was, err := trust.Remove(a.file.Path(), "h1"); err != nil || !was {
		t.Fatalf("remove: %v %v", was, err)
	}
	var r *broker.Refusal
	if err := a.check("h1", body, sig, env); !errors.As(err, &r) || r.Reason != broker.ReasonUntrusted {
		t.Fatalf("after removal: %v", err)
	}
	a.noteRefused(r.Reason, "h1")
	a.noteRefused(r.Reason, "bad host id\n")
	a.noteRefused(broker.ReasonForged, "h4")
	rows := a.untrustedRows()
	if len(rows) != 1 || rows[0].Host != "h1" || rows[0].Status != "untrusted" || rows[0].Name != "" {
		t.Fatalf("untrusted rows: %+v", rows)
	}
	if _, err := trust.Add(a.file.Path(), trust.Entry{Host: "h1", Key: base64.StdEncoding.EncodeToString(h1.Public().(ed25519.PublicKey))}); err != nil {
		t.Fatal(err)
	}
	if err := a.check("h1", body, sig, env); err != nil {
		t.Fatalf("after adding it again: %v", err)
	}
	if rows := a.untrustedRows(); len(rows) != 0 {
		t.Fatalf("a trusted host still listed as untrusted: %+v", rows)
	}
}

// What the checks cost per message, beside decoding alone (what a gateway
// must do anyway): `make bench` prints these (scripts/bench-local.sh).
// Verification is measured fresh for every message (the memo holds one
// entry and the messages differ); signing is the publisher's side.
func BenchmarkAdmission(b *testing.B) {
	a, h1 := testAdmission(b)
	a.memo = newVerified(1)
	const n = 64
	bodies, sigs := make([][]byte, n), make([][]byte, n)
	for i := range n {
		bodies[i], sigs[i] = signed(b, h1, sendFrom("h1"))
	}
	b.Run("decode", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, err := envelope.Decode(bodies[i%n], 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode+checks", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			env, err := envelope.Decode(bodies[i%n], 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.check("h1", bodies[i%n], sigs[i%n], env); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sign", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			ed25519.Sign(h1, bodies[i%n])
		}
	})
}
