// Package api is the gateway's local socket protocol and the one client
// every short command shares.
//
// Framing: each frame is a 4-byte big-endian length followed by that many
// bytes of JSON. A connection is a sequence of request/response pairs; the
// first request is always "hello", which fixes the protocol version. Only
// "recv" answers one request with a stream of batch frames, each of which the
// client acknowledges with an "ack" request before the next is sent.
//
// Bounds: a frame, once its first byte is sent, must be complete within the
// gateway's frame-timeout, and the first frame (hello) within frame-timeout
// of connecting (after it, between frames, a connection may idle as long as
// it likes); a connection over the gateway's max-connections gets one error
// frame (kind "too_many_connections", exit 75, naming what holds the
// connections) in place of the answer to its hello, and is closed. At the
// cap, a connection that has sent nothing yet may be closed, with the same
// kind of error frame, to admit a new one.
package api

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"slices"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// Proto is the socket protocol version this build speaks. A gateway
// refuses a hello with a different one.
const Proto = 1

// Ops.
const (
	OpHello  = "hello"
	OpJoin   = "join"
	OpLeave  = "leave"
	OpRoster = "roster"
	OpStatus = "status" // set busy|idle for the caller
	OpSend   = "send"
	OpLookup = "lookup" // delivery state of a msg id
	OpRecv   = "recv"
	OpAck    = "ack"
	OpDead   = "dead" // list dead letters
	OpWhoami = "whoami"
	OpWait   = "wait" // block until a message reaches a delivery state
	OpBcast  = "bcast"
	OpAsk    = "ask"    // live-only question: Sent, then the answer or a timeout
	OpGroups = "groups" // add/remove an entity's groups
	OpAccept = "accept" // change or read an entity's inbound policy
	OpSpawn  = "spawn"  // start an entity on a host through its launcher (U4); waits for the answer
	OpStop   = "stop"   // stop an entity wherever it lives (U4); waits for the answer
	// OpWaitReply resumes the wait of a send (MsgID) for its reply: the
	// reply, or an ask to the caller arriving first (Response.WaitingFor)
	OpWaitReply = "wait_reply"
	// OpGatewayStatus is fleet-gw status: the gateway's health (GatewayStatus)
	OpGatewayStatus = "gateway_status"
	// OpReplay delivers a dead letter again under a new msg id (fleet-dlq
	// replay): this host's (MsgID), or one from bridge.dlq (Raw, Sig,
	// SignedBy, as the broker holds it). Sent.Again: it was replayed before.
	// With Known, nothing is sent: Sent is the replay made before of this
	// host's dead letter MsgID, in its present state (67: none was made).
	OpReplay = "replay"
	// OpOpenDead opens a sealed dead letter with this host's sealing
	// keys: one from bridge.dlq (Raw, Sig, SignedBy, as for OpReplay),
	// once its signature is proven, or this host's (MsgID):
	// Response.Opened (its text only where readable).
	OpOpenDead = "open_dead"
	// OpPurgeDead removes this host's dead letters MsgIDs (Count: how many).
	OpPurgeDead = "purge_dead"
	// OpTrace is fleet-trace: the hops of one flow (TraceID) from this
	// host's audit log and, with a broker, every trusted host's, gathered
	// for at most TimeoutMS (Response.Trace)
	OpTrace = "trace"
	// OpWatch streams the gateway's events (WatchEvent, one per frame)
	// until the client closes: fleet-roster --watch, fleet-top. A watcher
	// that reads too slowly is dropped with a slow_watcher error.
	OpWatch = "watch"
	// OpAsks lists this host's open asks (Response.Asks): those its
	// entities put and wait on, and those put to its entities from other
	// hosts, not yet answered nor expired. Never their text, but for the
	// asks put to the caller when it asks for it (AsksRequest.Text)
	OpAsks = "asks"
)

// ErrorBody is a failure carried on the socket; it maps one to one onto
// fault.Error.
type ErrorBody struct {
	Kind    fault.Kind `json:"kind"`
	Exit    int        `json:"exit"`
	Message string     `json:"message"`
	Hint    string     `json:"hint,omitempty"`
	// RetryAfterMS: how long to wait before the same call may succeed
	// (rate_limited); absent when the error does not say
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Response is every gateway→client frame. Unlike requests it is one
// type for every op: its members are pointers or omitempty, so a frame
// carries only what its op answers, and an op's frames differ in shape
// on one connection (a send --wait or an ask: Sent, then a Batch, a
// WaitingFor or an error; recv: batches, then End; a broadcast done in
// part: Sent with the error), which one type reads without knowing which
// comes next.
type Response struct {
	OK    bool       `json:"ok"`
	Error *ErrorBody `json:"error,omitempty"`

	Hello    *Hello       `json:"hello,omitempty"`
	Entity   *EntityRow   `json:"entity,omitempty"`
	Token    string       `json:"token,omitempty"`
	CredFile string       `json:"credential_file,omitempty"`
	Entities []EntityRow  `json:"entities,omitempty"`
	Sent     *Sent        `json:"sent,omitempty"`
	Record   *Record      `json:"record,omitempty"`
	Batch    []Delivery   `json:"batch,omitempty"`
	End      bool         `json:"end,omitempty"` // recv: no more batches
	Dead     []DeadLetter `json:"dead,omitempty"`
	Count    int          `json:"count,omitempty"`
	Spawned  *Spawned     `json:"spawned,omitempty"` // spawn
	Stopped  *Stopped     `json:"stopped,omitempty"` // stop
	// WaitingFor: an ASK to the caller (in Batch) ended a wait for the
	// reply to this msg id before the reply came (send --wait, wait_reply)
	WaitingFor string `json:"waiting_for,omitempty"`
	// GatewayStatus answers OpGatewayStatus
	GatewayStatus *GatewayStatus `json:"gateway_status,omitempty"`
	// Trace answers OpTrace
	Trace *Trace `json:"trace,omitempty"`
	// Opened answers OpOpenDead
	Opened *Opened `json:"opened,omitempty"`
	// Event is one frame of OpWatch's stream
	Event *WatchEvent `json:"event,omitempty"`
	// Asks answers OpAsks (an empty list is sent as none)
	Asks []OpenAsk `json:"asks,omitempty"`
}

// OpenAsk is one live ask of a host, as OpAsks lists it: ids, parties,
// size and times. Body only for an ask put to the caller, when its
// request asked for the text (AsksRequest.Text).
type OpenAsk struct {
	MsgID   string `json:"msg_id"`
	TraceID string `json:"trace_id"`
	Kind    string `json:"kind"`  // ASK
	Asker   string `json:"asker"` // NAME@HOST
	// AskerGid, TargetGid: the parties' gids
	AskerGid  string    `json:"asker_gid"`
	Target    string    `json:"target"` // the askee, NAME@HOST
	TargetGid string    `json:"target_gid"`
	Size      int       `json:"size"`
	Opened    time.Time `json:"opened"`
	Deadline  time.Time `json:"deadline,omitzero"`
	Body      string    `json:"body,omitempty"`
}

// WatchEvent is one event of a gateway's watch stream. It never carries
// a message's text: its ids, kind, parties, size and times only.
//
// Event is one of: joined, left, status (an entity changed state:
// Status, Reason), the message events of the audit log (accepted,
// published, confirmed, taken, injected, drained, delivered, dead,
// bounced, receipt, asked, answered, too_late, expired, ...: see man 7
// fleet-metrics), and peer (a host went live, stale or gone: Peer,
// Status).
type WatchEvent struct {
	Time      time.Time `json:"time"`
	Host      string    `json:"host"`             // the gateway that saw it
	Event     string    `json:"event"`            // what happened
	Entity    string    `json:"entity,omitempty"` // the entity of this host it concerns
	Gid       string    `json:"gid,omitempty"`
	Status    string    `json:"status,omitempty"` // status: the entity's new state; peer: live, stale or gone
	Peer      string    `json:"peer,omitempty"`   // peer: the host
	TraceID   string    `json:"trace_id,omitempty"`
	MsgID     string    `json:"msg_id,omitempty"`
	Kind      string    `json:"kind,omitempty"`
	Sender    string    `json:"sender,omitempty"`
	Recipient string    `json:"recipient,omitempty"`
	Size      int       `json:"size,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	// Body: the text of a message stored in the watcher's own inbox,
	// only when its watch asked for it (WatchRequest.Text)
	Body string `json:"body,omitempty"`
}

// Opened is a sealed dead letter as this host's keys open it (or not).
type Opened struct {
	Readable bool   `json:"readable"`
	Text     string `json:"text,omitempty"` // its body, when readable
	// SealedTo: the hosts whose keys it is sealed to, as far as this
	// host knows them ("key ID" for a key it does not know)
	SealedTo []string `json:"sealed_to"`
	// Reason why it is not readable here: not_for_us, unknown_seal_key,
	// tampered (pkg/seal), not_authentic (its signature not proven)
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Trace is one flow as fleet-trace prints it: every hop the hosts that
// answered have in their audit logs, in order, and how each host asked
// answered.
type Trace struct {
	TraceID string            `json:"trace_id"`
	Hops    []Hop             `json:"hops"`
	Hosts   []TraceHost       `json:"hosts"`
	Names   map[string]string `json:"names,omitempty"` // gid -> name, of the hops' parties this gateway knows
}

// Hop is one audit line of a trace: what happened to which message, where
// and when. It never holds message text.
type Hop struct {
	Time      time.Time `json:"time"`
	Host      string    `json:"host"`
	Entity    string    `json:"entity,omitempty"` // the entity of Host the event concerns (name, or gid)
	Kind      string    `json:"kind,omitempty"`   // SEND, REPLY, ASK, ANSWER, ...
	MsgID     string    `json:"msg_id,omitempty"`
	Event     string    `json:"event"`               // accepted, published, confirmed, taken, injected, drained, ...
	Sender    string    `json:"sender,omitempty"`    // gid
	Recipient string    `json:"recipient,omitempty"` // gid
	Attempt   int       `json:"attempt,omitempty"`
	Size      int       `json:"size,omitempty"` // body bytes
	Reason    string    `json:"reason,omitempty"`
}

// Trace host states.
const (
	TraceAnswered    = "answered"    // its hops are in (Truncated: only the first of them)
	TraceNoAnswer    = "no_answer"   // asked, and no answer came in time (down, or slow)
	TraceUnreachable = "unreachable" // could not be asked (Detail says why)
	TraceRefused     = "refused"     // refused the query (Detail: its reason, as that host gave it)
)

// TraceHost is how one host answered a trace query.
type TraceHost struct {
	Host      string `json:"host"`
	State     string `json:"state"`
	Hops      int    `json:"hops"`
	Truncated bool   `json:"truncated,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// GatewayStatus is the health of a running gateway (fleet-gw status).
type GatewayStatus struct {
	Version string    `json:"version"`
	Host    string    `json:"host"`
	Pid     int       `json:"pid"`
	Started time.Time `json:"started"`
	Uptime  string    `json:"uptime"`
	// Broker: State is "none" (single-host mode), "connected", "blocked",
	// "connecting" or "down", since Since; Detail says why when not connected.
	Broker struct {
		State  string    `json:"state"`
		Node   string    `json:"node,omitempty"`
		Detail string    `json:"detail,omitempty"`
		Since  time.Time `json:"since,omitzero"`
	} `json:"broker"`
	Trusted  int `json:"trusted_hosts"`
	Entities int `json:"entities"`
	// Held counts the local entities whose mail is held by the state of
	// their agent (starting, stuck, unhooked, detached), by state
	Held    map[string]int `json:"held,omitempty"`
	Pending int            `json:"pending"`
	Dead    int            `json:"dead"`
	// OldestPending is when the oldest message still waiting was created
	OldestPending time.Time `json:"oldest_pending,omitzero"`
	// Healthy is false while a configured broker is not connected
	Healthy bool `json:"healthy"`
	// Peers are the other hosts: those this host trusts and those heard
	Peers []PeerStatus `json:"peers"`
}

// PeerStatus is another host as this gateway sees it. State is "live",
// "stale" (not heard for two of its presence intervals), "gone" (stopped,
// or not heard within the presence TTL), "unknown" (not heard since this
// gateway started, or the broker is cut off) or "untrusted" (heard, but
// not in this host's trust file).
type PeerStatus struct {
	Host    string `json:"host"`
	Trusted bool   `json:"trusted"`
	// Admits: whether that host says it admits this one (its presence);
	// absent when it has not said so within the presence TTL (an older
	// gateway, or not heard).
	Admits    *bool     `json:"admits,omitempty"`
	LastHeard time.Time `json:"last_heard,omitzero"`
	State     string    `json:"state"`
}

// Spawned is an entity a launcher started (fleet-spawn's answer).
type Spawned struct {
	Gid       string   `json:"gid"`
	Name      string   `json:"name"`
	Host      string   `json:"host"`
	RequestID string   `json:"request_id"`
	Profile   string   `json:"profile"`
	Mode      string   `json:"mode"`
	Groups    []string `json:"groups"`
	// ClearHosts: the host got the request's text in the clear (it has
	// no sealing key, and plaintext-hosts or seal-fallback = clear
	// allows it); the requesting host's word, never the answer's
	ClearHosts []string `json:"clear_hosts,omitempty"`
}

// Stopped is an entity fleet-stop removed.
type Stopped struct {
	Gid          string `json:"gid"`
	Name         string `json:"name"`
	Host         string `json:"host"`
	DeadLettered int    `json:"dead_lettered"`     // what waited in its inbox
	Process      string `json:"process,omitempty"` // what the launcher stopped; "" for an entity that was joined, not spawned
}

// Hello is the gateway's greeting: who it is and its limits.
type Hello struct {
	Proto   int    `json:"proto"`
	Host    string `json:"host"`
	Version string `json:"version"`
	MaxBody int    `json:"max_body"`
	Pid     int    `json:"pid"`
	// Features: what this gateway does beyond protocol 1 as the legacy
	// one-struct request had it. A gateway of an earlier build ignores a
	// field it does not know, so a command checks the feature first.
	Features []string `json:"features,omitempty"`
}

// Features a gateway of this build announces in its hello, each the
// request fields added since protocol 1 (request_test.go names them).
const (
	FeatureWaitForBroker = "wait_for_broker" // wait_for_broker_ms of send, ask, bcast
	FeatureWatch         = "watch"           // op watch
	FeatureCause         = "cause"           // cause of send: a hop of the message delivered (issue 37.2)
	FeatureUrgent        = "urgent"          // urgent of send and ask: ahead of normal mail (issue 37.3)
	FeatureAsks          = "asks"            // op asks
)

// Features is what this build's gateway announces.
var Features = []string{FeatureWaitForBroker, FeatureWatch, FeatureCause, FeatureUrgent, FeatureAsks}

// Has is whether the gateway that said h announces feature f.
func (h *Hello) Has(f string) bool { return h != nil && slices.Contains(h.Features, f) }

// EntityRow is one entity as fleet-roster shows it.
type EntityRow struct {
	Name         string   `json:"name"`
	Host         string   `json:"host"`
	Gid          string   `json:"gid"`
	Mode         string   `json:"mode"`
	Target       string   `json:"target,omitempty"` // tmux target or exec command
	Groups       []string `json:"groups"`
	Status       string   `json:"status"`
	StatusReason string   `json:"status_reason,omitempty"` // local rows: why an inject entity is starting, stuck, detached or unhooked
	Program      string   `json:"program,omitempty"`       // tmux: the program a paste needs in the pane's foreground
	Pending      int      `json:"pending"`
	Asks         int      `json:"asks_waiting,omitempty"` // whoami only: live asks waiting to be shown
	// whoami only: the newest message waiting (its inbox sequence, which
	// only grows) and the newest live ask (its msg id), so a watcher sees
	// new mail even when as much left as came since it last looked
	NewestSeq    uint64    `json:"newest_seq,omitempty"`
	NewestAsk    string    `json:"newest_ask,omitempty"`
	Dead         int       `json:"dead"`
	LastDelivery time.Time `json:"last_delivery,omitzero"`
	LastSeen     time.Time `json:"last_seen,omitzero"`    // remote rows: when their host was last heard
	NameHolder   string    `json:"name_holder,omitempty"` // roster: the name is on more than one trusted host, and means this NAME@HOST (the first to join)
	// local rows: who may reach it (its own policy, or the host's
	// accept-default when AcceptFrom is "default")
	Accept     []string `json:"accept,omitempty"`
	AcceptFrom string   `json:"accept_from,omitempty"` // own or default
	// local rows: the agent CLI whose interrupt urgent mail presses
	InterruptOnUrgent string `json:"interrupt_on_urgent,omitempty"`
	// StatusSince: when the entity took its status (local rows; a
	// remote row when its host's presence says so, which it does for
	// idle and busy as the other hosts hear them)
	StatusSince time.Time `json:"status_since,omitzero"`
}

// Sent is the outcome of an accepted send.
type Sent struct {
	MsgID     string `json:"msg_id"`
	TraceID   string `json:"trace_id"`
	State     string `json:"state"`
	Recipient string `json:"recipient"` // name@host
	Gid       string `json:"recipient_gid"`
	ReplayOf  string `json:"replay_of,omitempty"`  // a replay: the dead letter it delivers again
	Again     bool   `json:"again,omitempty"`      // a replay made before, sent again (the recipient drops a copy it has)
	SenderGid string `json:"sender_gid,omitempty"` // replay with Known: the sender of the replay (and of its dead letter)
	Warning   string `json:"warning,omitempty"`    // accepted, but the recipient's host reads stale or gone
	// ClearHosts are the hosts that got the text in the clear (no
	// sealing key; plaintext-hosts or seal-fallback = clear), sorted
	ClearHosts []string `json:"clear_hosts,omitempty"`
}

// Record is a message's delivery state as the sender may see it.
type Record struct {
	MsgID     string    `json:"msg_id"`
	Kind      string    `json:"kind"`
	TraceID   string    `json:"trace_id"`
	State     string    `json:"state"`
	Recipient string    `json:"recipient"`               // name@host, or the gid when the name is not known here
	Gid       string    `json:"recipient_gid,omitempty"` // the recipient's gid
	Attempts  int       `json:"attempts"`
	Reason    string    `json:"reason,omitempty"`
	Accepted  time.Time `json:"accepted"`
	Done      time.Time `json:"done,omitzero"`
}

// Delivery is one message handed to a pull client.
type Delivery struct {
	Envelope *envelope.Envelope `json:"envelope"`
}

// DeadLetter is one dead letter as listed.
type DeadLetter struct {
	Record   Record             `json:"record"`
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
}

// FromFault renders err for the socket.
func FromFault(err error) *ErrorBody {
	return &ErrorBody{
		Kind:    fault.KindOf(err),
		Exit:    int(fault.CodeOf(err)),
		Message: err.Error(),
		Hint:    fault.HintOf(err),

		RetryAfterMS: fault.RetryAfterOf(err).Milliseconds(),
	}
}

// Fault turns a socket error back into a fault.Error.
func (e *ErrorBody) Fault() *fault.Error {
	return &fault.Error{Code: fault.Code(e.Exit), Kind: e.Kind, Msg: e.Message, Hint: e.Hint,
		RetryAfter: time.Duration(e.RetryAfterMS) * time.Millisecond}
}

// MaxFrame returns the largest frame a gateway with body limit maxBody
// accepts: the worst case of JSON escaping (6 bytes per byte) plus room for
// the other fields.
func MaxFrame(maxBody int) int { return 6*maxBody + 64<<10 }

// WriteFrame writes v as one frame, by json.Marshal; a Request's Head
// gets its op. A request frame was once written by hand (and the hello's
// and a send's answers decoded into a four-member struct, and request
// frames read by a scanner in the gateway) to spare a short command
// encoding/json's reflection over the 36 fields of the one request
// struct of the time; five runs of scripts/bench-local.sh alternating
// the two builds (2026-12-02, load average 19-29 on 2 cores) showed no
// clear gain: fleet-send per call 2.06-2.71x a static hello world by
// hand, 1.94-2.48x through encoding/json; the gateway's CPU per message,
// 1 sender, 965-1285 us by hand and 835-1230 us, 8 senders 280-365 and
// 310-365 us. So the library does it.
func WriteFrame(w io.Writer, v any) error {
	if r, ok := v.(Request); ok {
		r.head().Op = r.op() // a request says its op, whoever writes it
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(buf, uint32(len(data)))
	copy(buf[4:], data)
	_, err = w.Write(buf)
	return err
}

// AppendEventFrame appends to dst the frame of Response{OK: true,
// Event: ev}, as WriteFrame would write it, at a quarter of the cost:
// only the event goes through encoding/json, not every field of a
// Response (a watch stream writes one frame per event).
func AppendEventFrame(dst []byte, ev *WatchEvent) ([]byte, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return dst, err
	}
	const head, tail = `{"ok":true,"event":`, `}`
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(head)+len(data)+len(tail)))
	dst = append(dst, head...)
	dst = append(dst, data...)
	return append(dst, tail...), nil
}

// frameChunk is how much of a frame's body ReadFrame makes room for before
// the bytes arrive: a header alone claims nothing more.
const frameChunk = 4 << 10

// ReadFrame reads one frame of at most max bytes. io.EOF means the peer
// closed cleanly between frames; a truncated or oversized frame is a
// fault.Data error (wrapping the read error, so a deadline that cut it
// short still reads as os.ErrDeadlineExceeded).
//
// The buffer grows with the bytes that actually arrive — at most twice
// what was read, and never more than the header claims — so a header that
// claims a large frame costs nothing until that frame arrives.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	var hdr [4]byte
	if k, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, err
		}
		if k > 0 || err == io.ErrUnexpectedEOF {
			return nil, fault.Wrap(fault.Data, fault.KindBadFrame, err, "truncated frame header")
		}
		return nil, err
	}
	n := int64(binary.BigEndian.Uint32(hdr[:]))
	if n > int64(max) {
		return nil, fault.New(fault.Data, fault.KindBadFrame, "frame of %d bytes is over the %d-byte limit", n, max)
	}
	buf := make([]byte, 0, min(n, frameChunk))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = append(make([]byte, 0, min(n, 2*int64(cap(buf)))), buf...)
		}
		k, err := r.Read(buf[len(buf):min(int64(cap(buf)), n)])
		buf = buf[:len(buf)+k]
		if err != nil && int64(len(buf)) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fault.Wrap(fault.Data, fault.KindBadFrame, err, "truncated frame: %d of %d bytes", len(buf), n)
		}
	}
	return buf, nil
}
