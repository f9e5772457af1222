package seal

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"

	"filippo.io/age"
	"github.com/fleetd/fleet/internal/bech32"
)

// TestX25519StanzaIsAges: what x25519.go wraps, age's own X25519 identity
// unwraps, and what age's X25519 recipient wraps, ours unwraps — the same
// file key both ways; another key, or an altered body, is the incorrect
// identity, never a wrong key.
func TestX25519StanzaIsAges(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	_, raw, err := bech32.Decode(id.Recipient().String())
	if err != nil {
		t.Fatal(err)
	}
	ours, err := newX25519Recipient(raw)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := fastIdentity(id)
	if err != nil {
		t.Fatal(err)
	}
	fileKey := make([]byte, fileKeySize)
	rand.Read(fileKey)

	ss, err := ours.Wrap(fileKey)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := id.Unwrap(ss); err != nil || !bytes.Equal(got, fileKey) {
		t.Fatalf("age's identity on our stanza: %x, %v", got, err)
	}
	theirs, err := id.Recipient().Wrap(fileKey)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := mine.Unwrap(theirs); err != nil || !bytes.Equal(got, fileKey) {
		t.Fatalf("our identity on age's stanza: %x, %v", got, err)
	}
	if got, err := mine.Unwrap(ss); err != nil || !bytes.Equal(got, fileKey) {
		t.Fatalf("our identity on our stanza: %x, %v", got, err)
	}

	other, _ := age.GenerateX25519Identity()
	otherFast, err := fastIdentity(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherFast.Unwrap(ss); !errors.Is(err, age.ErrIncorrectIdentity) {
		t.Fatalf("another key: %v, want the incorrect identity", err)
	}
	bad := *ss[0]
	bad.Body = append([]byte(nil), bad.Body...)
	bad.Body[3] ^= 1
	if _, err := mine.Unwrap([]*age.Stanza{&bad}); !errors.Is(err, age.ErrIncorrectIdentity) {
		t.Fatalf("an altered body: %v, want the incorrect identity", err)
	}
	zero := *ss[0]
	zero.Args = []string{b64.EncodeToString(make([]byte, 32))} // a low-order share: an all-zero secret
	if _, err := mine.Unwrap([]*age.Stanza{&zero}); err == nil || errors.Is(err, age.ErrIncorrectIdentity) {
		t.Fatalf("a low-order share: %v, want refused as invalid", err)
	}
	if a, b := ss[0].Args[0], theirs[0].Args[0]; a == b {
		t.Fatal("two wraps share an ephemeral key")
	}
}
