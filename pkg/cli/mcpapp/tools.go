package mcpapp

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds. Every tool's output fits an LLM's context: lists are capped by
// count, texts by bytes, waits by time. The defaults are what a call gets
// without asking; the maxima are what it may ask for.
const (
	defaultMaxBytes    = 32 << 10 // receive's total, and the cut of a reply or answer
	defaultMaxMessages = 10
	maxMaxMessages     = 100
	defaultMaxEntries  = 50
	maxMaxEntries      = 500
	// A blocking call's default wait ends before the shortest default
	// tool timeout of the clients that load fleet-mcp (Codex's
	// tool_timeout_sec, 60 s; Gemini CLI's is 10 min, Claude Code's
	// MCP_TOOL_TIMEOUT is about 28 hours and its stdio idle limit 30 min),
	// so the model gets a result that says what to call next rather than
	// a client-side timeout. Longer waits need the client's limit raised.
	defaultWaitSeconds = 45  // send with wait_for_reply, wait_reply, ask
	defaultAskSeconds  = 45  // ask
	maxWaitSeconds     = 900 // any wait: MCP clients give up on calls long before hours
	progressEvery      = 5 * time.Second
)

// Message is one message as a tool returns it.
type Message struct {
	MsgID     string    `json:"msg_id" jsonschema:"the message's id (for reply, answer, status)"`
	Kind      string    `json:"kind" jsonschema:"SEND, REPLY, ASK, ANSWER, BROADCAST, BOUNCE (a message of yours died), NOTICE (the gateway: a loop you were in was cut) or TOO_LATE"`
	From      string    `json:"from" jsonschema:"the sender, NAME@HOST"`
	FromGid   string    `json:"from_gid" jsonschema:"the sender's gid"`
	To        string    `json:"to" jsonschema:"the recipient, NAME@HOST, or broadcast.GROUP for a broadcast"`
	TraceID   string    `json:"trace_id" jsonschema:"the flow this message belongs to"`
	InReplyTo string    `json:"in_reply_to,omitempty" jsonschema:"the message this replies to or the ask this answers"`
	Created   time.Time `json:"created" jsonschema:"when it was sent"`
	Expires   time.Time `json:"expires,omitzero" jsonschema:"an ASK: its deadline; an answer after it is refused as too_late"`
	Body      string    `json:"body" jsonschema:"the text"`
	Urgent    bool      `json:"urgent,omitempty" jsonschema:"sent urgent: it went ahead of normal mail"`
	BodyBytes int       `json:"body_bytes" jsonschema:"the text's whole size in bytes"`
	Truncated bool      `json:"truncated,omitempty" jsonschema:"true: body holds only the first max_bytes of the text"`
	Respond   string    `json:"respond,omitempty" jsonschema:"how to respond, when the message wants a response"`
}

// Inbox is how much mail waits for this entity.
type Inbox struct {
	Messages int `json:"messages" jsonschema:"messages waiting in your inbox (take them with receive)"`
	Asks     int `json:"asks" jsonschema:"live asks to you waiting to be seen (receive shows them first)"`
}

// view renders an envelope, its body cut at max bytes (on a rune
// boundary).
func view(e *envelope.Envelope, max int) Message {
	m := Message{MsgID: e.MsgID, Kind: string(e.Kind), From: e.Sender.String(), FromGid: e.Sender.Gid,
		To: e.Recipient.String(), TraceID: e.TraceID, InReplyTo: e.InReplyTo, Created: e.Created,
		Expires: e.Expires, Body: e.Body, Urgent: e.Urgent, BodyBytes: len(e.Body)}
	if len(m.Body) > max {
		cut := max
		for cut > 0 && !utf8RuneStart(m.Body[cut]) {
			cut--
		}
		m.Body, m.Truncated = m.Body[:cut], true
	}
	switch e.Kind {
	case envelope.Ask:
		m.Respond = fmt.Sprintf("answer with the answer tool, ask_id %s, before %s", e.MsgID, e.Expires.Format(time.RFC3339))
	case envelope.Send, envelope.Broadcast:
		m.Respond = fmt.Sprintf("if it wants a reply: the reply tool, msg_id %s", e.MsgID)
	}
	return m
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// Inputs and outputs, one pair per tool. The jsonschema tags are the
// descriptions the client shows the model.

type SendIn struct {
	To             string `json:"to" jsonschema:"the recipient: NAME, NAME@HOST or a gid (see the roster tool)"`
	Body           string `json:"body" jsonschema:"the text to send (UTF-8, not empty, at most the gateway's body limit)"`
	WaitForReply   bool   `json:"wait_for_reply,omitempty" jsonschema:"hold the call open until the recipient replies (or an ask to you comes first)"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"with wait_for_reply: how long to wait, in seconds; past 55 the client's tool timeout must allow it (Codex: tool_timeout_sec, 60 by default)"`
	MaxBytes       int    `json:"max_bytes,omitempty" jsonschema:"with wait_for_reply: cut the reply's text at this many bytes (default 32768)"`
	Urgent         bool   `json:"urgent,omitempty" jsonschema:"put it ahead of normal mail in the recipient's inbox (for what cannot wait behind a queue; bounded by the gateway's urgent-rate)"`
}

type SendOut struct {
	MsgID        string   `json:"msg_id" jsonschema:"your message's id"`
	TraceID      string   `json:"trace_id,omitempty" jsonschema:"its flow's trace id"`
	Recipient    string   `json:"recipient,omitempty" jsonschema:"NAME@HOST it went to"`
	RecipientGid string   `json:"recipient_gid,omitempty"`
	State        string   `json:"state,omitempty" jsonschema:"accepted: stored at the recipient's gateway or confirmed by the broker"`
	Outcome      string   `json:"outcome" jsonschema:"sent (no wait), reply (the reply is in reply), or ask_arrived (an ask to you is in ask: answer it, then wait_reply)"`
	Reply        *Message `json:"reply,omitempty" jsonschema:"the reply"`
	Ask          *Message `json:"ask,omitempty" jsonschema:"the ask that ended the wait"`
	Next         string   `json:"next,omitempty" jsonschema:"what to do next"`
	Inbox        Inbox    `json:"inbox" jsonschema:"mail waiting for you now"`
}

type WaitReplyIn struct {
	MsgID          string `json:"msg_id" jsonschema:"the msg_id of your earlier send whose reply to wait for"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"how long to wait, in seconds; past 55 the client's tool timeout must allow it (Codex: tool_timeout_sec, 60 by default)"`
	MaxBytes       int    `json:"max_bytes,omitempty" jsonschema:"cut the reply's text at this many bytes (default 32768)"`
}

type ReplyIn struct {
	MsgID string `json:"msg_id" jsonschema:"the message to reply to (one sent to you)"`
	Body  string `json:"body" jsonschema:"the reply's text"`
}

type AnswerIn struct {
	AskID string `json:"ask_id" jsonschema:"the ASK's msg_id"`
	Body  string `json:"body" jsonschema:"the answer's text"`
}

type SentOut struct {
	MsgID        string   `json:"msg_id" jsonschema:"the new message's id"`
	TraceID      string   `json:"trace_id" jsonschema:"its flow's trace id"`
	Recipient    string   `json:"recipient" jsonschema:"NAME@HOST it went to"`
	RecipientGid string   `json:"recipient_gid"`
	State        string   `json:"state" jsonschema:"accepted, or for an answer: answered (the asking turn has it)"`
	ClearHosts   []string `json:"clear_hosts,omitempty" jsonschema:"hosts with no sealing key that got the text in the clear, the broker able to read it (seal-fallback = clear or plaintext-hosts)"`
	Inbox        Inbox    `json:"inbox" jsonschema:"mail waiting for you now"`
}

type AskIn struct {
	To             string `json:"to" jsonschema:"who to ask: NAME, NAME@HOST or a gid"`
	Question       string `json:"question" jsonschema:"the question"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"the ask's time to live and how long this call waits, in seconds; past 55 the client's tool timeout must allow it (Codex: tool_timeout_sec, 60 by default)"`
	About          string `json:"about,omitempty" jsonschema:"a msg_id you sent or received: the ask joins that message's flow (trace)"`
	MaxBytes       int    `json:"max_bytes,omitempty" jsonschema:"cut the answer's text at this many bytes (default 32768)"`
	Urgent         bool   `json:"urgent,omitempty" jsonschema:"put it ahead of the askee's other asks (bounded by the gateway's urgent-rate)"`
}

type AskOut struct {
	AskID      string   `json:"ask_id" jsonschema:"the ask's id"`
	TraceID    string   `json:"trace_id"`
	Recipient  string   `json:"recipient" jsonschema:"NAME@HOST asked"`
	Answer     Message  `json:"answer" jsonschema:"the answer"`
	ClearHosts []string `json:"clear_hosts,omitempty" jsonschema:"hosts with no sealing key that got the text in the clear, the broker able to read it (seal-fallback = clear or plaintext-hosts)"`
	Inbox      Inbox    `json:"inbox" jsonschema:"mail waiting for you now"`
}

type ReceiveIn struct {
	MaxMessages int `json:"max_messages,omitempty" jsonschema:"take at most this many messages, 1 to 100 (default 10)"`
	MaxBytes    int `json:"max_bytes,omitempty" jsonschema:"take whole messages while their texts add up to at most this many bytes (default 32768; at most the gateway's body limit)"`
	WaitSeconds int `json:"wait_seconds,omitempty" jsonschema:"when the inbox is empty, wait up to this many seconds (0 to 900, default 0) for mail"`
}

type ReceiveOut struct {
	Messages  []Message `json:"messages" jsonschema:"the messages taken, oldest first; they have left the inbox"`
	Left      Inbox     `json:"left" jsonschema:"what still waits after this call"`
	NextBytes int       `json:"next_message_bytes,omitempty" jsonschema:"the size of the oldest message left because it did not fit max_bytes"`
	Note      string    `json:"note,omitempty"`
}

type RosterIn struct {
	Host       string `json:"host,omitempty" jsonschema:"only entities on this host"`
	Group      string `json:"group,omitempty" jsonschema:"only members of this group"`
	Name       string `json:"name,omitempty" jsonschema:"only entities with this name"`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"list at most this many, 1 to 500 (default 50)"`
}

type RosterOut struct {
	Entities []api.EntityRow `json:"entities" jsonschema:"entities on every host: this host's exact, others' as last heard"`
	Total    int             `json:"total" jsonschema:"how many matched"`
	Omitted  int             `json:"omitted,omitempty" jsonschema:"matched but left out by max_entries"`
	Inbox    Inbox           `json:"inbox" jsonschema:"mail waiting for you now"`
}

type StatusIn struct {
	MsgID       string `json:"msg_id" jsonschema:"a message you sent"`
	WaitSeconds int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (0 to 900, default 0) for it to be delivered"`
}

type StatusOut struct {
	Record api.Record `json:"record" jsonschema:"its delivery state: accepted, delivered or dead (with the reason)"`
	Inbox  Inbox      `json:"inbox" jsonschema:"mail waiting for you now"`
}

type BroadcastIn struct {
	Body  string `json:"body" jsonschema:"the text"`
	Group string `json:"group,omitempty" jsonschema:"only the members of this group (default: everyone)"`
}

type BroadcastOut struct {
	MsgID        string   `json:"msg_id"`
	TraceID      string   `json:"trace_id"`
	Recipient    string   `json:"recipient" jsonschema:"broadcast.all or broadcast.GROUP"`
	LocalMembers int      `json:"local_members" jsonschema:"members on this host that got it (others get theirs through the broker)"`
	ClearHosts   []string `json:"clear_hosts,omitempty" jsonschema:"hosts with no sealing key that got the text in the clear, the broker able to read it (seal-fallback = clear or plaintext-hosts)"`
	Inbox        Inbox    `json:"inbox" jsonschema:"mail waiting for you now"`
}

type WhoamiIn struct{}

type WhoamiOut struct {
	Entity         api.EntityRow `json:"entity" jsonschema:"you"`
	GatewayHost    string        `json:"gateway_host"`
	GatewayVersion string        `json:"gateway_version"`
	MaxBody        int           `json:"max_body" jsonschema:"the largest message text the gateway takes, in bytes"`
	Inbox          Inbox         `json:"inbox" jsonschema:"mail waiting for you now"`
}

func (s *server) addTools() {
	max := s.gw.MaxBody
	body := text(1, max)                                                // characters; the gateway counts bytes
	wait := intRange(1, maxWaitSeconds).withDefault(defaultWaitSeconds) // a held call's wait
	poll := intRange(0, maxWaitSeconds).withDefault(0)                  // an optional wait
	cut := intRange(1, max).withDefault(min(defaultMaxBytes, max))      // a text's cut
	id := text(1, maxID)                                                // msg, ask, trace ids
	addr := text(1, maxAddress)                                         // NAME, NAME@HOST or gid
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "send", Annotations: additive("Send a message", false), Description: "Send a message to an entity (a person, agent or script on any host). " +
		"Returns once it is stored durably at the recipient's gateway. With wait_for_reply, the call stays open " +
		"until the recipient replies (outcome reply) — or until an ASK to you arrives first (outcome ask_arrived: " +
		"answer it with answer, then call wait_reply with this msg_id; the reply is not lost meanwhile). " +
		"On timeout the message stays sent: wait again with wait_reply. A reply's text is cut at max_bytes."},
		map[string]prop{"to": addr, "body": body, "timeout_seconds": wait, "max_bytes": cut}}, s.send)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "wait_reply", Annotations: additive("Wait for a reply", false), Description: "Wait again for the reply to a message you sent " +
		"(after send with wait_for_reply ended with ask_arrived or timed out). Returns the reply (outcome reply), " +
		"or another ask to you (outcome ask_arrived). A reply that came meanwhile is handed here, once."},
		map[string]prop{"msg_id": id, "timeout_seconds": wait, "max_bytes": cut}}, s.waitReply)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "reply", Annotations: additive("Reply to a message", false), Description: "Reply to a message sent to you: the reply goes to its " +
		"sender, in the same flow (trace), and ends the sender's wait if it waits."},
		map[string]prop{"msg_id": id, "body": body}}, s.reply)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "ask", Annotations: additive("Ask a live question", false), Description: fmt.Sprintf("Ask an entity a live question and wait for its answer "+
		"(timeout_seconds, default %d, at most %d). Asks are never stored: if the time passes, the call fails with timeout (75) "+
		"and a later answer is refused. The answer's text is cut at max_bytes.", defaultAskSeconds, maxWaitSeconds)},
		map[string]prop{"to": addr, "question": body, "timeout_seconds": wait.withDefault(defaultAskSeconds), "about": id, "max_bytes": cut}}, s.ask)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "answer", Annotations: additive("Answer an ask", true), Description: "Answer an ASK put to you (receive shows asks first; " +
		"send with wait_for_reply may return one). Fails with too_late (11) when the asker stopped waiting or it was answered already."},
		map[string]prop{"ask_id": id, "body": body}}, s.answer)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "receive", Annotations: additive("Receive mail", false), Description: fmt.Sprintf("Take mail from your inbox, oldest first "+
		"(live asks first): at most max_messages (default %d, at most %d) whole messages whose texts add up to at most "+
		"max_bytes (default %d, at most %d). Only the messages returned leave the inbox; the rest stay, in order, for "+
		"the next call (left says how many). A message bigger than max_bytes is not taken: its size is in "+
		"next_message_bytes; call again with a max_bytes that fits it. With wait_seconds, waits for mail when "+
		"the inbox is empty.", defaultMaxMessages, maxMaxMessages, min(defaultMaxBytes, max), max)},
		map[string]prop{"max_messages": intRange(1, maxMaxMessages).withDefault(defaultMaxMessages), "max_bytes": cut, "wait_seconds": poll}}, s.receive)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "roster", Annotations: readOnly("List the fleet's entities"), Description: fmt.Sprintf("List entities on every host: name, host, "+
		"gid, mode, groups, status (idle, busy, waiting, stale, unknown), pending mail. Filters by host, group and "+
		"name; at most max_entries (default %d, at most %d), with total and omitted saying what was left out.",
		defaultMaxEntries, maxMaxEntries)},
		map[string]prop{"host": pattern(hostPattern, 63), "group": pattern(namePattern, 64), "name": pattern(namePattern, 64),
			"max_entries": intRange(1, maxMaxEntries).withDefault(defaultMaxEntries)}}, s.roster)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "status", Annotations: readOnly("Delivery state of a message"), Description: "The delivery state of a message you sent: accepted, " +
		"delivered, or dead with the reason; with wait_seconds, waits until it is delivered (timeout (75) if not)."},
		map[string]prop{"msg_id": id, "wait_seconds": poll}}, s.status)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "broadcast", Annotations: additive("Broadcast a message", false), Description: "Send one message to every entity on every host, " +
		"or to every member of a group. You do not get your own copy. Replies to it come as ordinary replies."},
		map[string]prop{"body": body, "group": pattern(namePattern, 64)}}, s.broadcast)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "whoami", Annotations: readOnly("Who am I on fleet"), Description: "Who you are on fleet (name, host, gid, groups, status), " +
		"the gateway's limits, and how much mail waits."}, nil}, s.whoami)
	s.addControlTools()
}

// call makes one request on a connection of its own and returns the
// response; the call's cancellation closes the connection.
func (s *server) call(ctx context.Context, req api.Request) (*api.Response, error) {
	cl, err := s.dial()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	if err := cl.Send(req); err != nil {
		return nil, err
	}
	return readHeld(ctx, cl)
}

// readHeld reads one frame; a cancelled call closes the connection, which
// the gateway takes as the caller going away (a wait or an ask ends, a
// receive's unacknowledged messages stay).
func readHeld(ctx context.Context, cl *api.Client) (*api.Response, error) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			cl.Close()
		case <-done:
		}
	}()
	resp, err := cl.Read()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return resp, err
}

// bounded checks an optional integer parameter: 0 gives def.
func bounded(name string, v, def, lo, hi int) (int, error) {
	if v == 0 {
		return def, nil
	}
	if v < lo || v > hi {
		return 0, fault.New(fault.Usage, fault.KindUsage, "%s must be from %d to %d, not %d", name, lo, hi, v)
	}
	return v, nil
}

func (s *server) maxBytes(v int) (int, error) {
	return bounded("max_bytes", v, min(defaultMaxBytes, s.gw.MaxBody), 1, s.gw.MaxBody)
}

func seconds(name string, v, def int) (time.Duration, error) {
	n, err := bounded(name, v, def, 1, maxWaitSeconds)
	return time.Duration(n) * time.Second, err
}

// progress sends a progress notification every few seconds while a call
// waits, when the client asked for them (a progress token): clients that
// time calls out reset their clock on progress.
func (s *server) progress(ctx context.Context, req *mcp.CallToolRequest, what string) (stop func()) {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok,
					Progress: time.Since(start).Seconds(), Message: what})
			}
		}
	}()
	return func() { close(done) }
}

func (s *server) send(ctx context.Context, req *mcp.CallToolRequest, in SendIn) (*mcp.CallToolResult, SendOut, error) {
	if err := s.needsUrgent(in.Urgent); err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	if !in.WaitForReply {
		resp, err := s.call(ctx, &api.SendRequest{To: in.To, Body: in.Body, Urgent: in.Urgent})
		if err != nil {
			return nil, SendOut{}, toolError(err, "")
		}
		out := sendOut(resp.Sent)
		out.Outcome = "sent"
		out.Inbox = s.inbox.now()
		return nil, out, nil
	}
	timeout, err := seconds("timeout_seconds", in.TimeoutSeconds, defaultWaitSeconds)
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	maxB, err := s.maxBytes(in.MaxBytes)
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	cl, err := s.dial()
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	defer cl.Close()
	resp, err := cl.Call(&api.SendRequest{To: in.To, Body: in.Body, Wait: true, TimeoutMS: timeout.Milliseconds(), Urgent: in.Urgent})
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	return s.awaitReply(ctx, req, cl, sendOut(resp.Sent), maxB)
}

// needsUrgent refuses urgent against a gateway that does not announce
// it (an earlier build would send the message as normal mail, silently).
func (s *server) needsUrgent(urgent bool) error {
	if !urgent || s.gw.Has(api.FeatureUrgent) {
		return nil
	}
	return fault.New(fault.Data, fault.KindProtocol, "urgent: the gateway (fleet-gw %s) does not know it", s.gw.Version).
		WithHint("restart fleet-gw with the release of fleet-mcp, or send without urgent")
}

func sendOut(sent *api.Sent) SendOut {
	return SendOut{MsgID: sent.MsgID, TraceID: sent.TraceID, Recipient: sent.Recipient, RecipientGid: sent.Gid, State: sent.State}
}

func (s *server) waitReply(ctx context.Context, req *mcp.CallToolRequest, in WaitReplyIn) (*mcp.CallToolResult, SendOut, error) {
	timeout, err := seconds("timeout_seconds", in.TimeoutSeconds, defaultWaitSeconds)
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	maxB, err := s.maxBytes(in.MaxBytes)
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	cl, err := s.dial()
	if err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	defer cl.Close()
	if err := cl.Send(&api.WaitReplyRequest{MsgID: in.MsgID, TimeoutMS: timeout.Milliseconds()}); err != nil {
		return nil, SendOut{}, toolError(err, "")
	}
	return s.awaitReply(ctx, req, cl, SendOut{MsgID: in.MsgID}, maxB)
}

// awaitReply reads what ends a held-open wait for the reply to out.MsgID:
// the reply, or an ask to this entity that came first (exit 10 for
// fleet-send; here a result, since it is no failure).
func (s *server) awaitReply(ctx context.Context, req *mcp.CallToolRequest, cl *api.Client, out SendOut, maxB int) (*mcp.CallToolResult, SendOut, error) {
	stop := s.progress(ctx, req, "waiting for the reply to "+out.MsgID)
	resp, err := readHeld(ctx, cl)
	stop()
	if err != nil {
		again := fmt.Sprintf("your message %s stays sent; wait again with wait_reply msg_id %s (a late reply also waits in your inbox: receive)", out.MsgID, out.MsgID)
		switch {
		case ctx.Err() != nil:
			return nil, SendOut{}, toolError(fault.New(fault.TempFail, fault.KindTimeout, "cancelled while waiting for the reply to %s", out.MsgID), again)
		case fault.KindOf(err) == fault.KindTimeout:
			return nil, SendOut{}, toolError(err, again)
		}
		return nil, SendOut{}, toolError(err, "")
	}
	if len(resp.Batch) == 0 {
		return nil, SendOut{}, toolError(fault.New(fault.Software, fault.KindProtocol, "the gateway ended the wait without the reply"), "")
	}
	m := view(resp.Batch[0].Envelope, maxB)
	if resp.WaitingFor != "" {
		out.Outcome, out.Ask = "ask_arrived", &m
		out.Next = fmt.Sprintf("%s (%d): %s asks you this while you wait for the reply to %s. Answer it with the answer tool "+
			"(ask_id %s), then call wait_reply with msg_id %s to go on waiting; the reply is not lost meanwhile.",
			fault.KindAskArrived, fault.AskArrived, m.From, resp.WaitingFor, m.MsgID, resp.WaitingFor)
	} else {
		out.Outcome, out.Reply = "reply", &m
	}
	out.Inbox = s.inbox.now()
	return nil, out, nil
}

func (s *server) reply(ctx context.Context, req *mcp.CallToolRequest, in ReplyIn) (*mcp.CallToolResult, SentOut, error) {
	if in.MsgID == "" {
		return nil, SentOut{}, toolError(fault.New(fault.Usage, fault.KindUsage, "msg_id is empty: which message to reply to"), "")
	}
	return s.sent(ctx, &api.SendRequest{ReplyTo: in.MsgID, Body: in.Body})
}

func (s *server) answer(ctx context.Context, req *mcp.CallToolRequest, in AnswerIn) (*mcp.CallToolResult, SentOut, error) {
	if in.AskID == "" {
		return nil, SentOut{}, toolError(fault.New(fault.Usage, fault.KindUsage, "ask_id is empty: which ask to answer"), "")
	}
	return s.sent(ctx, &api.SendRequest{AnswerTo: in.AskID, Body: in.Body})
}

func (s *server) sent(ctx context.Context, r *api.SendRequest) (*mcp.CallToolResult, SentOut, error) {
	resp, err := s.call(ctx, r)
	if err != nil {
		return nil, SentOut{}, toolError(err, "")
	}
	return nil, SentOut{MsgID: resp.Sent.MsgID, TraceID: resp.Sent.TraceID, Recipient: resp.Sent.Recipient,
		RecipientGid: resp.Sent.Gid, State: resp.Sent.State, ClearHosts: resp.Sent.ClearHosts, Inbox: s.inbox.now()}, nil
}

func (s *server) ask(ctx context.Context, req *mcp.CallToolRequest, in AskIn) (*mcp.CallToolResult, AskOut, error) {
	if err := s.needsUrgent(in.Urgent); err != nil {
		return nil, AskOut{}, toolError(err, "")
	}
	ttl, err := seconds("timeout_seconds", in.TimeoutSeconds, defaultAskSeconds)
	if err != nil {
		return nil, AskOut{}, toolError(err, "")
	}
	maxB, err := s.maxBytes(in.MaxBytes)
	if err != nil {
		return nil, AskOut{}, toolError(err, "")
	}
	cl, err := s.dial()
	if err != nil {
		return nil, AskOut{}, toolError(err, "")
	}
	defer cl.Close()
	resp, err := cl.Call(&api.AskRequest{To: in.To, Body: in.Question, TimeoutMS: ttl.Milliseconds(), ReplyTo: in.About, Urgent: in.Urgent})
	if err != nil {
		return nil, AskOut{}, toolError(err, "")
	}
	out := AskOut{AskID: resp.Sent.MsgID, TraceID: resp.Sent.TraceID, Recipient: resp.Sent.Recipient, ClearHosts: resp.Sent.ClearHosts}
	stop := s.progress(ctx, req, fmt.Sprintf("waiting for %s to answer ask %s", out.Recipient, out.AskID))
	ans, err := readHeld(ctx, cl)
	stop()
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, AskOut{}, toolError(fault.New(fault.TempFail, fault.KindTimeout, "cancelled: the answer to ask %s will be refused as too late", out.AskID), "")
	case fault.KindOf(err) == fault.KindTimeout:
		return nil, AskOut{}, toolError(err, "the ask expired and a late answer is refused; ask again if it still matters")
	case err != nil:
		return nil, AskOut{}, toolError(err, "")
	case len(ans.Batch) == 0:
		return nil, AskOut{}, toolError(fault.New(fault.Software, fault.KindProtocol, "the gateway ended the ask without the answer"), "")
	}
	out.Answer = view(ans.Batch[0].Envelope, maxB)
	out.Answer.Respond = ""
	out.Inbox = s.inbox.now()
	return nil, out, nil
}

func (s *server) roster(ctx context.Context, req *mcp.CallToolRequest, in RosterIn) (*mcp.CallToolResult, RosterOut, error) {
	maxE, err := bounded("max_entries", in.MaxEntries, defaultMaxEntries, 1, maxMaxEntries)
	if err != nil {
		return nil, RosterOut{}, toolError(err, "")
	}
	resp, err := s.call(ctx, &api.RosterRequest{})
	if err != nil {
		return nil, RosterOut{}, toolError(err, "")
	}
	out := RosterOut{Entities: []api.EntityRow{}}
	for _, r := range resp.Entities {
		if (in.Host == "" || r.Host == in.Host) && (in.Group == "" || slices.Contains(r.Groups, in.Group)) &&
			(in.Name == "" || r.Name == in.Name) {
			out.Total++
			if len(out.Entities) < maxE {
				r.Target = "" // a tmux target or an exec command line: this host's business, and long
				if r.Groups == nil {
					r.Groups = []string{}
				}
				out.Entities = append(out.Entities, r)
			}
		}
	}
	out.Omitted = out.Total - len(out.Entities)
	out.Inbox = s.inbox.now()
	return nil, out, nil
}

func (s *server) status(ctx context.Context, req *mcp.CallToolRequest, in StatusIn) (*mcp.CallToolResult, StatusOut, error) {
	var r api.Request = &api.LookupRequest{MsgID: in.MsgID}
	if in.WaitSeconds != 0 {
		wait, err := seconds("wait_seconds", in.WaitSeconds, 0)
		if err != nil {
			return nil, StatusOut{}, toolError(err, "")
		}
		r = &api.WaitRequest{MsgID: in.MsgID, Until: "delivered", TimeoutMS: wait.Milliseconds()}
	}
	stop := s.progress(ctx, req, "waiting for "+in.MsgID+" to be delivered")
	resp, err := s.call(ctx, r)
	stop()
	if err != nil {
		return nil, StatusOut{}, toolError(err, "")
	}
	return nil, StatusOut{Record: *resp.Record, Inbox: s.inbox.now()}, nil
}

func (s *server) broadcast(ctx context.Context, req *mcp.CallToolRequest, in BroadcastIn) (*mcp.CallToolResult, BroadcastOut, error) {
	if err := ident.CheckGroup(in.Group); err != nil { // a routing key: the gateway checks it too
		return nil, BroadcastOut{}, toolError(err, "")
	}
	resp, err := s.call(ctx, &api.BcastRequest{Group: in.Group, Body: in.Body})
	if err != nil && fault.CodeOf(err) == fault.Partial && resp != nil && resp.Sent != nil {
		// delivered in part: what was sent, and not to call it again
		return nil, BroadcastOut{}, toolError(fault.New(fault.Partial, fault.KindOf(err), "%s (msg id %s, trace id %s)",
			err.Error(), resp.Sent.MsgID, resp.Sent.TraceID),
			"do not call broadcast again (whoever has it would get it twice): reach the members it missed with send, to NAME@HOST (the roster tool lists them)")
	}
	if err != nil {
		return nil, BroadcastOut{}, toolError(err, "")
	}
	return nil, BroadcastOut{MsgID: resp.Sent.MsgID, TraceID: resp.Sent.TraceID, Recipient: resp.Sent.Recipient,
		LocalMembers: resp.Count, ClearHosts: resp.Sent.ClearHosts, Inbox: s.inbox.now()}, nil
}

func (s *server) whoami(ctx context.Context, req *mcp.CallToolRequest, _ WhoamiIn) (*mcp.CallToolResult, WhoamiOut, error) {
	resp, err := s.call(ctx, &api.WhoamiRequest{})
	if err != nil {
		return nil, WhoamiOut{}, toolError(err, "")
	}
	e := *resp.Entity
	e.Target = ""
	return nil, WhoamiOut{Entity: e, GatewayHost: s.gw.Host, GatewayVersion: s.gw.Version, MaxBody: s.gw.MaxBody,
		Inbox: Inbox{Messages: e.Pending, Asks: e.Asks}}, nil
}
