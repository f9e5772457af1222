package gateway

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/seal"
)

// Announcing the sealing key (issue 27, point 1): every presence message
// carries the host's current key; a rotation is announced at once, in a
// snapshot; the receiving view keeps each host's newest announced key
// and never a bad one.

// The announcer puts the current key on every message, and Rekey makes a
// snapshot at once that carries the new one.
func TestAnnouncerSealKey(t *testing.T) {
	r := newAnnouncerRig(t)
	kr, err := seal.LoadKeyring(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	r.a.h.sealKey = func() string { return kr.Public().String() }
	alice := r.join("alice")
	r.a.Start(r.tick, r.up)
	r.up <- true // a snapshot
	r.wait(1)
	r.a.Change(alice)
	r.wait(1)
	old := kr.Public().String()
	if _, err := kr.Rotate(time.Hour); err != nil {
		t.Fatal(err)
	}
	r.a.Rekey()
	r.wait(1)
	r.a.Leave(time.Minute)
	r.wait(1)
	r.chain()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) != 4 {
		t.Fatalf("%d messages (%v), want snapshot, change, snapshot, leaving", len(r.sent), r.kind)
	}
	for i, want := range []string{old, old, kr.Public().String(), kr.Public().String()} {
		if r.sent[i].SealKey != want {
			t.Errorf("message %d (%s) announces sealing key %q, want %q", i, r.kind[i], r.sent[i].SealKey, want)
		}
	}
	if r.sent[2].Snapshot == nil {
		t.Errorf("after Rekey: %s, want a snapshot", r.kind[2])
	}
}

func newTestRecipient(t *testing.T) *seal.Recipient {
	t.Helper()
	kr, err := seal.LoadKeyring(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return kr.Public()
}

// A key heard in h2's authentic presence is its SealKey; a newer message's
// key replaces it (said at INFO), an older one's does not; a key that is
// not one is ignored, said once, and the held one stands.
func TestPresenceSealKey(t *testing.T) {
	r := newPresenceRig(t)
	k1, k2 := newTestRecipient(t), newTestRecipient(t)
	if got := r.g.peers.SealKey("h2"); got != "" {
		t.Fatalf("SealKey before any presence: %q", got)
	}
	first := r.snapshot(nil, presencePageBytes)[0]
	first.SealKey = k1.String()
	r.mustDeliver(first)
	if got := r.g.peers.SealKey("h2"); got != k1.String() {
		t.Fatalf("SealKey after a snapshot with k1: %q, want %q", got, k1)
	}
	if got := r.g.peers.SealKeyHost(k1.ID().String()); got != "h2" {
		t.Fatalf("SealKeyHost(k1): %q, want h2", got)
	}
	if got := r.g.peers.SealKey("h3"); got != "" {
		t.Fatalf("SealKey of a host never heard: %q", got)
	}

	// a bad key, twice: ignored, said once
	for range 2 {
		b := r.snapshot(nil, presencePageBytes)[0]
		b.SealKey = "age1notakey"
		r.mustDeliver(b)
	}
	if got := r.g.peers.SealKey("h2"); got != k1.String() {
		t.Fatalf("SealKey after a bad key: %q, want k1 kept", got)
	}
	if n := strings.Count(r.log.String(), "announced a sealing key that is not one"); n != 1 {
		t.Fatalf("the bad key was said %d times, want once:\n%s", n, r.log)
	}

	// rotated: a newer message's key replaces the one held
	older := r.snapshot(nil, presencePageBytes)[0] // taken now, delivered late
	older.SealKey = k1.String()
	newer := r.change(presenceChange{Gone: ident.NewGid("h2")})
	newer.SealKey = k2.String()
	r.mustDeliver(newer)
	if got := r.g.peers.SealKey("h2"); got != k2.String() {
		t.Fatalf("SealKey after a message with k2: %q, want %q", got, k2)
	}
	if !strings.Contains(r.log.String(), "host h2 announced a new sealing key "+k2.ID().String()) {
		t.Fatalf("the new key was not said:\n%s", r.log)
	}
	r.mustDeliver(older) // superseded: its key is not taken back
	if got := r.g.peers.SealKey("h2"); got != k2.String() {
		t.Fatalf("SealKey after an older message with k1: %q, want k2 kept", got)
	}

	// a body about another host is refused: its key is not taken
	bad := r.snapshot(nil, presencePageBytes)[0]
	bad.Host, bad.SealKey = "h3", k1.String()
	if err := r.deliver("h2", bad); err == nil {
		t.Fatal("a body about h3 signed by h2 was taken")
	}
	if got := r.g.peers.SealKey("h3"); got != "" {
		t.Fatalf("SealKey of h3 from h2's message: %q", got)
	}
}

// sealKeys notices a rotation made by another process (fleet-gw seal
// rotate: another Keyring on the same files) and tells the announcer;
// a retired key past its grace is destroyed at start.
func TestSealKeysWatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	other, err := seal.LoadKeyring(dir) // the command's
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Rotate(0); err != nil { // retired at once: destroyed at the gateway's start
		t.Fatal(err)
	}
	s, err := openSealKeys(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if keys := s.Keyring().Keys(); len(keys) != 1 || !keys[0].Current {
		t.Fatalf("keys after the start: %+v, want the current one only (the retired one destroyed)", keys)
	}
	if !strings.Contains(buf.String(), "retired sealing key destroyed") {
		t.Fatalf("the destroyed key was not said:\n%s", buf.String())
	}
	rotated := make(chan struct{}, 10)
	s.Start(func() { rotated <- struct{}{} })
	defer s.Stop()
	s.Check()
	select {
	case <-rotated:
		t.Fatal("told of a rotation that did not happen")
	default:
	}
	pub, err := other.Rotate(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-rotated:
	case <-time.After(30 * time.Second):
		t.Fatal("the rotation was not noticed")
	}
	if s.Public() != pub.String() {
		t.Fatalf("Public %s after the rotation, want %s", s.Public(), pub)
	}
	if keys := s.Keyring().Keys(); len(keys) != 2 || keys[1].Until.IsZero() {
		t.Fatalf("keys after the rotation: %+v, want the new one and the retired one", keys)
	}
	s.Stop()
	s.Stop() // twice is fine
}

// Rotation end to end within the parts (issue 27, point 5): h1 seals to
// the key h2 announced; h2 rotates (the command's keyring, another
// process's); what was sealed to the old key still opens in h2's gateway
// within the grace, what is sealed after h2 announces goes to the new
// key; a key whose grace ended is destroyed and what was sealed to it is
// refused as unknown_seal_key.
func TestSealKeysRotation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "h2")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := openSealKeys(dir, log) // h2's gateway
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := seal.LoadKeyring(dir) // fleet-gw seal rotate on h2
	if err != nil {
		t.Fatal(err)
	}
	h1 := newPeerView(time.Second, log) // what h1 heard of h2
	seq := time.Now().UnixNano()
	announce := func() {
		seq++
		h1.HearSealKey("h2", seq, gw.Public())
	}
	send := func(id, text string) (string, []byte) {
		t.Helper()
		r, err := seal.ParseRecipient(h1.SealKey("h2"))
		if err != nil {
			t.Fatal(err)
		}
		bind := seal.Bind("SEND", id, "h1")
		sealed, err := seal.Seal(bind, []byte(text), []*seal.Recipient{r})
		if err != nil {
			t.Fatal(err)
		}
		return bind, sealed
	}
	open := func(bind string, sealed []byte) (string, error) {
		text, err := seal.Open(bind, sealed, gw.Keyring())
		return string(text), err
	}

	announce()
	b0, m0 := send("m-0", "queued under the first key")
	k0 := gw.Public()
	if _, err := cmd.Rotate(time.Hour); err != nil {
		t.Fatal(err)
	}
	gw.Check() // the watcher's look (TestSealKeysWatch)
	if gw.Public() == k0 {
		t.Fatal("h2's gateway still holds the old key as current")
	}
	if text, err := open(b0, m0); err != nil || text != "queued under the first key" {
		t.Fatalf("inside the grace: %q %v", text, err)
	}
	announce()
	b1, m1 := send("m-1", "sealed to the second key")
	if ids, _ := seal.Recipients(m1); len(ids) != 1 || ids[0].String() != cmd.Public().ID().String() {
		t.Fatalf("after the announcement h1 sealed to %v, want h2's new key %s", ids, cmd.Public().ID())
	}
	if _, err := open(b1, m1); err != nil {
		t.Fatalf("the new key: %v", err)
	}

	// rotated again with no grace: the second key opens nothing, and
	// is destroyed at the gateway's next round
	if _, err := cmd.Rotate(0); err != nil {
		t.Fatal(err)
	}
	gw.destroy()
	var se *seal.Error
	if _, err := open(b1, m1); !errors.As(err, &se) || se.Reason() != "unknown_seal_key" {
		t.Fatalf("sealed to a destroyed key: %v, want unknown_seal_key", err)
	}
	if keys := cmd.Keys(); len(keys) != 2 {
		t.Fatalf("keys %+v: want the current one and the first (its grace runs)", keys)
	}
	if text, err := open(b0, m0); err != nil || text != "queued under the first key" {
		t.Fatalf("the first key, still inside its grace: %q %v", text, err)
	}
}
