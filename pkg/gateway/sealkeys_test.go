package gateway

import (
	"bytes"
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
