package gateway

// refusals.go — a refusal is told to its sender (issue 24, point 3).
//
// A message this host refuses from the broker (its sender's host not
// admitted here, a bad signature, a replay, a malformed field, a claim
// that does not fit) goes to bridge.dlq as before (broker/auth.go). When
// it is a SEND or a REPLY to an entity of this host, this host also tells
// the host it claims to come from: a dead RECEIPT for it, with the reason,
// and with the refused bytes and their signature exactly as they came.
//
// The receiver cannot know who really sent what it refuses, so the notice
// proves nothing by itself; the sender decides what to believe
// (believeRefusal): the notice must be signed by a host it trusts (the
// admission check, as for every receipt), come from the recipient of the
// message, and carry bytes this host signed itself with that msg id,
// sender and recipient. Then its outbound record goes from accepted to
// dead with the reason, the bytes are kept as its dead letter (so
// fleet-dlq replay works there once the cause is fixed), and its sender
// gets a BOUNCE. A forged notice could only kill a message of ours that
// the signer of the notice received: that host could as well refuse it.
// A notice of bytes this host did not sign (a forgery in its name, which
// the receiver rightly refused) is ignored quietly: a forger cannot make
// this host's log noisy through another host.
//
// Noise: a notice goes for a real message only (never for presence,
// receipts, bounces or broadcast copies), and at most noticesPerMinute a
// minute to one host. The notices over that wait, in order, for the next
// minutes (offer): a burst of 200 refusals from one host is told in
// full within three minutes, 60 notices a minute. The waiting ones are
// bounded in memory (noticeQueueBytes, all hosts: full copies in its
// first quarter, then the copy's digest, which the sender believes as
// any dead receipt from there when it kept no bytes: the record is dead
// and bounced, without a dead letter to replay); only past that is a
// notice dropped, counted in one log line a minute, its copy in
// bridge.dlq the only trace. An answer that expired while it waited (a
// control or trace answer) is not sent.
//
// A TRACE refused here is answered as refused (refusedTrace): fleet-trace
// names this host `refused` with the reason at once (exit 77), instead of
// as silent at its timeout. The requester believes it as any trace
// answer: from a host it asked, about its trace, to a query still open.
//
// An ASK refused there is told the same way: the asker's fleet-ask fails
// at once with the reason (77 refused_by_host), not at its TTL. An ask
// has no record and no dead letter (it is live-only): the waiting turn
// ends, and the audit log says dead. A SPAWN or STOP refused there is
// answered as a request this host could not carry out (refusedControl):
// fleet-spawn or fleet-stop fails at once with the same 77.
//
// A message whose body this host cannot read (a newer schema, a
// malformed one, one over this host's max-body) is told too when the
// delivery says where it came from: its msg id and kind (AMQP message id
// and type), its sender (the fleet-sender header, or the body's sender
// when the body is JSON), the signing host and the inbox it was in
// (broker.unreadHead). None of that is proven, and need not be: the sender
// still believes only bytes it signed itself, with that msg id, to that
// recipient. A delivery that does not say all of that (no msg id or no
// sender gid: a hand-made publish, bytes that are not JSON from a sender
// without the header) has nobody to tell: its copy in bridge.dlq is the
// only trace.
//
// Sealed messages (sealing.go) are refused like the others, with their
// reasons (sealed_elsewhere, unknown_seal_key, tampered, unsealed), and
// told the same way: the copy a notice carries is the sealed bytes as
// published, which the sender opens with its own key (every message is
// sealed to its sender's host too). A refused message that carries text
// in the clear (from a host named in plaintext-hosts, or refused as
// unsealed) is told by its digest only, never quoted back through the
// broker.
//
// A copy too big to quote (the notice must fit this host's max-body, and
// base64 grows it by a third: a message over about 750 KiB with the
// default 1 MiB) is carried as its sha256 instead, with the signature.
// The sender keeps the bytes of each large message it publishes until it
// settles (store.RecordOutboundKeep, keepSentOver) and matches the digest
// against them; a sender that kept nothing (a receiver with a smaller
// max-body than keepSentOver allows for) settles the message dead as on
// any dead receipt from the recipient's host, without a dead letter.

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	hexenc "encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

const (
	// noticesPerMinute bounds the refusal notices sent to one host a
	// minute; the rest wait for the next minutes (offer).
	noticesPerMinute = 60
	// noticeQueueBytes bounds the memory of the notices waiting, all
	// hosts together. Full copies take at most a quarter of it; past
	// that a notice waits as its digest form, about 1.5 KiB: at least
	// eight thousand notices wait before one is dropped.
	noticeQueueBytes = 16 << 20
	// maxNoticeHosts bounds the hosts this gateway keeps a count for.
	maxNoticeHosts = 256
)

// keepSentOver: a message this host publishes whose envelope is longer
// than this keeps its bytes in the store until it settles, so a refusal
// notice that can only carry their digest can be matched. A notice quotes
// a copy whole when it fits the receiver's max-body: at the default 1 MiB,
// up to about 750 KiB.
const keepSentOver = 256 << 10

// refusedCopy is what a refusal notice carries of the refused message:
// the bytes, or when they are too big to quote, their sha256.
type refusedCopy struct {
	Why    string `json:"why"`              // the broker.Reason constant
	Body   string `json:"body,omitempty"`   // base64 of the bytes as published
	SHA256 string `json:"sha256,omitempty"` // hex sha256 of those bytes, when Body is too big to carry
	Sig    string `json:"sig"`              // base64 of their fleet-sig
}

// errNotKept: a refusal notice carries a digest only, and this host kept
// no bytes of that message to match it against.
var errNotKept = errors.New("a refusal notice with a digest, and no bytes kept here to match")

// refusalNotices sends the notices of one gateway. It owns the per-host
// counts of notices sent in the current minute.
type refusalNotices struct {
	host    string
	maxBody int                                     // a notice must fit a body
	publish func(to string, env *envelope.Envelope) // on the side: never blocks the caller
	log     *slog.Logger
	// local is this host's own paths (state folder, trust file, socket,
	// config file): a notice crosses to another host, trusted or not, and
	// names none of them (public)
	local []string

	now   func() time.Time                // nil: time.Now (tests: a fake clock)
	later func(d time.Duration, f func()) // nil: time.AfterFunc

	mu     sync.Mutex
	runs   map[string]*noticeRun // sender host -> this minute's notices
	queued int                   // bytes of the notices queued, all hosts
}

// noticeRun is one host's minute: the notices sent in it, those waiting
// for a later one (oldest first), those dropped.
type noticeRun struct {
	start   time.Time
	sent    int
	dropped int
	queue   []*pendingNotice
	timer   bool // a flush is armed for the end of the minute
}

// localPaths is the non-empty paths of ps, the longest first (so a file
// in the state folder is hidden whole, not as the folder and a tail).
func localPaths(ps ...string) []string {
	var out []string
	for _, p := range ps {
		if p != "" && p != "/" {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// public is why m was refused as another host may hear it: "refused by
// HOST: reason", clipped, never this host's Local detail, and any of its
// own paths a reason still carries (an error from a part that named
// one) put as "<path on HOST>".
func (n *refusalNotices) public(r *broker.Refusal) string {
	s := r.Error()
	for _, p := range n.local {
		s = strings.ReplaceAll(s, p, "<path on "+n.host+">")
	}
	return clipReason("refused by " + n.host + ": " + s)
}

// refused is the broker's OnRefusedMsg: it sends a notice for m when one
// is owed and allowed.
func (n *refusalNotices) refused(m broker.RefusedMsg) {
	env := m.Env
	if (env.Kind == envelope.Spawn || env.Kind == envelope.Stop) && m.Queue == broker.ControlQueue(n.host) {
		n.refusedControl(m)
		return
	}
	if env.Kind == envelope.Trace && m.Queue == broker.ControlQueue(n.host) {
		n.refusedTrace(m)
		return
	}
	switch {
	case env.Kind != envelope.Send && env.Kind != envelope.Reply && env.Kind != envelope.Ask:
		return // only a message someone waits on
	case env.Recipient.Group != "" || ident.GidHost(env.Recipient.Gid) != n.host:
		return // a broadcast copy, or not for an entity of this host
	case len(m.Sig) == 0 || m.SignedBy == "" || m.SignedBy == n.host || env.Sender.Host != m.SignedBy:
		return // unsigned, ours, or not even claimed by its signer: nobody to tell
	case !ident.IsGid(env.Sender.Gid) || ident.GidHost(env.Sender.Gid) != m.SignedBy:
		return
	}
	reason := n.public(m.Refusal)
	at := n.clock().UTC()
	// notice is the RECEIPT carrying the copy whole, or (digest) its
	// sha256 and signature; nil when it does not fit a body
	notice := func(digest bool) *envelope.Envelope {
		rc := refusedCopy{Why: m.Refusal.Reason, Sig: base64.StdEncoding.EncodeToString(m.Sig)}
		if digest {
			sum := sha256.Sum256(m.Body)
			rc.SHA256 = hexenc.EncodeToString(sum[:])
		} else {
			rc.Body = base64.StdEncoding.EncodeToString(m.Body)
		}
		body, err := json.Marshal(receiptBody{MsgID: env.MsgID, State: store.Dead, Reason: reason, At: at, Refused: &rc})
		if err != nil || len(body) > n.maxBody {
			return nil
		}
		r := envelope.New(envelope.Receipt,
			envelope.Party{Gid: env.Recipient.Gid, Name: env.Recipient.Name, Host: n.host},
			envelope.Party{Gid: env.Sender.Gid, Name: env.Sender.Name, Host: env.Sender.Host}, string(body))
		r.TraceID, r.InReplyTo = env.TraceID, env.MsgID
		return r
	}
	var r *envelope.Envelope
	if env.Body == "" || !sealKinds[env.Kind] {
		// sealed (or no text): the copy goes back whole; text in the
		// clear goes back as its digest, not a second time readable
		// through the broker (sealing.go)
		r = notice(false)
	}
	if r == nil {
		// too big to carry back whole: its digest, for the sender to
		// match against the bytes it kept
		r = notice(true)
	}
	if r == nil {
		return
	}
	n.offer(m.SignedBy, env.Sender.Gid, r, func() *envelope.Envelope { return notice(true) })
}

// refusedControl answers a SPAWN or STOP refused here as this host
// answers any request it could not carry out: a SPAWN_RESULT or
// STOP_RESULT with the error (77 refused_by_host and the reason), to the
// requester it names, so its fleet-spawn or fleet-stop fails at once
// instead of at its timeout. Its gateway takes an answer only for a
// request of its own that went to this host, as for every answer; one
// for a request it never sent (a forgery in its name, refused here) is
// dropped there.
func (n *refusalNotices) refusedControl(m broker.RefusedMsg) {
	env := m.Env
	switch {
	case env.Recipient.Host != n.host || m.Unread:
		return // misrouted here, or nothing read: nobody known to tell
	case len(m.Sig) == 0 || m.SignedBy == "" || m.SignedBy == n.host || env.Sender.Host != m.SignedBy:
		return
	case !ident.IsGid(env.Sender.Gid) || ident.GidHost(env.Sender.Gid) != m.SignedBy:
		return
	}
	what, kind := "spawn", envelope.SpawnResult
	if env.Kind == envelope.Stop {
		what, kind = "stop", envelope.StopResult
	}
	err := fault.New(fault.Refused, fault.KindRefusedByHost, "%s request %s was %s", what, env.MsgID, n.public(m.Refusal)).
		WithHint("fix the cause on %s (fleet-gw trust list there; its log names the refusal), then run it again", n.host)
	data, jerr := json.Marshal(failed(env.MsgID, err))
	if jerr != nil || len(data) > n.maxBody {
		return
	}
	ans := envelope.New(kind, envelope.Party{Host: n.host}, env.Sender, string(data))
	ans.TraceID, ans.InReplyTo, ans.Expires = env.TraceID, env.MsgID, env.Expires
	n.offer(m.SignedBy, env.Sender.Gid, ans, nil)
}

// refusedTrace answers a TRACE refused here as this host answers a
// query whose audit log it cannot read: a TRACE_RESULT with no hops and
// the error "refused by HOST: reason", to the requester it names, so
// fleet-trace names this host as refused at once instead of as silent at
// its timeout. The requester's gateway takes it only for a query of its
// own still waiting for this host, about that trace (onTraceResult); one
// for a query it never sent (a forgery in its name, refused here) is
// dropped there, as any answer with nobody waiting. A query already
// expired, or one the requester would not match (no trace id), is not
// answered: nobody waits for it.
func (n *refusalNotices) refusedTrace(m broker.RefusedMsg) {
	env := m.Env
	switch {
	case env.Recipient.Host != n.host || m.Unread || env.Expired(n.clock()):
		return
	case len(m.Sig) == 0 || m.SignedBy == "" || m.SignedBy == n.host || env.Sender.Host != m.SignedBy:
		return
	case !ident.IsGid(env.Sender.Gid) || ident.GidHost(env.Sender.Gid) != m.SignedBy:
		return
	}
	var q traceQuery
	if err := json.Unmarshal([]byte(env.Body), &q); err != nil || !idRE.MatchString(q.TraceID) {
		return
	}
	body, err := json.Marshal(traceAnswer{TraceID: q.TraceID, Hops: []api.Hop{}, Refused: true,
		Error: n.public(m.Refusal)})
	if err != nil || len(body) > n.maxBody {
		return
	}
	res := envelope.New(envelope.TraceResult, envelope.Party{Host: n.host}, env.Sender, string(body))
	res.TraceID, res.InReplyTo, res.Expires = env.TraceID, env.MsgID, env.Expires
	n.offer(m.SignedBy, env.Sender.Gid, res, nil)
}

// keptBytes is what the store keeps of a message this host publishes to
// another (store.RecordOutboundKeep): its envelope as published when that
// is longer than keepSentOver, else nil. Asks keep nothing (live-only).
func keptBytes(env *envelope.Envelope) []byte {
	if (env.Kind != envelope.Send && env.Kind != envelope.Reply) || len(env.Body) <= keepSentOver/8 {
		return nil // even escaped six-fold, shorter than keepSentOver
	}
	raw, err := envelope.Encode(env)
	if err != nil || len(raw) <= keepSentOver {
		return nil
	}
	return raw
}

// Refused ends the wait of the fleet-ask waiting for ask msgID with why,
// when asker asked it of askee: the askee's host refused it (a refusal
// notice, believed). false: no such wait (it ended, or another's).
func (a *asks) Refused(msgID, asker, askee, why string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.waiting[msgID]
	if w == nil || w.gid != asker || w.to != askee || w.refused == nil {
		return false
	}
	delete(a.waiting, msgID) // an answer after this is TOO_LATE
	select {
	case w.refused <- why:
	default:
	}
	return true
}

// refusedAskFault is fleet-ask's error for an ask its askee's host
// refused: 77 refused_by_host, with the reason as that host gave it.
func refusedAskFault(env *envelope.Envelope, why string) error {
	return fault.New(fault.Refused, fault.KindRefusedByHost, "ask %s to %s was not delivered: %s", env.MsgID, env.Recipient.String(), why).
		WithHint("fix the cause on %s (fleet-gw trust list there; its log names the refusal), then ask again", env.Recipient.Host)
}

// pendingNotice is a notice waiting for a minute with room.
type pendingNotice struct {
	to    string
	env   *envelope.Envelope
	small func() *envelope.Envelope // the same notice with a digest for its copy; nil: none smaller
}

// size is what a queued notice holds in memory, about.
func (p *pendingNotice) size() int { return len(p.env.Body) + 1024 }

// offer sends env to the gid to, on host, now when this minute's count
// for host has room and nothing waits before it; else it queues it for
// the next minute with room. Past noticeQueueBytes queued (all hosts), a
// notice that has a smaller form (the copy's digest) is queued in that
// form (so full copies take at most a quarter of it, and the rest holds
// thousands of digests); one that still does not fit is dropped, counted in the minute's
// log line (its copy in bridge.dlq is then the only trace).
func (n *refusalNotices) offer(host, to string, env *envelope.Envelope, small func() *envelope.Envelope) {
	p := &pendingNotice{to: to, env: env, small: small}
	now := n.clock()
	n.mu.Lock()
	if n.runs == nil {
		n.runs = map[string]*noticeRun{}
	}
	run := n.runs[host]
	if run == nil && len(n.runs) >= maxNoticeHosts {
		for h, r := range n.runs { // forget the idle ones; a flood of hosts stays bounded
			if now.Sub(r.start) >= time.Minute && len(r.queue) == 0 && !r.timer {
				delete(n.runs, h)
			}
		}
		if len(n.runs) >= maxNoticeHosts {
			// every one of them busy this minute: a flood of claimed
			// host names (any refused message may claim one), not told
			n.mu.Unlock()
			n.log.Debug("refusal notice not sent: too many hosts owed notices", "host", host, "msg_id", env.InReplyTo, "hosts", maxNoticeHosts)
			return
		}
	}
	if run == nil {
		run = &noticeRun{start: now}
		n.runs[host] = run
	}
	out := n.due(host, run, now)
	if len(run.queue) == 0 && run.sent < noticesPerMinute {
		run.sent++
		out = append(out, p)
	} else {
		if n.queued+p.size() > noticeQueueBytes/4 && p.small != nil {
			if e := p.small(); e != nil {
				p.env, p.small = e, nil
			}
		}
		if n.queued+p.size() <= noticeQueueBytes {
			run.queue = append(run.queue, p)
			n.queued += p.size()
			n.schedule(host, run)
		} else {
			run.dropped++
		}
	}
	n.mu.Unlock()
	n.send(out)
}

// due starts a new minute for host's run when its minute is over (the
// dropped ones of the last logged), and takes from its queue the notices
// the minute has room for. n.mu held.
func (n *refusalNotices) due(host string, run *noticeRun, now time.Time) []*pendingNotice {
	if now.Sub(run.start) < time.Minute {
		return nil
	}
	if run.dropped > 0 {
		n.log.Warn("refusal notices not sent: too many for one host, and the queue is full", "host", host,
			"dropped", run.dropped, "per_minute", noticesPerMinute, "queue_bytes", noticeQueueBytes)
	}
	run.start, run.sent, run.dropped = now, 0, 0
	var out []*pendingNotice
	for len(run.queue) > 0 && run.sent < noticesPerMinute {
		p := run.queue[0]
		run.queue[0] = nil
		run.queue = run.queue[1:]
		n.queued -= p.size()
		if p.env.Expired(now) {
			continue // an answer nobody waits for any more
		}
		run.sent++
		out = append(out, p)
	}
	if len(run.queue) == 0 {
		run.queue = nil
	}
	return out
}

// schedule arms host's timer for the end of its run's minute, once.
// n.mu held.
func (n *refusalNotices) schedule(host string, run *noticeRun) {
	if run.timer {
		return
	}
	run.timer = true
	later := n.later
	if later == nil {
		later = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	later(run.start.Add(time.Minute).Sub(n.clock()), func() { n.flush(host) })
}

// flush sends what host's queue is due, and re-arms its timer while
// notices wait.
func (n *refusalNotices) flush(host string) {
	now := n.clock()
	n.mu.Lock()
	run := n.runs[host]
	if run == nil {
		n.mu.Unlock()
		return
	}
	run.timer = false
	out := n.due(host, run, now)
	if len(run.queue) > 0 {
		n.schedule(host, run)
	}
	n.mu.Unlock()
	n.send(out)
}

func (n *refusalNotices) send(out []*pendingNotice) {
	for _, p := range out {
		n.publish(p.to, p.env)
	}
}

func (n *refusalNotices) clock() time.Time {
	if n.now != nil {
		return n.now()
	}
	return time.Now()
}

// believedRefusal is a refusal notice this host believes: its message's
// bytes as sent (the dead letter) and the envelope they hold.
type believedRefusal struct {
	raw []byte
	env *envelope.Envelope
	at  time.Time
}

// believeRefusal checks a refusal notice from the broker (a RECEIPT whose
// signer the admission check already trusts) against own, this host's
// key: the bytes it carries (or, for a digest, the bytes kept returns for
// its msg id) are a message this host signed, with the notice's msg id,
// sent by the entity the notice is addressed to, to the entity the notice
// is from. Anything else is refused; a digest with no bytes kept here is
// errNotKept.
func believeRefusal(own ed25519.PublicKey, notice *envelope.Envelope, rb *receiptBody, kept func(msgID string) []byte) (*believedRefusal, error) {
	rc := rb.Refused
	if rb.State != store.Dead || len(rb.More) > 0 {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice must be one dead receipt")
	}
	raw, err1 := base64.StdEncoding.DecodeString(rc.Body)
	sig, err2 := base64.StdEncoding.DecodeString(rc.Sig)
	if err1 != nil || err2 != nil {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice with a copy that is not base64")
	}
	if rc.Body == "" {
		sum, err := hexenc.DecodeString(rc.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice with neither a copy nor a sha256")
		}
		raw = nil
		if kept != nil {
			raw = kept(rb.MsgID)
		}
		if len(raw) == 0 {
			return nil, errNotKept
		}
		if mine := sha256.Sum256(raw); hexenc.EncodeToString(mine[:]) != rc.SHA256 {
			return nil, broker.Refuse(broker.ReasonForged, "a refusal notice for message %s with a digest of bytes this host did not send", rb.MsgID)
		}
	}
	if len(own) == 0 || !ed25519.Verify(own, raw, sig) {
		return nil, broker.Refuse(broker.ReasonForged, "a refusal notice for message %s that this host did not sign", rb.MsgID)
	}
	env, err := envelope.Decode(raw, 1<<30)
	if err != nil {
		return nil, broker.Refuse(broker.ReasonMalformed, "a refusal notice with a copy that is not an envelope: %v", err)
	}
	if env.MsgID != rb.MsgID || env.Recipient.Gid != notice.Sender.Gid || env.Sender.Gid != notice.Recipient.Gid {
		return nil, broker.Refuse(broker.ReasonWrongHost, "a refusal notice for message %s from %s, which is not its recipient", rb.MsgID, notice.Sender.String())
	}
	at := rb.At.UTC()
	if at.IsZero() || at.After(time.Now().Add(maxSkew)) {
		at = time.Now().UTC()
	}
	return &believedRefusal{raw: raw, env: env, at: at}, nil
}
