package gateway

// sealing.go — the broker never holds readable text (issue 27).
//
// Every message this gateway publishes that carries text (sealKinds) has
// its body sealed (pkg/seal) to the hosts that will deliver it, and to
// this host too: the sender opens its own bounces and dead letters (and
// a dead letter's copy this host publishes to bridge.dlq of another
// host's message is sealed to that sender's host as well). One
// stanza per host, sealed once per message however many copies the
// broker makes: a message to one entity or a control request names its
// host; a broadcast to a group names each host with members in the group
// as the peers' presence says; broadcast.all names every trusted host.
// The body is bound to its message (kind, msg id, signing host), so a
// host cannot put sealed bytes it saw into a message of its own.
//
// A host's key is, in this order: the one it announced in its own
// authentic presence (announced), the one its operator certificate names,
// the one its trust line names (HOST SIGNING-KEY SEALING-KEY).
//
// Secure by default, and never silently downgraded (issue 36): a host
// with no key gets no text. A send, reply, broadcast, ask, answer or
// spawn request that one trusted host with no key would deliver fails
// before anything is published, stored or waited for (77, no_seal_key,
// naming every such host and the command that fixes it: Check, called
// by each of them first), unless plaintext-hosts names the host or
// seal-fallback = clear: then that host alone gets text in the clear,
// with a WARN line per such host at most once a minute, and the
// sender's JSON (clear_hosts) and its audit line (fleet-trace) name it. A broadcast
// stays one sealed publish to broadcast.<group> for the hosts with keys;
// each member of a host without one that the peers' presence lists gets
// a copy in the clear of its own, under the same msg id, to its gid, so
// no host with a key ever gets text in the clear. The sealed copy names
// those members (clear_gids, signed): their hosts drop the sealed copy
// in those inboxes (audited, no dead letter, no bounce). A member the
// sender did not know of refuses the sealed copy as sealed_elsewhere,
// loudly, as before.
//
// What comes in is opened after the signature and every claim were
// checked (the broker calls Open after its verifier): sealed to other
// hosts (sealed_elsewhere), to a key this host no longer holds
// (unknown_seal_key), altered or bound to another message (tampered), or
// text in the clear from a host plaintext-hosts does not name
// (unsealed): refused to bridge.dlq with that reason, like any refusal.

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
)

// sealKinds are the kinds whose body is text someone wrote or a program
// printed: sealed across hosts. Receipts, presence, STOP, TRACE and its
// answers carry ids, states, sizes and reasons only (what the audit log
// records) and travel as they are.
var sealKinds = map[envelope.Kind]bool{
	envelope.Send: true, envelope.Reply: true, envelope.Ask: true, envelope.Answer: true,
	envelope.TooLate: true, envelope.Broadcast: true, envelope.Spawn: true,
	envelope.SpawnResult: true, envelope.StopResult: true, envelope.Bounce: true,
}

// plainWarnEvery bounds the WARN lines about one host getting plain text.
const plainWarnEvery = time.Minute

// sealing seals what this gateway publishes and opens what it takes in:
// the broker's Sealer. It owns the parsed keys and the WARN rate limits.
type sealing struct {
	host    string
	keys    *seal.Keyring
	file    *trust.File
	certs   *certs
	maxBody int
	log     *slog.Logger
	// plaintext are the hosts named in plaintext-hosts.
	plaintext map[string]bool
	// fallback: seal-fallback = clear, every trusted host with no key
	// gets text in the clear (false: refused, 77)
	fallback bool
	// announced is the key host announced in its own authentic presence
	// ("" unknown); nil: none heard (wired by the gateway).
	announced func(host string) string
	// members are the hosts with members of group, as the peers'
	// presence says; everyone the hosts trusted now.
	members  func(group string) []string
	everyone func() []string
	// trusted says whether this gateway admits host (nil: every host).
	// A host it does not trust and knows no key of gets sealed bytes it
	// cannot open, not a 77: the broker answers whether it exists (67)
	// and it refuses the message if it does.
	trusted func(host string) bool
	// spawn holds an opened SPAWN's body to the grammar admission holds
	// a readable one to (admit.go, checkSpawn); nil: not checked
	spawn func(body string) error
	now   func() time.Time // nil: time.Now

	mu     sync.Mutex
	parsed map[string]*seal.Recipient // age1... -> parsed
	warned map[string]time.Time       // what was said -> when, for the rate limits
	kept   map[string]keptSeal        // msg id -> sealed ahead by Kept, for its Seal
	opened map[[32]byte]string        // a broadcast's sealed bytes and binding -> its text
	order  [][32]byte                 // opened, oldest first
	size   int                        // bytes of text in opened
}

// A broadcast reaches a host as one copy per member inbox, the same
// sealed bytes each time: its text is kept after the first open (at most
// maxOpened broadcasts, openedBytes of text), so the others cost a hash.
const (
	maxOpened   = 64
	openedBytes = 8 << 20
)

// keptSeal is a body sealed by Kept ahead of its publish.
type keptSeal struct {
	body   string
	sealed []byte
}

// maxKept bounds the bodies sealed ahead and not published yet.
const maxKept = 64

func newSealing(host string, keys *seal.Keyring, file *trust.File, c *certs, plaintext []string, maxBody int, log *slog.Logger) *sealing {
	s := &sealing{host: host, keys: keys, file: file, certs: c, maxBody: maxBody, log: log,
		plaintext: map[string]bool{}, parsed: map[string]*seal.Recipient{}, warned: map[string]time.Time{}, kept: map[string]keptSeal{}, opened: map[[32]byte]string{}}
	for _, h := range plaintext {
		s.plaintext[h] = true
	}
	if len(plaintext) > 0 {
		log.Warn("plaintext-hosts: message text to and from these hosts is NOT sealed: the broker, its disk and its backups can read it",
			"hosts", strings.Join(plaintext, ","), "fix", "upgrade them, add their sealing keys (fleet-gw key there; fleet-gw trust add HOST SIGNING-KEY SEALING-KEY here), and remove them from plaintext-hosts")
	}
	return s
}

func (s *sealing) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// keyOf is host's sealing key, nil if it announces none.
func (s *sealing) keyOf(host string) *seal.Recipient {
	if host == s.host {
		return s.keys.Public()
	}
	var texts []string
	if s.announced != nil {
		texts = append(texts, s.announced(host))
	}
	texts = append(texts, s.certs.SealKey(host, s.clock()))
	if k, ok := s.file.SealKey(host); ok {
		texts = append(texts, k)
	}
	for _, t := range texts {
		if t == "" {
			continue
		}
		s.mu.Lock()
		r, ok := s.parsed[t]
		s.mu.Unlock()
		if !ok {
			var err error
			if r, err = seal.ParseRecipient(t); err != nil {
				s.once("badkey/"+host+"/"+t, "a sealing key of a host does not read: ignored", "peer", host, "err", err)
				continue
			}
			s.mu.Lock()
			if len(s.parsed) > 4096 {
				clear(s.parsed)
			}
			s.parsed[t] = r
			s.mu.Unlock()
		}
		return r
	}
	return nil
}

// once logs a WARN line for what at most once per plainWarnEvery.
func (s *sealing) once(what, msg string, args ...any) {
	now := s.clock()
	s.mu.Lock()
	last, said := s.warned[what]
	if said && now.Sub(last) < plainWarnEvery {
		s.mu.Unlock()
		return
	}
	if len(s.warned) > 4096 {
		clear(s.warned)
	}
	s.warned[what] = now
	s.mu.Unlock()
	s.log.Warn(msg, args...)
}

// hosts are the hosts that deliver env: its recipient's, or for a
// whole broadcast those with members in its group (every trusted one for
// "all"). Sorted, without this host.
func (s *sealing) hosts(env *envelope.Envelope) []string {
	var hs []string
	switch r := env.Recipient; {
	case r.Gid != "" && ident.GidHost(r.Gid) != "":
		// a gid names the host it lives on (a broadcast's copy for one
		// member too: in the clear, or a dead letter)
		hs = []string{ident.GidHost(r.Gid)}
	case env.Kind == envelope.Broadcast && r.Group == "all":
		hs = s.everyone()
	case env.Kind == envelope.Broadcast:
		hs = s.members(r.Group)
	case r.Host != "":
		hs = []string{r.Host}
	}
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		if h != s.host && h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// Seal seals env's body to the hosts that deliver it and this one (the
// broker's Sealer; env is the broker's copy).
func (s *sealing) Seal(env *envelope.Envelope) error {
	s.mu.Lock()
	k, ok := s.kept[env.MsgID]
	delete(s.kept, env.MsgID)
	s.mu.Unlock()
	if ok && k.body == env.Body && env.Sealed == nil {
		env.Sealed, env.Body = k.sealed, "" // as Kept recorded it
		return nil
	}
	return s.seal(env)
}

// sealPlan is how a message's text reaches the hosts that deliver it.
type sealPlan struct {
	to      []*seal.Recipient // this host's key and each keyed host's
	clear   []string          // hosts with no key allowed text in the clear (plaintext-hosts, seal-fallback = clear), sorted
	refused []string          // trusted hosts with no key that neither allows, sorted
}

// plan sorts the hosts that deliver env by how its text reaches them; an
// untrusted host with no key is in none: it gets bytes it cannot open.
func (s *sealing) plan(env *envelope.Envelope) sealPlan {
	p := sealPlan{to: []*seal.Recipient{s.keys.Public()}}
	for _, h := range s.hosts(env) {
		switch k := s.keyOf(h); {
		case k != nil:
			p.to = append(p.to, k)
		case s.plaintext[h]:
			p.clear = append(p.clear, h)
		case s.trusted != nil && !s.trusted(h):
			// not ours to talk to: it gets nothing it can read
		case s.fallback:
			p.clear = append(p.clear, h)
		default:
			p.refused = append(p.refused, h)
		}
	}
	return p
}

// whole is a broadcast as one publish to broadcast.<group>, not a copy
// for one member (Recipient.Gid set: a copy in the clear).
func whole(env *envelope.Envelope) bool {
	return env.Kind == envelope.Broadcast && env.Recipient.Gid == ""
}

// Check says, before anything is published or stored, which hosts that
// deliver env get its text in the clear (sorted), or refuses it (77)
// naming every trusted host with no key that neither plaintext-hosts
// nor seal-fallback = clear allows. nil s: single-host mode, nothing.
func (s *sealing) Check(env *envelope.Envelope) ([]string, error) {
	if s == nil || !sealKinds[env.Kind] || env.Body == "" || env.Sealed != nil {
		return nil, nil
	}
	p := s.plan(env)
	if len(p.refused) > 0 {
		return nil, refusedHosts(env, p.refused)
	}
	return p.clear, nil
}

// refusedHosts is the 77 of a message hosts would deliver with no key.
func refusedHosts(env *envelope.Envelope, hosts []string) error {
	what := fmt.Sprintf("%s %s not sent", strings.ToLower(string(env.Kind)), env.MsgID)
	if whole(env) {
		what = fmt.Sprintf("broadcast %s not sent to any host, nor stored here", env.MsgID)
	}
	if len(hosts) == 1 {
		h := hosts[0]
		return fault.New(fault.Refused, fault.KindNoSealKey,
			"host %s announces no sealing key: no text is sent to it (the broker would hold it readable); %s", h, what).
			WithHint("on %s run `fleet-gw key`, then here: fleet-gw trust add %s SIGNING-KEY SEALING-KEY with the line it prints (or, to send it text the broker can read, name it in plaintext-hosts or set seal-fallback = clear)", h, h)
	}
	list := strings.Join(hosts, ", ")
	return fault.New(fault.Refused, fault.KindNoSealKey,
		"hosts %s announce no sealing key: no text is sent to them (the broker would hold it readable); %s", list, what).
		WithHint("on each of %s run `fleet-gw key`, then here: fleet-gw trust add HOST SIGNING-KEY SEALING-KEY with the line it prints (or, to send them text the broker can read, name them in plaintext-hosts or set seal-fallback = clear)", list)
}

func (s *sealing) seal(env *envelope.Envelope) error {
	if env.Sealed != nil {
		// sealed bytes are bound to their message: sent again under
		// another id or host, nobody could open them
		return fault.New(fault.Software, fault.KindInternal, "message %s is sealed already: open it before sending it again", env.MsgID)
	}
	if !sealKinds[env.Kind] || env.Body == "" {
		return nil
	}
	p := s.plan(env)
	if len(p.refused) > 0 {
		return refusedHosts(env, p.refused)
	}
	if len(p.clear) > 0 && !whole(env) {
		// one host delivers it, and it has no key: in the clear
		for _, h := range p.clear {
			why := "plaintext-hosts names this host"
			if !s.plaintext[h] {
				why = "seal-fallback = clear"
			}
			s.once("plain/"+h, "sending text in the clear: this host announces no sealing key and "+why+" (the broker can read it)",
				"peer", h, "msg_id", env.MsgID, "trace_id", env.TraceID, "kind", string(env.Kind))
		}
		return nil
	}
	// a whole broadcast: sealed to the hosts with keys; the members of
	// those without one have copies in the clear of their own (clear_gids)
	to := p.to
	if h := env.Sender.Host; h != "" && h != s.host {
		// a copy this host publishes of another host's message (a dead
		// letter to bridge.dlq): its sender may open it too, if it can
		if k := s.keyOf(h); k != nil {
			to = append(to, k)
		}
	}
	sealed, err := seal.Seal(seal.Bind(string(env.Kind), env.MsgID, s.host), []byte(env.Body), to)
	if err != nil {
		return fault.Wrap(fault.Software, fault.KindInternal, err, "sealing message %s", env.MsgID)
	}
	env.Sealed, env.Body = sealed, ""
	return nil
}

// Kept is what the store keeps of a message this host publishes (see
// keptBytes, refusals.go): the envelope exactly as it will be published,
// so a refusal notice that carries only the digest of the sealed bytes
// matches it. The body is sealed here, ahead, and Seal reuses it for the
// same message. nil: nothing kept (a short message, or no sealing).
func (s *sealing) Kept(env *envelope.Envelope) []byte {
	if s == nil || keptBytes(env) == nil {
		return keptBytes(env)
	}
	c := *env
	if err := s.seal(&c); err != nil || c.Sealed == nil {
		return keptBytes(env) // in the clear, or not published at all
	}
	raw, err := envelope.Encode(&c)
	if err != nil {
		return nil
	}
	s.mu.Lock()
	if len(s.kept) >= maxKept {
		clear(s.kept) // published by now, or never: sealed again then
	}
	s.kept[env.MsgID] = keptSeal{body: env.Body, sealed: c.Sealed}
	s.mu.Unlock()
	return raw
}

// Plain is a message this host signed and published (raw, as it came
// back: a broker death, a refusal notice's copy, the bytes kept), with
// its body opened, for its sender's dead letter on this host: the local
// store holds text as it always did, and a replay seals it anew. raw as
// it is when it is not sealed or does not open (never an error: the
// dead letter is kept either way).
func (s *sealing) Plain(raw []byte) []byte {
	if s == nil {
		return raw
	}
	env, err := envelope.Decode(raw, 1<<30)
	if err != nil || env.Sealed == nil {
		return raw
	}
	plain, err := seal.Open(seal.Bind(string(env.Kind), env.MsgID, s.host), env.Sealed, s.keys)
	if err != nil || !utf8.Valid(plain) {
		s.log.Warn("a dead letter of this host's does not open with its keys: kept sealed", "msg_id", env.MsgID, "err", err)
		return raw
	}
	env.Body, env.Sealed, env.ClearGids = string(plain), nil, nil
	out, err := envelope.Encode(env)
	if err != nil {
		return raw
	}
	return out
}

// Open opens env's sealed body (the broker's Sealer), env signed by host
// and admitted; a text in the clear is accepted only from a host named
// in plaintext-hosts.
func (s *sealing) Open(host string, env *envelope.Envelope) error {
	if env.Sealed == nil {
		if sealKinds[env.Kind] && env.Body != "" && !s.plaintext[host] {
			return broker.Refuse(broker.ReasonUnsealed, "a %s in the clear from %s, which plaintext-hosts does not name", env.Kind, host)
		}
		return nil
	}
	bind := seal.Bind(string(env.Kind), env.MsgID, host)
	var memo [32]byte
	if env.Kind == envelope.Broadcast {
		h := sha256.New()
		h.Write([]byte(bind))
		h.Write([]byte{0})
		h.Write(env.Sealed)
		h.Sum(memo[:0])
		s.mu.Lock()
		text, ok := s.opened[memo]
		s.mu.Unlock()
		if ok {
			env.Body, env.Sealed, env.ClearGids = text, nil, nil
			return nil
		}
	}
	plain, err := seal.Open(bind, env.Sealed, s.keys)
	if err != nil {
		var se *seal.Error
		reason := broker.ReasonTampered
		if errors.As(err, &se) {
			switch se.Reason() {
			case "not_for_us":
				reason = broker.ReasonSealedElsewhere
				if env.Kind == envelope.Broadcast && env.Recipient.Gid != "" &&
					ident.GidHost(env.Recipient.Gid) == s.host && slices.Contains(env.ClearGids, env.Recipient.Gid) {
					// the sending host signed that this inbox gets its
					// copy in the clear (env.Recipient.Gid is the inbox
					// it came from: the broker's admit)
					return broker.Dropped("a sealed broadcast whose sender %s sends this member its copy in the clear (clear_gids)", host)
				}
			case "unknown_seal_key":
				reason = broker.ReasonUnknownSealKey
			}
		}
		return broker.Refuse(reason, "sealed body: %v", err)
	}
	switch {
	case len(plain) > s.maxBody:
		return broker.Refuse(broker.ReasonMalformed, "sealed body of %d bytes, over this host's %d-byte limit", len(plain), s.maxBody)
	case !utf8.Valid(plain):
		return broker.Refuse(broker.ReasonMalformed, "sealed body is not UTF-8 text")
	}
	env.Body, env.Sealed, env.ClearGids = string(plain), nil, nil
	if env.Kind == envelope.Broadcast && len(plain) <= openedBytes/8 {
		s.remember(memo, env.Body)
	}
	if env.Kind == envelope.Spawn && s.spawn != nil {
		return s.spawn(env.Body) // as admission does for a body it can read
	}
	return nil
}

// remember keeps a broadcast's text for its other copies.
func (s *sealing) remember(key [32]byte, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.opened[key]; ok {
		return
	}
	for len(s.order) > 0 && (len(s.order) >= maxOpened || s.size+len(text) > openedBytes) {
		old := s.order[0]
		s.order = s.order[1:]
		s.size -= len(s.opened[old])
		delete(s.opened, old)
	}
	s.opened[key] = text
	s.order = append(s.order, key)
	s.size += len(text)
}

// clearReason is what the audit line of a message says of the hosts
// that got it in the clear (fleet-trace shows it).
func clearReason(hosts []string) string {
	if len(hosts) == 0 {
		return ""
	}
	return "in the clear to " + strings.Join(hosts, ",")
}
