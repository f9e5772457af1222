// Package seal encrypts message text to the hosts that will deliver it
// (issue 27, "sealed bodies"), so the broker carries bytes it cannot read.
// It is filippo.io/age with X25519 keys — one recipient stanza per host —
// wrapped in a small frame of fleet's own; nothing here is a hand-made
// construction.
//
// # Keys
//
// Each host has a sealing key (Keyring): an age X25519 identity kept
// beside its signing key, STATE_DIR/seal.key (0600, an age identity file:
// `age -d -i seal.key` opens what was sealed to it). Its public half, the
// "age1..." recipient, travels wherever the signing key's does: the
// host's trust line (HOST SIGNING-KEY SEALING-KEY, pkg/trust) and its
// operator-signed certificate (seal_key). Rotation is data: Rotate makes
// a new current key and keeps the old one under STATE_DIR/seal-retired/
// until a grace deadline, so messages sealed to it while the other hosts
// still held the old line open; after the deadline it opens nothing and
// Destroy removes its file.
//
// # What is sealed, and the order
//
// The gateway integration seals, for every cross-host kind that carries
// text (SEND, REPLY, ASK, ANSWER, BROADCAST, TOO_LATE, SPAWN, and any
// kind whose body quotes text), the envelope's body and nothing else: the
// body is where every text lives (a SPAWN's arguments are its JSON body).
// What stays readable is what the broker routes by and what the audit log
// already records: kind, ids (msg, trace, turn, in-reply-to, replay-of),
// parties (gids, names, hosts, group), created and expires times, the
// schema version, and the AMQP headers. The sealed bytes go in an
// additive envelope field (planned: "sealed", base64 of Seal's output,
// with "body" empty), never inside "body": a body is text a person typed,
// and no byte of it may claim to be sealed.
//
// Sign the sealed bytes, verify before open: the sender seals the body,
// puts the sealed bytes in the envelope, encodes it and signs the encoded
// bytes as today (pkg/broker signs exactly what it publishes), so the
// signature covers the sealed bytes. The receiver checks the signature
// and every claim (pkg/gateway admission) first and only then calls Open:
// bytes from an unknown or lying host are never decrypted.
//
// Open is bound to its message: Seal takes a binding (the integration
// passes Bind(kind, msg id, signing host)) that is sealed with the text
// and must match on Open. The signature already stops the broker and
// anyone without a trusted key from moving sealed bytes; the binding
// stops a trusted host too: it cannot put sealed bytes it received or
// saw into a message of its own, to have another host deliver text it
// could not read, or another host's text under its name.
//
// # Format
//
// Seal's output is
//
//	"fsl1" | uvarint n | n key ids (8 bytes each) | age file
//
// where key id i is the first 8 bytes of the sha256 of the X25519 public
// key of stanza i, and the age file's payload is the sha256 of what
// precedes the age file (so the table cannot be altered unseen) | uvarint
// len(bind) | bind | plaintext. The key ids let a host see at once
// whether a message is for it, try its key on its own stanza only
// (however many hosts a broadcast names) and say why not; they are
// covered by the message's signature like everything else. They tell
// the broker which hosts a message is for: a recipient's routing key
// already does, and for a broadcast, which hosts have members in the
// group, the hosts' presence snapshots do.
package seal

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"filippo.io/age"
	"github.com/fleetd/fleet/internal/bech32"
)

// Bounds on what Open accepts from the broker.
const (
	// MaxRecipients is how many hosts one sealed message may name.
	MaxRecipients = 4096
	// maxBind bounds the binding.
	maxBind = 1024
)

var magic = []byte("fsl1")

// Recipient is a host's public sealing key.
type Recipient struct {
	r    *x25519Recipient // age's X25519 stanza (x25519.go)
	id   KeyID
	text string
}

// KeyID names a sealing key: the first 8 bytes of the sha256 of its
// public key. It is written in sealed messages and in file names.
type KeyID [8]byte

func (k KeyID) String() string { return hex.EncodeToString(k[:]) }

func keyID(raw []byte) KeyID {
	sum := sha256.Sum256(raw)
	var k KeyID
	copy(k[:], sum[:8])
	return k
}

// ParseRecipient reads a public sealing key, as "age1..." (the form in
// trust lines, certificates and `fleet-gw key`).
func ParseRecipient(s string) (*Recipient, error) {
	hrp, raw, err := bech32.Decode(s)
	if err != nil || hrp != "age" || len(raw) != 32 {
		return nil, fmt.Errorf("%q is not a sealing key (age1..., as fleet-gw key prints it)", s)
	}
	ar, err := age.ParseX25519Recipient(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a sealing key: %v", s, err)
	}
	r, err := newX25519Recipient(raw)
	if err != nil {
		return nil, fmt.Errorf("%q is not a sealing key: %v", s, err)
	}
	return &Recipient{r: r, id: keyID(raw), text: ar.String()}, nil
}

func recipientOf(id *age.X25519Identity) *Recipient {
	r, err := ParseRecipient(id.Recipient().String())
	if err != nil {
		panic(err) // age's own encoding
	}
	return r
}

// String is the key as text ("age1...").
func (r *Recipient) String() string { return r.text }

// ID is the key's id.
func (r *Recipient) ID() KeyID { return r.id }

// Why Open refuses. Test with errors.Is; *Error says more.
var (
	// ErrNotForUs: none of the message's recipient keys is this host's.
	ErrNotForUs = errors.New("sealed to other hosts")
	// ErrUnknownKey: sealed to a key this host held and destroyed, or
	// holds retired past its grace.
	ErrUnknownKey = errors.New("sealed to a key this host no longer holds")
	// ErrTampered: not a sealed message, or altered, or sealed for
	// another message (its binding differs).
	ErrTampered = errors.New("sealed bytes altered or malformed")
)

// Error is a refusal of Open: Kind is one of the Err values above, Key
// the key id concerned (if any).
type Error struct {
	Kind error
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Kind.Error()
	}
	return e.Kind.Error() + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Kind }

// Reason is the refusal reason a dead letter carries (fleet-reason).
func (e *Error) Reason() string {
	switch e.Kind {
	case ErrNotForUs:
		return "not_for_us"
	case ErrUnknownKey:
		return "unknown_seal_key"
	}
	return "tampered"
}

func tampered(format string, args ...any) error {
	return &Error{Kind: ErrTampered, Msg: fmt.Sprintf(format, args...)}
}

// Bind is the binding the gateway seals a body with: the message's kind,
// its msg id and the host that signs it.
func Bind(kind, msgID, host string) string { return kind + "\n" + msgID + "\n" + host }

// Seal encrypts plaintext to every recipient at once (a broadcast is
// sealed once, one stanza per host), bound to bind.
func Seal(bind string, plaintext []byte, to []*Recipient) ([]byte, error) {
	if len(to) == 0 {
		return nil, errors.New("seal: no recipient")
	}
	if len(to) > MaxRecipients {
		return nil, fmt.Errorf("seal: %d recipients (at most %d)", len(to), MaxRecipients)
	}
	if len(bind) > maxBind {
		return nil, fmt.Errorf("seal: binding of %d bytes (at most %d)", len(bind), maxBind)
	}
	seen := make(map[KeyID]bool, len(to))
	rs := make([]age.Recipient, 0, len(to))
	out := bytes.NewBuffer(make([]byte, 0, 64+len(plaintext)+len(bind)+len(to)*(8+120)+16*(1+len(plaintext)/65536)))
	out.Write(magic)
	var ids []KeyID
	for _, r := range to {
		if seen[r.id] {
			continue // one stanza per host
		}
		seen[r.id] = true
		ids = append(ids, r.id)
		rs = append(rs, r.r)
	}
	out.Write(binary.AppendUvarint(nil, uint64(len(ids))))
	for _, id := range ids {
		out.Write(id[:])
	}
	table := sha256.Sum256(out.Bytes())
	w, err := age.Encrypt(out, rs...)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(table[:]); err != nil {
		return nil, err
	}
	if _, err := w.Write(binary.AppendUvarint(nil, uint64(len(bind)))); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(w, bind); err != nil {
		return nil, err
	}
	if _, err := w.Write(plaintext); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Recipients returns the key ids a sealed message names, in stanza order.
func Recipients(sealed []byte) ([]KeyID, error) {
	ids, _, err := split(sealed)
	return ids, err
}

func split(sealed []byte) ([]KeyID, []byte, error) {
	rest, ok := bytes.CutPrefix(sealed, magic)
	if !ok {
		return nil, nil, tampered("not a sealed message")
	}
	n, w := binary.Uvarint(rest)
	if w <= 0 || n == 0 || n > MaxRecipients || uint64(len(rest)-w) < n*8 {
		return nil, nil, tampered("bad recipient table")
	}
	rest = rest[w:]
	ids := make([]KeyID, n)
	for i := range ids {
		copy(ids[i][:], rest[i*8:])
	}
	return ids, rest[n*8:], nil
}

// one tries an identity on stanza i alone: the one the key id table
// names for it.
type one struct {
	id *x25519Identity
	i  int
	n  int
}

var errTable = errors.New("the recipient table does not match the stanzas")

func (o one) Unwrap(ss []*age.Stanza) ([]byte, error) {
	if len(ss) != o.n {
		return nil, errTable
	}
	return o.id.Unwrap(ss[o.i : o.i+1])
}

// Open decrypts a sealed message with this host's keys, checking that it
// was sealed with bind. Call it only on bytes whose signature was
// verified. A refusal is an *Error (ErrNotForUs, ErrUnknownKey,
// ErrTampered).
func Open(bind string, sealed []byte, kr *Keyring) ([]byte, error) {
	ids, file, err := split(sealed)
	if err != nil {
		return nil, err
	}
	table := sha256.Sum256(sealed[:len(sealed)-len(file)])
	ident, at, err := kr.find(ids)
	if err != nil {
		return nil, err
	}
	fast, err := fastIdentity(ident)
	if err != nil {
		return nil, err
	}
	r, err := age.Decrypt(bytes.NewReader(file), one{id: fast, i: at, n: len(ids)})
	if err != nil {
		return nil, tampered("%s", err.Error())
	}
	buf := make([]byte, 0, len(file))
	b := bytes.NewBuffer(buf)
	if _, err := io.Copy(b, r); err != nil {
		return nil, tampered("%s", err.Error())
	}
	plain, ok := bytes.CutPrefix(b.Bytes(), table[:])
	if !ok {
		return nil, tampered("the recipient table was altered")
	}
	n, w := binary.Uvarint(plain)
	if w <= 0 || n > maxBind || uint64(len(plain)-w) < n {
		return nil, tampered("bad binding")
	}
	if string(plain[w:w+int(n)]) != bind {
		return nil, tampered("sealed for another message")
	}
	return plain[w+int(n):], nil
}
