package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/fleetd/fleet/pkg/fault"
)

// A request frame is one JSON object: its Head (op, and the caller's
// credential) and the fields of its op, side by side, as the single
// request struct of earlier builds wrote them — the same names, so that a
// command of one build and a gateway of another understand each other
// (fields a side does not know are ignored). Each op has its own type,
// which holds only the fields that op reads: a client cannot set one its
// op ignores, and a handler sees only its own. The gateway reads the op
// first (DecodeRequest), then the frame into that op's type.

// Head is what every request carries. Client.Call fills it: Op from the
// request's type, Token from the client's credential unless the request
// has its own.
type Head struct {
	Op    string `json:"op"`
	Token string `json:"token,omitempty"` // the caller's credential
}

func (h *Head) head() *Head { return h }

// Request is a request of one op: one of the *...Request types of this
// package.
type Request interface {
	head() *Head
	op() string
}

// OpOf names r's op.
func OpOf(r Request) string { return r.op() }

// HelloRequest opens every connection and fixes the protocol version.
type HelloRequest struct {
	Head
	Proto int `json:"proto,omitempty"`
}

// The entities of this host: join, leave, status, groups.

// JoinRequest registers an entity (fleet-roster join).
type JoinRequest struct {
	Head
	Name       string   `json:"name,omitempty"`
	Mode       string   `json:"mode,omitempty"`
	TmuxTarget string   `json:"tmux_target,omitempty"`
	Exec       string   `json:"exec,omitempty"`
	Nudge      string   `json:"nudge,omitempty"`
	Groups     []string `json:"groups,omitempty"`
	// Accept: the entity's own inbound policy (pkg/accept patterns); none:
	// the host's accept-default
	Accept []string `json:"accept,omitempty"`
	// tmux: the agent in the pane (store.Entity's fields of the same names)
	Program      string `json:"program,omitempty"`
	Turns        string `json:"turns,omitempty"`
	Paste        string `json:"paste,omitempty"`
	Header       string `json:"header,omitempty"`
	IdleScreenMS int64  `json:"idle_screen_ms,omitempty"`
	// InterruptOnUrgent: the agent CLI (codex) whose own interrupt is
	// pressed when urgent mail waits while it is in a turn
	InterruptOnUrgent string `json:"interrupt_on_urgent,omitempty"`
}

// LeaveRequest removes the entity Name (fleet-roster leave).
type LeaveRequest struct {
	Head
	Name string `json:"name,omitempty"`
}

// StatusRequest sets the caller's status (busy|idle, or an agent's hook
// event). Pane: the caller is the agent of the tmux pane it runs in,
// proven by its process's ancestry (no credential).
type StatusRequest struct {
	Head
	Status string `json:"status,omitempty"`
	Pane   bool   `json:"pane,omitempty"`
}

// GroupsRequest adds and removes groups of the entity Name.
type GroupsRequest struct {
	Head
	Name   string   `json:"name,omitempty"`
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// AcceptRequest changes or reads the inbound policy of the entity Name
// (fleet-roster accept): Action add or remove (Patterns), reset (back to
// the host's accept-default) or list. The answer is the entity's row.
type AcceptRequest struct {
	Head
	Name     string   `json:"name,omitempty"`
	Action   string   `json:"action,omitempty"`
	Patterns []string `json:"patterns,omitempty"`
}

// Questions with no fields of their own: roster, whoami, gateway_status.

// RosterRequest lists every entity the gateway knows.
type RosterRequest struct{ Head }

// WhoamiRequest is the caller's own row.
type WhoamiRequest struct{ Head }

// GatewayStatusRequest is fleet-gw status (Response.GatewayStatus).
type GatewayStatusRequest struct{ Head }

// Messages: send, ask, bcast.

// SendRequest sends one message (To, or the sender of ReplyTo), or
// answers the ask AnswerTo. MsgID: the client minted the message's id
// (a retry with the same id is the same message). Wait holds the
// connection open for the reply, for at most TimeoutMS.
type SendRequest struct {
	Head
	To        string `json:"to,omitempty"`
	Body      string `json:"body,omitempty"`
	ReplyTo   string `json:"reply_to,omitempty"`
	AnswerTo  string `json:"answer_to,omitempty"`
	MsgID     string `json:"msg_id,omitempty"`
	Wait      bool   `json:"wait,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// WaitBrokerMS: while the broker is down, hold the send and try it
	// again under the same msg id for up to this long (0: fail at once)
	WaitBrokerMS int64 `json:"wait_for_broker_ms,omitempty"`
	// Cause: the message being delivered to the caller when it sends
	// this (an exec worker's FLEET_MSG_ID): believed only when this
	// gateway's record of it names the caller as its recipient; the send
	// is then a hop of its trace (gateway/hops.go)
	Cause string `json:"cause,omitempty"`
	// Urgent: ahead of normal mail in the recipient's inbox, FIFO among
	// urgent ones, within the sender's urgent-rate (gateway/urgent.go)
	Urgent bool `json:"urgent,omitempty"`
}

// AskRequest puts a live question to To: Sent, then the answer or a
// timeout (TimeoutMS; 0: the gateway's ask-ttl). ReplyTo: the message
// whose flow the ask is a hop of (fleet-ask --about). WaitHost: wait even
// if the askee's host reads stale or gone.
type AskRequest struct {
	Head
	To        string `json:"to,omitempty"`
	Body      string `json:"body,omitempty"`
	TurnID    string `json:"turn_id,omitempty"`
	ReplyTo   string `json:"reply_to,omitempty"`
	WaitHost  bool   `json:"wait_for_host,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// WaitBrokerMS: as SendRequest's, within the ask's TTL
	WaitBrokerMS int64 `json:"wait_for_broker_ms,omitempty"`
	// Cause: as SendRequest's (without ReplyTo): the ask is a hop of it
	Cause string `json:"cause,omitempty"`
	// Urgent: as SendRequest's: ahead of the askee's other live asks
	Urgent bool `json:"urgent,omitempty"`
}

// BcastRequest sends Body to a group ("" or "all": everyone).
type BcastRequest struct {
	Head
	Group string `json:"group,omitempty"`
	Body  string `json:"body,omitempty"`
	// WaitBrokerMS: as SendRequest's, for the copies of other hosts
	WaitBrokerMS int64 `json:"wait_for_broker_ms,omitempty"`
	// Cause: as SendRequest's: the broadcast is a hop of it
	Cause string `json:"cause,omitempty"`
}

// A message's state: lookup, wait, wait_reply.

// LookupRequest is the delivery state of MsgID (Response.Record).
type LookupRequest struct {
	Head
	MsgID string `json:"msg_id,omitempty"`
}

// WaitRequest blocks until MsgID reaches the state Until, or TimeoutMS.
type WaitRequest struct {
	Head
	MsgID     string `json:"msg_id,omitempty"`
	Until     string `json:"until,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// WaitReplyRequest resumes the wait of the send MsgID for its reply: the
// reply, or an ask to the caller arriving first (Response.WaitingFor).
type WaitReplyRequest struct {
	Head
	MsgID     string `json:"msg_id,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// The inbox: recv, and the ack of each of its batches.

// RecvRequest drains the caller's inbox in batches of at most Window;
// Max: stop after that many (0: no limit); Follow: wait for more. Hook:
// an agent CLI's hook takes the mail (fleet-recv --hook), which only a
// hook entity's inbox gives it.
type RecvRequest struct {
	Head
	Max    int  `json:"max,omitempty"`
	Follow bool `json:"follow,omitempty"`
	Window int  `json:"window,omitempty"`
	Hook   bool `json:"hook,omitempty"`
}

// AckRequest acknowledges the messages Acks of the last batch (the rest
// stay in the inbox).
type AckRequest struct {
	Head
	Acks []string `json:"acks,omitempty"`
}

// Dead letters: dead, replay, purge_dead.

// DeadRequest lists the dead letters of the entity Name ("": all).
type DeadRequest struct {
	Head
	Name string `json:"name,omitempty"`
}

// ReplayRequest delivers a dead letter again under a new msg id
// (fleet-dlq replay): this host's (MsgID), or one from bridge.dlq (Raw,
// Sig, SignedBy, as the broker holds it). Sent.Again: it was replayed
// before. With Known, nothing is sent: Sent is the replay made before of
// this host's dead letter MsgID, in its present state (67: none was made).
type ReplayRequest struct {
	Head
	MsgID    string `json:"msg_id,omitempty"`
	Known    bool   `json:"known,omitempty"`
	Raw      []byte `json:"raw,omitempty"`       // a dead letter's body from bridge.dlq
	Sig      []byte `json:"sig,omitempty"`       // its fleet-sig header
	SignedBy string `json:"signed_by,omitempty"` // its fleet-host header
}

// OpenDeadRequest opens a sealed dead letter with this host's sealing
// keys: this host's (MsgID), or one from bridge.dlq (Raw, Sig, SignedBy,
// as the broker holds it; opened only once its signature is proven).
type OpenDeadRequest struct {
	Head
	MsgID    string `json:"msg_id,omitempty"`
	Raw      []byte `json:"raw,omitempty"`       // a dead letter's body from bridge.dlq
	Sig      []byte `json:"sig,omitempty"`       // its fleet-sig header
	SignedBy string `json:"signed_by,omitempty"` // its fleet-host header
}

// PurgeDeadRequest removes this host's dead letters MsgIDs (Count: how
// many).
type PurgeDeadRequest struct {
	Head
	MsgIDs []string `json:"msg_ids,omitempty"`
}

// The control plane: spawn, stop, trace. Each waits at most TimeoutMS
// (0: the gateway's default).

// SpawnRequest starts an entity on Host ("": this one) through its
// launcher's Profile; carried out once per RequestID ("": a fresh one).
type SpawnRequest struct {
	Head
	Name      string   `json:"name,omitempty"`
	Host      string   `json:"host,omitempty"`
	Profile   string   `json:"profile,omitempty"`
	Groups    []string `json:"groups,omitempty"`
	Args      []string `json:"args,omitempty"`
	RequestID string   `json:"request_id,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
}

// StopRequest stops Target (NAME, NAME@HOST or GID) wherever it lives.
type StopRequest struct {
	Head
	Target    string `json:"target,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// TraceRequest is fleet-trace: the hops of the flow TraceID
// (Response.Trace).
type TraceRequest struct {
	Head
	TraceID   string `json:"trace_id,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// WatchRequest opens the gateway's watch stream (Response.Event). Text:
// the events of messages stored in the caller's own inbox carry their
// text (WatchEvent.Body); it takes the caller's credential.
type WatchRequest struct {
	Head
	Text bool `json:"text,omitempty"`
}

// AsksRequest lists this host's open asks (Response.Asks). Text: the
// asks put to the caller carry their text (OpenAsk.Body); it takes the
// caller's credential.
type AsksRequest struct {
	Head
	Text bool `json:"text,omitempty"`
}

// UnknownRequest is a frame whose op this build does not know (a newer
// command's): the gateway answers it with an error. Its Op is sent as
// it is.
type UnknownRequest struct{ Head }

func (*HelloRequest) op() string         { return OpHello }
func (*JoinRequest) op() string          { return OpJoin }
func (*LeaveRequest) op() string         { return OpLeave }
func (*StatusRequest) op() string        { return OpStatus }
func (*GroupsRequest) op() string        { return OpGroups }
func (*AcceptRequest) op() string        { return OpAccept }
func (*RosterRequest) op() string        { return OpRoster }
func (*WhoamiRequest) op() string        { return OpWhoami }
func (*GatewayStatusRequest) op() string { return OpGatewayStatus }
func (*SendRequest) op() string          { return OpSend }
func (*AskRequest) op() string           { return OpAsk }
func (*BcastRequest) op() string         { return OpBcast }
func (*LookupRequest) op() string        { return OpLookup }
func (*WaitRequest) op() string          { return OpWait }
func (*WaitReplyRequest) op() string     { return OpWaitReply }
func (*RecvRequest) op() string          { return OpRecv }
func (*AckRequest) op() string           { return OpAck }
func (*DeadRequest) op() string          { return OpDead }
func (*ReplayRequest) op() string        { return OpReplay }
func (*OpenDeadRequest) op() string      { return OpOpenDead }
func (*PurgeDeadRequest) op() string     { return OpPurgeDead }
func (*SpawnRequest) op() string         { return OpSpawn }
func (*StopRequest) op() string          { return OpStop }
func (*TraceRequest) op() string         { return OpTrace }
func (*WatchRequest) op() string         { return OpWatch }
func (*AsksRequest) op() string          { return OpAsks }
func (r *UnknownRequest) op() string     { return r.Op }

// newRequest is an empty request of op, for DecodeRequest to fill; an
// op this build does not know is an *UnknownRequest.
func newRequest(op string) Request {
	switch op {
	case OpHello:
		return &HelloRequest{}
	case OpJoin:
		return &JoinRequest{}
	case OpLeave:
		return &LeaveRequest{}
	case OpStatus:
		return &StatusRequest{}
	case OpGroups:
		return &GroupsRequest{}
	case OpAccept:
		return &AcceptRequest{}
	case OpRoster:
		return &RosterRequest{}
	case OpWhoami:
		return &WhoamiRequest{}
	case OpGatewayStatus:
		return &GatewayStatusRequest{}
	case OpSend:
		return &SendRequest{}
	case OpAsk:
		return &AskRequest{}
	case OpBcast:
		return &BcastRequest{}
	case OpLookup:
		return &LookupRequest{}
	case OpWait:
		return &WaitRequest{}
	case OpWaitReply:
		return &WaitReplyRequest{}
	case OpRecv:
		return &RecvRequest{}
	case OpAck:
		return &AckRequest{}
	case OpDead:
		return &DeadRequest{}
	case OpReplay:
		return &ReplayRequest{}
	case OpOpenDead:
		return &OpenDeadRequest{}
	case OpPurgeDead:
		return &PurgeDeadRequest{}
	case OpSpawn:
		return &SpawnRequest{}
	case OpStop:
		return &StopRequest{}
	case OpTrace:
		return &TraceRequest{}
	case OpWatch:
		return &WatchRequest{}
	case OpAsks:
		return &AsksRequest{}
	}
	return &UnknownRequest{}
}

// DecodeRequest parses a request frame: its op first, then the frame
// into that op's type.
func DecodeRequest(data []byte) (Request, error) {
	op, err := peekOp(data)
	if err != nil {
		return nil, fault.New(fault.Data, fault.KindBadFrame, "malformed request: %v", err)
	}
	if op == "" {
		return nil, fault.New(fault.Data, fault.KindBadFrame, "malformed request: no op")
	}
	r := newRequest(op)
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fault.New(fault.Data, fault.KindBadFrame, "malformed request: %v", err)
	}
	if r.head().Op != op {
		// the op given twice: the last one counts for the decode, and
		// it must be the op whose type was chosen
		return nil, fault.New(fault.Data, fault.KindBadFrame, "malformed request: op %q, then %q", op, r.head().Op)
	}
	return r, nil
}

// peekOp reads the op of a request frame without decoding the rest: the
// members before it (a frame begins with it, as the encoders of this and
// earlier builds write it) are skipped, and nothing after it is read — a
// send's body is decoded once, into its type. "" if the frame has none.
func peekOp(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	t, err := dec.Token()
	if err != nil {
		return "", err
	}
	if t != json.Delim('{') {
		return "", errors.New("not a JSON object")
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return "", err
		}
		if k, _ := k.(string); strings.EqualFold(k, "op") { // as json.Unmarshal matches it
			var op string
			if err := dec.Decode(&op); err != nil {
				return "", err
			}
			return op, nil
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", nil
}
