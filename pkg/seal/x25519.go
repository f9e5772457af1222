package seal

// x25519.go — age's X25519 recipient stanza ("age-encryption.org/v1/X25519",
// the age spec's X25519 recipient type), byte for byte, computed with
// crypto/ecdh directly. Not a construction of fleet's: the same ephemeral
// share, HKDF-SHA-256 salt and label, and ChaCha20-Poly1305 wrap of the
// file key under a zero nonce as filippo.io/age's x25519.go; age.Encrypt
// and age.Decrypt still make and read the whole file around it.
//
// Why: age v1.3.2 calls golang.org/x/crypto/curve25519.X25519, which on
// this Go goes through crypto/ecdh and builds a private key — and with it
// a public key, one scalar multiplication — on every call. A profile of a
// gateway sending 512-byte messages put 54% of its CPU in X25519 scalar
// multiplications (scripts/BENCHMARKS.md): three per stanza on the
// sender's side where two are needed (the ephemeral share and the shared
// secret), two per open on the receiver's where one is (its own public
// key is computed once, when the key is loaded). The age CLI opens what
// this seals, and age's own identity what this wraps (x25519_test.go).

import (
	"crypto/ecdh"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"sync"

	"filippo.io/age"
	"github.com/fleetd/fleet/internal/bech32"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/hkdf"
)

const (
	x25519Label = "age-encryption.org/v1/X25519"
	fileKeySize = 16 // age's file key
)

// b64 is age's stanza argument encoding: standard base64, no padding,
// strict.
var b64 = base64.RawStdEncoding.Strict()

// x25519Recipient wraps age file keys to one X25519 public key.
type x25519Recipient struct {
	pub *ecdh.PublicKey
	raw []byte // its 32 bytes, the second half of the HKDF salt
}

func newX25519Recipient(raw []byte) (*x25519Recipient, error) {
	pub, err := ecdh.X25519().NewPublicKey(raw)
	if err != nil {
		return nil, err
	}
	return &x25519Recipient{pub: pub, raw: pub.Bytes()}, nil
}

// Wrap is age's X25519Recipient.Wrap.
func (r *x25519Recipient) Wrap(fileKey []byte) ([]*age.Stanza, error) {
	eph, err := ecdh.X25519().GenerateKey(rand.Reader) // its public share: one multiplication
	if err != nil {
		return nil, err
	}
	share := eph.PublicKey().Bytes()
	secret, err := eph.ECDH(r.pub) // the second; an all-zero secret is an error
	if err != nil {
		return nil, err
	}
	body, err := wrapKey(secret, share, r.raw, fileKey)
	if err != nil {
		return nil, err
	}
	return []*age.Stanza{{Type: "X25519", Args: []string{b64.EncodeToString(share)}, Body: body}}, nil
}

// x25519Identity unwraps the X25519 stanzas made to its key.
type x25519Identity struct {
	priv *ecdh.PrivateKey
	pub  []byte
}

// identities holds each age identity's ecdh key, made once: a key is
// loaded rarely and opens every message.
var identities sync.Map // *age.X25519Identity -> *x25519Identity

// fastIdentity is id as an x25519Identity.
func fastIdentity(id *age.X25519Identity) (*x25519Identity, error) {
	if f, ok := identities.Load(id); ok {
		return f.(*x25519Identity), nil
	}
	hrp, scalar, err := bech32.Decode(id.String())
	if err != nil || hrp != "age-secret-key-" {
		return nil, fmt.Errorf("an age identity that does not read back: %v", err)
	}
	priv, err := ecdh.X25519().NewPrivateKey(scalar)
	if err != nil {
		return nil, err
	}
	f := &x25519Identity{priv: priv, pub: priv.PublicKey().Bytes()}
	identities.Store(id, f)
	return f, nil
}

// Unwrap is age's X25519Identity.Unwrap: the file key from the first
// X25519 stanza made to this key; age.ErrIncorrectIdentity if none is.
func (i *x25519Identity) Unwrap(stanzas []*age.Stanza) ([]byte, error) {
	for _, s := range stanzas {
		if s.Type != "X25519" {
			continue
		}
		if len(s.Args) != 1 {
			return nil, errors.New("invalid X25519 recipient block")
		}
		share, err := b64.DecodeString(s.Args[0])
		if err != nil {
			return nil, fmt.Errorf("failed to parse X25519 recipient: %v", err)
		}
		peer, err := ecdh.X25519().NewPublicKey(share)
		if err != nil {
			return nil, errors.New("invalid X25519 recipient block")
		}
		secret, err := i.priv.ECDH(peer)
		if err != nil {
			return nil, fmt.Errorf("invalid X25519 recipient: %v", err)
		}
		if len(s.Body) != fileKeySize+chacha20poly1305.Overhead {
			return nil, errors.New("invalid X25519 recipient block: bad body length")
		}
		key, err := wrapping(secret, share, i.pub)
		if err != nil {
			return nil, err
		}
		aead, err := chacha20poly1305.New(key)
		if err != nil {
			return nil, err
		}
		var nonce [chacha20poly1305.NonceSize]byte
		if fileKey, err := aead.Open(nil, nonce[:], s.Body, nil); err == nil {
			return fileKey, nil
		}
	}
	return nil, age.ErrIncorrectIdentity
}

// wrapping is the stanza's wrapping key: HKDF-SHA-256 of the shared
// secret, salted with the ephemeral share and the recipient's key.
func wrapping(secret, share, recipient []byte) ([]byte, error) {
	salt := make([]byte, 0, len(share)+len(recipient))
	salt = append(append(salt, share...), recipient...)
	key := make([]byte, chacha20poly1305.KeySize)
	if _, err := io.ReadFull(hkdf.New(sha256.New, secret, salt, []byte(x25519Label)), key); err != nil {
		return nil, err
	}
	return key, nil
}

// wrapKey seals the file key under the wrapping key, nonce zero (one key,
// one use: the share is fresh for every stanza).
func wrapKey(secret, share, recipient, fileKey []byte) ([]byte, error) {
	key, err := wrapping(secret, share, recipient)
	if err != nil {
		return nil, err
	}
	aead, err := chacha20poly1305.New(key)
	if err != nil {
		return nil, err
	}
	var nonce [chacha20poly1305.NonceSize]byte
	return aead.Seal(nil, nonce[:], fileKey, nil), nil
}
