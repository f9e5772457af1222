package gateway

import (
	"errors"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// resolve finds a recipient by name, name@host or gid. This is the routing
// fork: a recipient on this host is served from the embedded store and never
// touches the broker. (Remote recipients arrive with the broker transport.)
func (g *Gateway) resolve(to string) (*mailbox, error) {
	name := to
	if n, host, ok := strings.Cut(to, "@"); ok {
		if host != g.cfg.Host {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownRecipient,
				"no recipient %s: host %s is not this host and no broker is configured", to, host)
		}
		name = n
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if b, ok := g.boxes[name]; ok {
		return b, nil
	}
	if gid, ok := g.byName[name]; ok {
		return g.boxes[gid], nil
	}
	return nil, fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient named %s", to).
		WithHint("list entities with: fleet-roster")
}

// send accepts one message: who sends it comes from the credential, never
// from the request; the body is checked; the message is durably in the
// recipient's inbox before the sender hears "accepted".
func (g *Gateway) send(req *api.Request) (*api.Response, error) {
	from, err := g.caller(req)
	if err != nil {
		return nil, err
	}
	if err := envelope.CheckBody([]byte(req.Body), g.cfg.MaxBody); err != nil {
		return nil, err
	}
	sender := from.snapshot()
	kind := envelope.Send
	to := req.To
	trace := ""
	if req.ReplyTo != "" {
		orig, err := g.st.Record(req.ReplyTo)
		if err != nil || orig.Recipient != sender.Gid {
			// a message the caller did not receive is as good as unknown
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage,
				"no message %s was delivered to %s on this host", req.ReplyTo, sender.Name)
		}
		if to != "" {
			return nil, fault.New(fault.Usage, fault.KindUsage, "a reply goes to the original sender: give --reply-to or a recipient, not both")
		}
		kind, to, trace = envelope.Reply, orig.Sender, orig.TraceID
	}
	if to == "" {
		return nil, fault.New(fault.Usage, fault.KindUsage, "no recipient")
	}
	rb, err := g.resolve(to)
	if err != nil {
		return nil, err
	}
	rcpt := rb.snapshot()
	env := envelope.New(kind,
		envelope.Party{Gid: sender.Gid, Name: sender.Name, Host: sender.Host},
		envelope.Party{Gid: rcpt.Gid, Name: rcpt.Name, Host: rcpt.Host},
		req.Body)
	if trace != "" {
		env.TraceID = trace
	}
	env.InReplyTo = req.ReplyTo
	rec, err := g.accept(env)
	if err != nil {
		return nil, err
	}
	return &api.Response{Sent: &api.Sent{
		MsgID: env.MsgID, TraceID: env.TraceID, State: rec.State,
		Recipient: env.Recipient.String(), Gid: rcpt.Gid,
	}}, nil
}

// accept stores env in its local recipient's inbox (dedup by msg id) and
// wakes the recipient's delivery.
func (g *Gateway) accept(env *envelope.Envelope) (*store.Record, error) {
	rec, dup, err := g.st.Accept(env, time.Now().UTC())
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient %s", env.Recipient)
		}
		g.log.Error("storing a message", "msg_id", env.MsgID, "trace_id", env.TraceID, "err", err)
		return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not store the message")
	}
	if dup {
		g.log.Info("duplicate msg id: not stored again", "msg_id", env.MsgID, "trace_id", env.TraceID)
		return rec, nil
	}
	g.audit.Message("accepted", env, 0, "")
	g.crashAt("after-accept")
	if b := g.box(env.Recipient.Gid); b != nil {
		b.notify()
	}
	return rec, nil
}

func (g *Gateway) apiRecord(r *store.Record) api.Record {
	rcpt := r.Recipient
	if b := g.box(r.Recipient); b != nil {
		e := b.snapshot()
		rcpt = e.Name + "@" + e.Host
	}
	return api.Record{
		MsgID: r.MsgID, Kind: string(r.Kind), TraceID: r.TraceID, State: r.State,
		Recipient: rcpt, Attempts: r.Attempts, Reason: r.Reason, Accepted: r.Accepted, Done: r.Done,
	}
}

// lookup tells a message's sender (or recipient) its delivery state. To
// anyone else the message does not exist.
func (g *Gateway) lookup(req *api.Request) (*api.Response, error) {
	b, err := g.caller(req)
	if err != nil {
		return nil, err
	}
	gid := b.snapshot().Gid
	r, err := g.st.Record(req.MsgID)
	if err != nil || (r.Sender != gid && r.Recipient != gid) {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no message %s sent or received by you", req.MsgID).
			WithHint("delivery records are kept for the dedup window (%s)", g.cfg.DedupWindow)
	}
	rec := g.apiRecord(r)
	return &api.Response{Record: &rec}, nil
}
