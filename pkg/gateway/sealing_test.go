package gateway

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
)

// sealHost is one host of a sealing test: its own keyring and trust file
// in a temp folder, and its sealing part.
type sealHost struct {
	name string
	ring *seal.Keyring
	dir  string
	s    *sealing
}

// sealHosts makes hosts that trust each other; those named in noKey have
// a trust line with no sealing key at the others (an older fleet).
func sealHosts(t *testing.T, names []string, noKey ...string) map[string]*sealHost {
	t.Helper()
	hs := map[string]*sealHost{}
	for _, n := range names {
		dir := t.TempDir()
		ring, err := seal.LoadKeyring(dir)
		if err != nil {
			t.Fatal(err)
		}
		hs[n] = &sealHost{name: n, ring: ring, dir: dir}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, h := range hs {
		path := filepath.Join(h.dir, "trust")
		for _, o := range hs {
			if o == h {
				continue
			}
			pub, _, _ := ed25519.GenerateKey(rand.Reader)
			e := trust.Entry{Host: o.name, Key: base64.StdEncoding.EncodeToString(pub)}
			if !slices.Contains(noKey, o.name) {
				e.SealKey = o.ring.Public().String()
			}
			if _, err := trust.Add(path, e); err != nil {
				t.Fatal(err)
			}
		}
		h.s = newSealing(h.name, h.ring, trust.Open(path), nil, nil, 1<<20, log)
		h.s.everyone = func() []string { return names }
		h.s.spawn = checkSpawn
		h.s.members = func(string) []string { return nil }
	}
	return hs
}

func sendTo(host, text string) *envelope.Envelope {
	return envelope.New(envelope.Send, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"},
		envelope.Party{Gid: host + ".0c0ffee0-0000-4000-8000-000000000002", Host: host}, text)
}

// wantRefusal checks that err is a *broker.Refusal with reason.
func wantRefusal(t *testing.T, err error, reason string) {
	t.Helper()
	var r *broker.Refusal
	if !errors.As(err, &r) || r.Reason != reason {
		t.Fatalf("got %v, want a refusal %s", err, reason)
	}
}

// A message to a host is sealed to it and to the sender, opens there and
// at home, and nowhere else; the sealed bytes are bound to their message.
func TestSealingRoundTrip(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3"})
	env := sendTo("h2", "the marker text")
	orig := *env
	c := *env
	if err := hs["h1"].s.Seal(&c); err != nil {
		t.Fatal(err)
	}
	if c.Body != "" || len(c.Sealed) == 0 || strings.Contains(string(c.Sealed), "marker") {
		t.Fatalf("not sealed: body %q sealed %d bytes", c.Body, len(c.Sealed))
	}
	if env.Body != orig.Body || env.Sealed != nil {
		t.Fatal("Seal changed the caller's envelope")
	}
	ids, err := seal.Recipients(c.Sealed)
	if err != nil || len(ids) != 2 {
		t.Fatalf("recipients %v, %v: want h2 and h1", ids, err)
	}
	for _, at := range []string{"h2", "h1"} {
		o := c
		if err := hs[at].s.Open("h1", &o); err != nil {
			t.Fatalf("%s cannot open it: %v", at, err)
		}
		if o.Body != "the marker text" || o.Sealed != nil {
			t.Fatalf("%s opened %q", at, o.Body)
		}
	}
	// sealed to others
	o := c
	wantRefusal(t, hs["h3"].s.Open("h1", &o), broker.ReasonSealedElsewhere)
	// bound to its message: another id, kind or signing host is tampering
	for _, mod := range []func(e *envelope.Envelope) (host string){
		func(e *envelope.Envelope) string { e.MsgID = envelope.NewID(); return "h1" },
		func(e *envelope.Envelope) string { e.Kind = envelope.Reply; return "h1" },
		func(e *envelope.Envelope) string { return "h3" },
	} {
		o := c
		o.Sealed = append([]byte(nil), c.Sealed...)
		host := mod(&o)
		wantRefusal(t, hs["h2"].s.Open(host, &o), broker.ReasonTampered)
	}
	// a byte flipped in the sealed payload
	o = c
	o.Sealed = append([]byte(nil), c.Sealed...)
	o.Sealed[len(o.Sealed)-5] ^= 1
	wantRefusal(t, hs["h2"].s.Open("h1", &o), broker.ReasonTampered)
	// not sealed bytes at all
	o = c
	o.Sealed = []byte("not sealed")
	wantRefusal(t, hs["h2"].s.Open("h1", &o), broker.ReasonTampered)
	// sealed twice: refused before anything is published
	o = c
	if err := hs["h1"].s.Seal(&o); err == nil {
		t.Fatal("an envelope sealed twice")
	}
}

// Kinds without text travel as they are; a SPAWN's arguments are sealed
// to its target host and checked once opened.
func TestSealingKinds(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"})
	r := envelope.New(envelope.Receipt, envelope.Party{Host: "h1"}, envelope.Party{Gid: "h2.0c0ffee0-0000-4000-8000-000000000002"}, `{"msg_id":"x"}`)
	if err := hs["h1"].s.Seal(r); err != nil || r.Sealed != nil || r.Body == "" {
		t.Fatalf("a receipt was sealed: %v", err)
	}
	if err := hs["h2"].s.Open("h1", r); err != nil {
		t.Fatalf("a receipt in the clear refused: %v", err)
	}
	sp := envelope.New(envelope.Spawn, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"},
		envelope.Party{Group: "control", Host: "h2"}, `{"name":"bad name!","args":["the marker"]}`)
	if err := hs["h1"].s.Seal(sp); err != nil || sp.Sealed == nil || sp.Body != "" {
		t.Fatalf("a spawn not sealed: %v", err)
	}
	wantRefusal(t, hs["h2"].s.Open("h1", sp), broker.ReasonMalformed)
}

// Secure by default: a host with no sealing key gets no text (77,
// no_seal_key) unless plaintext-hosts names it; text in the clear is
// taken only from a host named there.
func TestSealingNoKey(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"}, "h2")
	env := sendTo("h2", "the marker text")
	err := hs["h1"].s.Seal(env)
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Kind != fault.KindNoSealKey || fault.CodeOf(err) != 77 ||
		!strings.Contains(fe.Hint, "fleet-gw trust add h2 SIGNING-KEY SEALING-KEY") {
		t.Fatalf("got %v, want 77 no_seal_key with the command that fixes it", err)
	}
	if env.Body != "the marker text" || env.Sealed != nil {
		t.Fatal("a refused seal changed the envelope")
	}
	wantRefusal(t, hs["h2"].s.Open("h1", env), broker.ReasonUnsealed)

	hs["h1"].s.plaintext["h2"] = true
	if err := hs["h1"].s.Seal(env); err != nil || env.Sealed != nil || env.Body != "the marker text" {
		t.Fatalf("a host named in plaintext-hosts: %v, sealed %v", err, env.Sealed != nil)
	}
	hs["h2"].s.plaintext["h1"] = true
	if err := hs["h2"].s.Open("h1", env); err != nil {
		t.Fatalf("text in the clear from a named host refused: %v", err)
	}
}

// A broadcast is sealed once, one stanza per host with members (every
// trusted host for "all"); a host with members and no key refuses the
// whole broadcast (77) by default.
func TestSealingBroadcast(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3", "h4"}, "h4")
	s := hs["h1"].s
	s.members = func(g string) []string {
		if g == "ops" {
			return []string{"h2", "h2"}
		}
		return []string{"h2", "h4"}
	}
	b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "ops"}, "to ops")
	if err := s.Seal(b); err != nil {
		t.Fatal(err)
	}
	if ids, _ := seal.Recipients(b.Sealed); len(ids) != 2 {
		t.Fatalf("sealed to %d hosts, want h1 and h2", len(ids))
	}
	for _, at := range []string{"h1", "h2"} {
		o := *b
		if err := hs[at].s.Open("h1", &o); err != nil || o.Body != "to ops" {
			t.Fatalf("%s: %v", at, err)
		}
	}
	o := *b
	wantRefusal(t, hs["h3"].s.Open("h1", &o), broker.ReasonSealedElsewhere)
	// h4 has a member of dev and no key: refused, nothing sealed
	dev := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "dev"}, "to dev")
	wantNoSealKey(t, s.Seal(dev), "host h4 announces", "fleet-gw trust add h4 SIGNING-KEY SEALING-KEY", "seal-fallback = clear")
	if dev.Sealed != nil || dev.Body != "to dev" {
		t.Fatal("a refused seal changed the envelope")
	}
	// every trusted host for "all": h4 refuses that too
	all := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "all"}, "to all")
	wantNoSealKey(t, s.Seal(all), "host h4 announces")
	s.everyone = func() []string { return []string{"h1", "h2", "h3"} }
	if err := s.Seal(all); err != nil {
		t.Fatal(err)
	}
	if ids, _ := seal.Recipients(all.Sealed); len(ids) != 3 {
		t.Fatalf("broadcast.all sealed to %d hosts, want h1, h2, h3", len(ids))
	}
	o = *all
	if err := hs["h3"].s.Open("h1", &o); err != nil || o.Body != "to all" {
		t.Fatalf("h3: %v", err)
	}
}

// wantNoSealKey checks that err is a 77 no_seal_key whose message and
// hint say each of says.
func wantNoSealKey(t *testing.T, err error, says ...string) {
	t.Helper()
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Kind != fault.KindNoSealKey || fault.CodeOf(err) != 77 {
		t.Fatalf("got %v, want 77 no_seal_key", err)
	}
	for _, w := range says {
		if !strings.Contains(fe.Error()+" hint: "+fe.Hint, w) {
			t.Errorf("%q (hint %q) does not say %q", fe.Error(), fe.Hint, w)
		}
	}
}

// Which hosts get a message sealed, in the clear, or refuse it (issue
// 36): plaintext-hosts names a host, seal-fallback = clear allows every
// trusted one; untrusted hosts with no key are in none; a refusal names
// every host it is for, sorted, before anything is sealed.
func TestSealingPlan(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3", "h4", "h5"}, "h3", "h4", "h5")
	s := hs["h1"].s
	s.trusted = func(h string) bool { return h != "h5" }
	s.members = func(string) []string { return []string{"h5", "h4", "h2", "h3"} }
	b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "ops"}, "to ops")
	p := s.plan(b)
	if len(p.to) != 2 || p.clear != nil || strings.Join(p.refused, " ") != "h3 h4" {
		t.Fatalf("default: sealed to %d, clear %v, refused %v; want 2 (h1 h2), none, h3 h4", len(p.to), p.clear, p.refused)
	}
	_, err := s.Check(b)
	wantNoSealKey(t, err, "hosts h3, h4 announce no sealing key", "broadcast "+b.MsgID+" not sent to any host, nor stored here", "on each of h3, h4 run `fleet-gw key`")

	s.plaintext["h4"] = true
	_, err = s.Check(b)
	wantNoSealKey(t, err, "host h3 announces")

	s.fallback = true
	clear, err := s.Check(b)
	if err != nil || strings.Join(clear, " ") != "h3 h4" {
		t.Fatalf("seal-fallback = clear: %v, clear %v; want h3 h4", err, clear)
	}
	// the whole broadcast is sealed to the hosts with keys only
	if err := s.Seal(b); err != nil || b.Sealed == nil {
		t.Fatalf("%v, sealed %v", err, b.Sealed != nil)
	}
	if ids, _ := seal.Recipients(b.Sealed); len(ids) != 2 {
		t.Fatalf("sealed to %d hosts, want h1 and h2", len(ids))
	}
	// a member's copy goes to its host alone: in the clear to h3, sealed
	// to h2 (never clear to a host with a key)
	for host, clear := range map[string]bool{"h3": true, "h2": false} {
		cp := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"},
			envelope.Party{Gid: host + ".0c0ffee0-0000-4000-8000-000000000002", Host: host, Group: "ops"}, "to ops")
		if err := s.Seal(cp); err != nil || (cp.Sealed == nil) != clear {
			t.Fatalf("copy to %s: %v, sealed %v", host, err, cp.Sealed != nil)
		}
	}
	// a single send: the same rule
	s.fallback, s.plaintext = false, map[string]bool{}
	_, err = s.Check(sendTo("h3", "x"))
	wantNoSealKey(t, err, "host h3 announces", "send ")
	if clear, err := s.Check(sendTo("h5", "x")); err != nil || clear != nil {
		t.Fatalf("an untrusted host: %v, clear %v", err, clear)
	}
	s.fallback = true
	if clear, err := s.Check(sendTo("h3", "x")); err != nil || strings.Join(clear, " ") != "h3" {
		t.Fatalf("a send with seal-fallback = clear: %v, clear %v", err, clear)
	}
	if clear, err := s.Check(sendTo("h2", "x")); err != nil || clear != nil {
		t.Fatalf("a send to a host with a key: %v, clear %v", err, clear)
	}
}

// A sealed broadcast names the inboxes that get their copy in the clear
// (clear_gids, signed): their host drops its sealed copy there, and only
// there; any other inbox of it refuses it as sealed to other hosts.
func TestSealingDropsSealedCopyOfClearMember(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3"}, "h3")
	s := hs["h1"].s
	s.fallback = true
	s.members = func(string) []string { return []string{"h2", "h3"} }
	carol, dave := "h3.0c0ffee0-0000-4000-8000-000000000003", "h3.0c0ffee0-0000-4000-8000-000000000004"
	b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "ops"}, "to ops")
	b.ClearGids = []string{carol}
	if err := s.Seal(b); err != nil {
		t.Fatal(err)
	}
	at := func(gid string) *envelope.Envelope { o := *b; o.Recipient.Gid = gid; return &o }
	var drop *broker.Drop
	if err := hs["h3"].s.Open("h1", at(carol)); !errors.As(err, &drop) {
		t.Fatalf("carol's sealed copy on h3: %v, want dropped", err)
	}
	wantRefusal(t, hs["h3"].s.Open("h1", at(dave)), broker.ReasonSealedElsewhere)
	// a gid of another host named: h2 opens its copy, never drops it
	b2 := at("h2.0c0ffee0-0000-4000-8000-000000000002")
	b2.ClearGids = []string{b2.Recipient.Gid}
	if err := hs["h2"].s.Open("h1", b2); err != nil || b2.Body != "to ops" || b2.ClearGids != nil {
		t.Fatalf("h2: %v %q %v", err, b2.Body, b2.ClearGids)
	}
	// unsealed, clear_gids means nothing: text in the clear is refused
	// from a host plaintext-hosts does not name
	c := *b
	c.Sealed, c.Body, c.Recipient.Gid = nil, "to ops", carol
	wantRefusal(t, hs["h3"].s.Open("h1", &c), broker.ReasonUnsealed)
}

// A key the host announced in its presence comes first, then its
// certificate's, then its trust line's; a key that does not read is
// passed over.
func TestSealingKeyOrder(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"})
	fresh, err := seal.LoadKeyring(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := hs["h1"].s
	s.announced = func(h string) string {
		if h == "h2" {
			return fresh.Public().String()
		}
		return ""
	}
	if k := s.keyOf("h2"); k == nil || k.ID() != fresh.Public().ID() {
		t.Fatalf("key of h2: %v, want the announced one", k)
	}
	s.announced = func(string) string { return "age1notakey" }
	if k := s.keyOf("h2"); k == nil || k.ID() != hs["h2"].ring.Public().ID() {
		t.Fatalf("key of h2: %v, want the trust line's", k)
	}
	if k := s.keyOf("h9"); k != nil {
		t.Fatalf("a host nobody knows has key %v", k)
	}
}

// A copy of another host's message that this host publishes (a dead
// letter to bridge.dlq) is sealed to its sender's host too; a host this
// one does not trust, with no key known, gets bytes it cannot open
// rather than a 77 (the broker says whether it exists).
func TestSealingSenderAndUntrusted(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3"})
	dead := sendTo("h2", "died on h2")
	if err := hs["h2"].s.Seal(dead); err != nil {
		t.Fatal(err)
	}
	o := *dead
	if err := hs["h1"].s.Open("h2", &o); err != nil || o.Body != "died on h2" {
		t.Fatalf("the sender cannot open the dead letter's copy: %v", err)
	}
	o = *dead
	wantRefusal(t, hs["h3"].s.Open("h2", &o), broker.ReasonSealedElsewhere)

	s := hs["h1"].s
	s.trusted = func(h string) bool { return h != "h9" }
	sp := envelope.New(envelope.Spawn, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"},
		envelope.Party{Group: "control", Host: "h9"}, `{"name":"x"}`)
	if err := s.Seal(sp); err != nil || sp.Sealed == nil {
		t.Fatalf("a spawn on an untrusted host: %v", err)
	}
	if ids, _ := seal.Recipients(sp.Sealed); len(ids) != 1 || ids[0] != hs["h1"].ring.Public().ID() {
		t.Fatalf("sealed to %v, want this host alone", ids)
	}
}

// What the store keeps of a large message is the envelope exactly as it
// is published, sealed: a refusal notice's digest of the published bytes
// matches it.
func TestSealingKeptIsWhatIsPublished(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"})
	s := hs["h1"].s
	env := sendTo("h2", strings.Repeat("big text ", 40<<10))
	raw := s.Kept(env)
	if raw == nil || strings.Contains(string(raw), "big text") {
		t.Fatalf("kept %d bytes, in the clear: %v", len(raw), raw != nil && strings.Contains(string(raw), "big text"))
	}
	c := *env
	if err := s.Seal(&c); err != nil {
		t.Fatal(err)
	}
	pub, err := envelope.Encode(&c)
	if err != nil || string(pub) != string(raw) {
		t.Fatalf("published bytes differ from the kept ones (%d, %d bytes)", len(pub), len(raw))
	}
	// a short message keeps nothing, and is sealed afresh
	if b := s.Kept(sendTo("h2", "short")); b != nil {
		t.Fatalf("kept %d bytes of a short message", len(b))
	}
	var none *sealing
	if b := none.Kept(env); b == nil || !strings.Contains(string(b), "big text") {
		t.Fatal("without sealing, the plain envelope is kept")
	}
}

// A message of this host's that comes back sealed (a death in the
// broker, a refusal notice's copy) is kept as its dead letter with its
// text opened: the store holds text as ever, and a replay seals anew.
func TestSealingPlain(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"})
	env := sendTo("h2", "came back")
	c := *env
	if err := hs["h1"].s.Seal(&c); err != nil {
		t.Fatal(err)
	}
	raw, err := envelope.Encode(&c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := envelope.Decode(hs["h1"].s.Plain(raw), 1<<20)
	if err != nil || got.Body != "came back" || got.Sealed != nil || got.MsgID != env.MsgID {
		t.Fatalf("opened %+v, %v", got, err)
	}
	// another host's message, or bytes that are no envelope: as they are
	if b := hs["h2"].s.Plain(raw); string(b) != string(raw) {
		t.Fatal("h2 opened a message h1 signed as its own")
	}
	if b := hs["h1"].s.Plain([]byte("junk")); string(b) != "junk" {
		t.Fatal("junk changed")
	}
}

// A body at the limit, sealed, still decodes within the bound Decode
// puts on sealed bytes (envelope.SealOverhead); one a few KiB over (the
// bound allows a little slack) does not.
func TestSealingWithinDecodeBound(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2", "h3"})
	for _, n := range []int{1 << 20, 1<<20 + 3000} {
		b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"},
			envelope.Party{Group: "all"}, strings.Repeat("x", n))
		if err := hs["h1"].s.Seal(b); err != nil {
			t.Fatal(err)
		}
		raw, err := envelope.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		_, err = envelope.Decode(raw, 1<<20)
		if n == 1<<20 && err != nil {
			t.Fatalf("a sealed body at the limit refused: %v", err)
		}
		if n > 1<<20 && fault.KindOf(err) != fault.KindBodyTooLarge {
			t.Fatalf("a sealed body over the limit: %v", err)
		}
	}
}

// The copies of one broadcast (the same sealed bytes, one per member
// inbox) are opened once; other bytes, or the same bytes under another
// binding, are opened (or refused) afresh.
func TestSealingBroadcastOpenedOnce(t *testing.T) {
	hs := sealHosts(t, []string{"h1", "h2"})
	b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "all"}, "to all")
	if err := hs["h1"].s.Seal(b); err != nil {
		t.Fatal(err)
	}
	r := hs["h2"].s
	for i := 0; i < 3; i++ {
		o := *b
		if err := r.Open("h1", &o); err != nil || o.Body != "to all" {
			t.Fatalf("copy %d: %q, %v", i, o.Body, err)
		}
	}
	if len(r.opened) != 1 {
		t.Fatalf("%d broadcasts remembered, want 1", len(r.opened))
	}
	o := *b
	o.MsgID = envelope.NewID()
	wantRefusal(t, r.Open("h1", &o), broker.ReasonTampered)
	for i := 0; i < maxOpened+5; i++ {
		r.remember([32]byte{byte(i), 1}, "x")
	}
	if len(r.opened) != maxOpened || len(r.order) != maxOpened {
		t.Fatalf("%d remembered, over %d", len(r.opened), maxOpened)
	}
}

// clear_gids names gids only: anything else is refused with the claims.
func TestSealingClearGidsAreGids(t *testing.T) {
	b := envelope.New(envelope.Broadcast, envelope.Party{Gid: "h1.0c0ffee0-0000-4000-8000-000000000001", Host: "h1"}, envelope.Party{Group: "ops"}, "to ops")
	b.ClearGids = []string{"h3.0c0ffee0-0000-4000-8000-000000000003"}
	if err := checkFields(b); err != nil {
		t.Fatalf("a gid refused: %v", err)
	}
	b.ClearGids = append(b.ClearGids, "h3.*")
	if err := checkFields(b); err == nil || !strings.Contains(err.Error(), `clear_gids "h3.*" is not a gid`) {
		t.Fatalf("got %v, want the non-gid named", err)
	}
}
