// Package envelope is fleet's one wire format. Every message kind — on the
// local socket, in the embedded store and (later) on the broker — is an
// Envelope encoded as JSON. Within a schema major, unknown fields are
// ignored, so mixed-version gateways interoperate; a newer major is refused
// before any other field is read, never half-parsed.
package envelope

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/google/uuid"
)

// Schema version this build writes. Readers accept any minor of Major.
const (
	Major = 1
	Minor = 0
)

// Version is the schema string written on every envelope.
var Version = strconv.Itoa(Major) + "." + strconv.Itoa(Minor)

// DefaultMaxBody is the body limit unless configured otherwise (1 MiB).
const DefaultMaxBody = 1 << 20

// Kind names what a message is for. The set follows the design's flows.
type Kind string

const (
	Send        Kind = "SEND"         // U1/U6/U7: a message to an entity
	Reply       Kind = "REPLY"        // U3: a reply to a SEND, inherits its trace
	Ask         Kind = "ASK"          // U2: live-only question with a TTL
	Answer      Kind = "ANSWER"       // U2: the answer to an ASK, by turn id
	TooLate     Kind = "TOO_LATE"     // U2: the asking turn was gone
	Broadcast   Kind = "BROADCAST"    // U8: one publish, a copy per member
	Presence    Kind = "PRESENCE"     // U5: a host's snapshot (page), change notice or leaving notice
	Spawn       Kind = "SPAWN"        // U4: start an entity on a host
	SpawnResult Kind = "SPAWN_RESULT" // U4: gid and host of the new entity
	Stop        Kind = "STOP"         // U4: stop an entity
	StopResult  Kind = "STOP_RESULT"  // U4: outcome of a STOP
	Receipt     Kind = "RECEIPT"      // delivery state report, never persisted
	Bounce      Kind = "BOUNCE"       // a message of the sender's dead-lettered
	Trace       Kind = "TRACE"        // fleet-trace: a host's audit lines of one trace id, please
	TraceResult Kind = "TRACE_RESULT" // fleet-trace: those lines (no message text)
	Notice      Kind = "NOTICE"       // the gateway's word to an entity of its own host (a loop cut); never crosses hosts
)

var kinds = map[Kind]bool{
	Send: true, Reply: true, Ask: true, Answer: true, TooLate: true,
	Broadcast: true, Presence: true, Spawn: true, SpawnResult: true,
	Stop: true, StopResult: true, Receipt: true, Bounce: true,
	Trace: true, TraceResult: true, Notice: true,
}

// Known reports whether k is a kind this build understands.
func (k Kind) Known() bool { return kinds[k] }

// Party names one end of a message. Gid is authoritative; Name and Host are
// for people and for resolution.
type Party struct {
	Gid   string `json:"gid,omitempty"`
	Name  string `json:"name,omitempty"`
	Host  string `json:"host,omitempty"`
	Group string `json:"group,omitempty"` // broadcast target, "" or "all" or a group
}

// String renders a party as name@host, falling back to the gid.
func (p Party) String() string {
	switch {
	case p.Group != "":
		return "broadcast." + p.Group
	case p.Name != "" && p.Host != "":
		return p.Name + "@" + p.Host
	case p.Name != "":
		return p.Name
	}
	return p.Gid
}

// Envelope is one message.
type Envelope struct {
	Schema    string `json:"v"`
	MsgID     string `json:"msg_id"`
	Kind      Kind   `json:"kind"`
	Sender    Party  `json:"sender"`
	Recipient Party  `json:"recipient"`
	TraceID   string `json:"trace_id"`
	InReplyTo string `json:"in_reply_to,omitempty"`
	TurnID    string `json:"turn_id,omitempty"`
	ReplayOf  string `json:"replay_of,omitempty"` // fleet-dlq replay: the dead letter this delivers again
	// Hops is how many messages came before this one in its trace, each
	// the cause of the next (0: the first; a reply or a send made in a
	// trace counts one more). Only a gateway sets it, from a message it
	// knows was delivered to the sender (never from a body or a client),
	// and the receiving gateway refuses one past its max-hops. It is
	// signed with the rest; a gateway older than it ignores it.
	Hops int `json:"hops,omitempty"`
	// Urgent puts the message ahead of normal mail in its recipient's
	// inbox (FIFO among urgent ones: pkg/store/lanes.go, issue 37.3). Only
	// the sender's gateway sets it, for a sender within its urgent-rate;
	// it is signed with the rest, and a gateway older than it delivers
	// the message as normal mail.
	Urgent  bool      `json:"urgent,omitempty"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires,omitzero"`
	Body    string    `json:"body"`
	// Sealed is the body sealed to the hosts that deliver the message
	// (pkg/seal, issue 27): base64 in JSON, Body "" beside it. The
	// receiving gateway opens it after it checked the signature, so
	// nothing past the broker sees an envelope with Sealed set.
	Sealed []byte `json:"sealed,omitempty"`
	// ClearGids are, on a sealed broadcast, the member inboxes (on hosts
	// that announce no sealing key: seal-fallback, plaintext-hosts) that
	// get their copy in the clear instead, one each, under the same msg
	// id (issue 36). Signed with the rest, so such an inbox's host drops
	// the sealed copy it cannot open there: the sender itself says so. A
	// member not named (one the sender did not know of) refuses it, as
	// sealed to other hosts, loudly.
	ClearGids []string `json:"clear_gids,omitempty"`
}

// SealOverhead bounds what sealing adds to a body of max bytes sealed to
// hosts hosts (pkg/seal's frame): the frame's head and key ids (8 bytes a
// host), the age header (an X25519 stanza of 98 bytes a host, its MAC),
// the recipient table's hash and the binding (at most 1 KiB), and a
// 16-byte tag per 64 KiB chunk. Decode refuses sealed bytes longer than
// max plus this, as it refuses a body over max.
func SealOverhead(max, hosts int) int {
	return 2048 + hosts*(8+128) + 16*(max/65536+2)
}

// MaxSealHosts is how many hosts one sealed message may name
// (pkg/seal.MaxRecipients).
const MaxSealHosts = 4096

// MaxClearGids is how many member inboxes one sealed broadcast may name
// as getting their copies in the clear (ClearGids).
const MaxClearGids = 4096

// sealedHosts reads how many hosts sealed bytes name: pkg/seal's frame
// begins "fsl1" and that count (a uvarint). false: not sealed bytes.
func sealedHosts(b []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(b, []byte("fsl1"))
	if !ok {
		return 0, false
	}
	n, w := binary.Uvarint(rest)
	if w <= 0 || n == 0 || n > MaxSealHosts {
		return 0, false
	}
	return int(n), true
}

// NewID returns a fresh identifier for msg ids, trace ids and gids: a
// UUIDv7 (RFC 9562) from github.com/google/uuid, time-ordered, so ids
// written together land together in the store's B+tree (fewer pages per
// commit than random v4 ids). The package keeps a process's ids strictly
// increasing within a millisecond (its 12 bits of sub-millisecond time
// are a count). It links net and a few hash packages into every short
// command: a short command's start costs a little more (see the commit
// that restored it); the product names it as a chosen dependency.
func NewID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// ValidID reports whether s is a message id as NewID makes them: a UUID in
// its canonical lower-case form (a client may mint its own, fleet-send
// --id, so a retry names the same message).
func ValidID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

// NewToken returns 32 random bytes, hex encoded.
func NewToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// New returns an envelope of kind k with a fresh msg id, the current schema
// and creation time. The trace id is fresh too unless the caller sets it.
func New(k Kind, from, to Party, body string) *Envelope {
	return &Envelope{
		Schema:    Version,
		MsgID:     NewID(),
		Kind:      k,
		Sender:    from,
		Recipient: to,
		TraceID:   NewID(),
		Created:   time.Now().UTC(),
		Body:      body,
	}
}

// Expired reports whether the envelope carries an expiry that has passed.
func (e *Envelope) Expired(now time.Time) bool {
	return !e.Expires.IsZero() && !now.Before(e.Expires)
}

// Digest returns the size and sha256 of the body: what the audit log
// records instead of the text.
func (e *Envelope) Digest() (int, string) {
	sum := sha256.Sum256([]byte(e.Body))
	return len(e.Body), hex.EncodeToString(sum[:])
}

// CheckBody validates a body against the limit: non-empty, valid UTF-8 and
// at most max bytes.
func CheckBody(body []byte, max int) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return fault.New(fault.Data, fault.KindEmptyBody, "message body is empty")
	}
	if len(body) > max {
		return fault.New(fault.Data, fault.KindBodyTooLarge,
			"message body is %d bytes, over the %d-byte limit", len(body), max)
	}
	if !utf8.Valid(body) {
		return fault.New(fault.Data, fault.KindBadUTF8, "message body is not valid UTF-8 text")
	}
	return nil
}

// Encode returns the JSON encoding of e (json.Marshal). It was once
// written by hand through internal/jsonw; in the same runs of
// scripts/bench-libs.sh (2026-12-02) json.Marshal took 0.37-0.99x its
// time on a 512-byte message, so the library does it.
func Encode(e *Envelope) ([]byte, error) { return json.Marshal(e) }

// Unmarshal decodes data into e (json.Unmarshal; no checks: Decode makes
// them). It was once a scanner of its own (internal/jsonw); in the same
// runs of scripts/bench-libs.sh (2026-12-02; the stored form of a 512-byte
// message) json.Unmarshal took 0.24-2.25x its time, median 0.87-1.69x
// over three sets of runs on a busy machine, and half its allocations:
// not clearly faster, so the library does it.
func Unmarshal(data []byte, e *Envelope) error { return json.Unmarshal(data, e) }

// ParseVersion splits "major.minor".
func ParseVersion(v string) (major, minor int, err error) {
	a, b, ok := strings.Cut(v, ".")
	if !ok {
		return 0, 0, fmt.Errorf("schema version %q is not major.minor", v)
	}
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return 0, 0, fmt.Errorf("schema version %q is not major.minor", v)
	}
	return major, minor, nil
}

// Decode parses and validates one envelope. It reads the schema version
// first and refuses a newer major without looking at anything else; within
// the major, unknown fields are ignored. The body is checked against max
// (0 means DefaultMaxBody).
func Decode(data []byte, max int) (*Envelope, error) {
	if max <= 0 {
		max = DefaultMaxBody
	}
	// encoding/json would quietly replace invalid bytes with U+FFFD
	if !utf8.Valid(data) {
		return nil, fault.New(fault.Data, fault.KindBadUTF8, "envelope is not valid UTF-8")
	}
	// The common case in one parse: a whole envelope of this major. Anything
	// else is read again below, schema first, to say what is wrong with it.
	var e Envelope
	if err := Unmarshal(data, &e); err == nil && e.Schema != "" {
		if major, _, err := ParseVersion(e.Schema); err == nil && major == Major {
			if err := e.Validate(max); err != nil {
				return nil, err
			}
			return &e, nil
		}
	}
	var head struct {
		Schema *string `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fault.Wrap(fault.Data, fault.KindBadEnvelope, err, "envelope is not valid JSON")
	}
	if head.Schema == nil {
		return nil, fault.New(fault.Data, fault.KindBadEnvelope, "envelope has no schema version")
	}
	major, _, err := ParseVersion(*head.Schema)
	if err != nil {
		return nil, fault.Wrap(fault.Data, fault.KindBadEnvelope, err, "bad envelope")
	}
	if major > Major {
		return nil, fault.New(fault.Data, fault.KindNewerSchema,
			"envelope schema %s is newer than this build understands (%d.x)", *head.Schema, Major).
			WithHint("upgrade fleet on this host")
	}
	if major < Major {
		return nil, fault.New(fault.Data, fault.KindBadEnvelope,
			"envelope schema %s is older than the oldest this build reads (%d.x)", *head.Schema, Major)
	}
	e = Envelope{}
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fault.Wrap(fault.Data, fault.KindBadEnvelope, err, "bad envelope")
	}
	if err := e.Validate(max); err != nil {
		return nil, err
	}
	return &e, nil
}

// Validate checks the fields every envelope must carry.
func (e *Envelope) Validate(max int) error {
	bad := func(format string, args ...any) error {
		return fault.New(fault.Data, fault.KindBadEnvelope, "bad envelope: "+format, args...)
	}
	switch {
	case e.MsgID == "":
		return bad("no msg_id")
	case !e.Kind.Known():
		return bad("unknown kind %q", e.Kind)
	case e.TraceID == "":
		return bad("no trace_id")
	case e.Created.IsZero():
		return bad("no created time")
	case e.Hops < 0:
		return bad("hops %d is negative", e.Hops)
	case e.Recipient.Gid == "" && e.Recipient.Group == "":
		return bad("no recipient")
	}
	if len(e.Body) > max {
		return fault.New(fault.Data, fault.KindBodyTooLarge,
			"message body is %d bytes, over the %d-byte limit", len(e.Body), max)
	}
	if e.Sealed != nil {
		hosts, sealed := sealedHosts(e.Sealed)
		switch {
		case e.Body != "":
			return bad("a sealed body beside a plain one")
		case !sealed:
			return bad("a sealed body that is not sealed bytes")
		case len(e.Sealed) > max+SealOverhead(max, hosts):
			return fault.New(fault.Data, fault.KindBodyTooLarge,
				"sealed body is %d bytes, over the %d-byte limit and what sealing adds", len(e.Sealed), max)
		}
	}
	switch {
	case e.ClearGids == nil:
	case e.Kind != Broadcast:
		return bad("clear_gids on a message that is not a broadcast")
	case len(e.ClearGids) > MaxClearGids:
		return bad("clear_gids names %d inboxes, over %d", len(e.ClearGids), MaxClearGids)
	}
	if !utf8.ValidString(e.Body) {
		return fault.New(fault.Data, fault.KindBadUTF8, "message body is not valid UTF-8 text")
	}
	return nil
}
