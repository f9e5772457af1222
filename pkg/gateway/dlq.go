package gateway

// dlq.go — the gateway's part of fleet-dlq. Listing is OpDead (server.go);
// here a dead letter is delivered again under a new msg id that names it
// (replay_of), at most once, and dead letters are purged.
//
// Once: the new envelope is recorded (the store's replays bucket, by the
// dead letter's msg id and its sender's host) before it is sent, and
// every later replay of the same dead letter on this host sends that same
// envelope again — which the recipient's dedup by msg id drops. Across hosts (the sender's host
// replays its copy, the recipient's host the one in bridge.dlq) the
// recipient's store takes one replay per dead letter and recipient
// (store.ReplayedKey: the original msg id and its sender's host, the host
// that signs the replay); a claim by another host is never that replay
// (intake.go replayClaim). A replay refused for sure (a full inbox, no route, a
// recipient gone) is forgotten, and the dead letter stays; one that dies
// later, like any message, is a dead letter again, with a bounce.
//
// Who may replay what: a dead letter of this host's store (its recipient
// was here, or its sender was and the broker refused or killed it); one
// from bridge.dlq (fleet-dlq reads it with an operator's login) only when
// its signature proves it — made by this host (then it is re-signed and
// published), or by a trusted host for an entity of this one (then it is
// delivered here). Nobody else's message is ever signed anew.
//
// Sealed dead letters (issue 27): a copy in bridge.dlq holds its body
// sealed to the hosts that deliver and send it. Its text is opened only
// here, with this host's keys, once its signature is proven (OpOpenDead
// for fleet-dlq show and list; a replay opens it the same way and sends
// the text again through the normal path, which seals it anew). Its
// binding is its kind, msg id and the host that signed the copy — the
// fleet-host header bridge.dlq keeps: the original's, for a copy a
// gateway refused or the broker dead-lettered; the dying host's, for a
// copy a gateway published of a death on its host (it re-seals what it
// publishes). Elsewhere the text stays sealed: the hosts it is sealed to
// are named, and a replay says on which host to run it.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/store"
)

// deadLetters owns fleet-dlq's replay and purge: one replay at a time
// (its record, send and cleanup are one step, under its lock). The
// Gateway wires it once the store is open.
type deadLetters struct {
	host     string
	stateDir string
	maxBody  int
	st       *store.Store
	log      *slog.Logger
	audit    *audit.Log
	reg      *registry
	caps     *inboxCaps // a local replay is held to its inbox's cap
	in       *intake    // a local replay goes into its inbox like any message

	// read at each replay: set in Run, after the store is open
	br    func() *broker.Broker  // nil: single-host mode
	admit func() *admission      // nil: single-host mode
	ctx   func() context.Context // publishes are aborted past the drain bound (hardCtx)
	keys  func() *seal.Keyring   // this host's sealing keys (nil: single-host mode)
	// keyHost names the host whose public sealing key has id ("": none
	// this host knows)
	keyHost func(id string) string

	mu sync.Mutex // one replay at a time
}

// Replay serves OpReplay.
func (d *deadLetters) Replay(req *api.ReplayRequest) (*api.Response, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(req.Raw) == 0 {
		// a dead letter of this host's store is known by its msg id and
		// its sender's host, even once replayed (its record stays)
		dl, derr := d.st.DeadLetter(req.MsgID)
		var env *envelope.Envelope
		host := ""
		if derr == nil && len(dl.Envelope) > 0 {
			var err error
			if env, err = envelope.Decode(dl.Envelope, 1<<30); err != nil {
				return nil, err
			}
			host = env.Sender.Host
		} else {
			host = recordedSender(d.st, d.host, req.MsgID)
		}
		prev := d.st.Replay(req.MsgID, host)
		if req.Known {
			return replayedAs(d.st, req.MsgID, prev)
		}
		if prev != nil {
			return d.resend(prev, req.MsgID)
		}
		if derr != nil {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s on this host", req.MsgID).
				WithHint("list them with: fleet-dlq list")
		}
		if env == nil {
			return nil, fault.New(fault.Data, fault.KindNotReplayable, "dead letter %s kept no message to deliver again", req.MsgID)
		}
		if len(env.Sealed) > 0 {
			// one of this host's messages that died in a broker inbox: kept
			// as published, sealed; its text sent again by the normal path
			o := d.openStored(env)
			if !o.Readable {
				return nil, fault.New(fault.Refused, fault.KindNotReplayable,
					"dead letter %s is sealed to %s: its text cannot be opened here (%s)", req.MsgID, hostList(o.SealedTo), o.Detail).
					WithHint("%s", replayWhere(req.MsgID, o.SealedTo, d.host))
			}
			env.Body, env.Sealed = o.Text, nil
		}
		return d.replayEnv(env, req.MsgID)
	}
	env, err := envelope.Decode(req.Raw, d.maxBody)
	if err != nil {
		return nil, err
	}
	admit := d.admit()
	if admit == nil {
		return nil, fault.New(fault.Unavailable, fault.KindBrokerDown, "this gateway runs without a broker: it cannot check a dead letter from bridge.dlq")
	}
	if err := admit.signed(req.SignedBy, req.Raw, req.Sig, env); err != nil {
		return nil, fault.New(fault.Refused, fault.KindNotAuthentic, "dead letter %s is not proven: %v", env.MsgID, err)
	}
	// proven: its sender's host signed it. A msg id is only what a host
	// says it is: a copy from another host than the one this host has the
	// message from is not that message
	if h := recordedSender(d.st, d.host, store.Key(env)); h != "" && h != env.Sender.Host {
		return nil, fault.New(fault.Refused, fault.KindNotAuthentic,
			"dead letter %s in bridge.dlq is signed by %s, but this host has message %s from %s: that copy is not it", env.MsgID, env.Sender.Host, env.MsgID, h).
			WithHint("see both with: fleet-dlq show %s", env.MsgID)
	}
	if prev := d.st.Replay(env.MsgID, env.Sender.Host); prev != nil {
		return d.resend(prev, "")
	}
	// a signed copy in bridge.dlq is not proof that the message died: a
	// host that received it could have put it there. Replayed only when
	// this host knows nothing else of it, or knows it dead.
	if r, err := d.st.Record(store.Key(env)); err == nil && r.State != store.Dead {
		return nil, fault.New(fault.Usage, fault.KindNotReplayable,
			"message %s is %s on this host, not dead: its copy in bridge.dlq is not replayed", env.MsgID, r.State).
			WithHint("purge the copy: fleet-dlq purge %s", env.MsgID)
	}
	if len(env.Sealed) > 0 {
		// proven above (admit.signed): opened with the signer's binding,
		// its text sent again by the normal path, which seals it anew
		o := d.open(env, req.SignedBy, true)
		if !o.Readable {
			return nil, fault.New(fault.Refused, fault.KindNotReplayable,
				"dead letter %s is sealed to %s: its text cannot be opened here (%s)", env.MsgID, hostList(o.SealedTo), o.Detail).
				WithHint("%s", replayWhere(env.MsgID, o.SealedTo, d.host))
		}
		env.Body, env.Sealed = o.Text, nil
	}
	if req.SignedBy != d.host && d.reg.Get(env.Recipient.Gid) == nil {
		return nil, fault.New(fault.Usage, fault.KindNotReplayable,
			"dead letter %s was sent from %s to %s: only its sender's gateway signs it again", env.MsgID, env.Sender.String(), env.Recipient.String()).
			WithHint("run fleet-dlq replay on host %s (or on the recipient's host)", env.Sender.Host)
	}
	return d.replayEnv(env, "")
}

// OpenDead serves OpOpenDead: a sealed dead letter from bridge.dlq
// (Raw) opened with this host's keys once its signature is proven, or
// one of this host's store (MsgID), or why not.
func (d *deadLetters) OpenDead(req *api.OpenDeadRequest) (*api.Response, error) {
	if len(req.Raw) == 0 {
		dl, err := d.st.DeadLetter(req.MsgID)
		if err != nil || len(dl.Envelope) == 0 {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s on this host", req.MsgID).
				WithHint("list them with: fleet-dlq list")
		}
		env, err := envelope.Decode(dl.Envelope, 1<<30)
		if err != nil {
			return nil, err
		}
		if len(env.Sealed) == 0 {
			return nil, fault.New(fault.Usage, fault.KindUsage, "dead letter %s is not sealed: its body is in it", req.MsgID)
		}
		return &api.Response{Opened: d.openStored(env)}, nil
	}
	env, err := envelope.Decode(req.Raw, d.maxBody)
	if err != nil {
		return nil, err
	}
	if len(env.Sealed) == 0 {
		return nil, fault.New(fault.Usage, fault.KindUsage, "dead letter %s is not sealed: its body is in it", env.MsgID)
	}
	admit := d.admit()
	if admit == nil || d.keys == nil || d.keys() == nil {
		return nil, fault.New(fault.Unavailable, fault.KindBrokerDown, "this gateway runs without a broker: it holds no sealing keys to open a dead letter from bridge.dlq")
	}
	return &api.Response{Opened: d.open(env, req.SignedBy, provenSigner(admit, req.SignedBy, req.Raw, req.Sig, env))}, nil
}

// provenSigner says whether host, a host this one trusts (or this one),
// signed body: the signature alone, not who the envelope says sent it —
// a copy a gateway published of a death on its host is signed by that
// host, not by the message's sender. admission.signed checks the
// signature before the sender's host, so a refusal for the sender's
// host (wrong_host) comes only with a signature proven.
func provenSigner(a *admission, host string, body, sig []byte, env *envelope.Envelope) bool {
	err := a.signed(host, body, sig, env)
	var r *broker.Refusal
	return err == nil || errors.As(err, &r) && r.Reason == broker.ReasonWrongHost
}

// openStored opens a sealed envelope of this host's store: one of its
// own messages that died in a broker inbox, kept as it was published
// (deaths.go: its signature by this host checked when the death came
// back), so bound to this host. One that names another sender is not
// opened.
func (d *deadLetters) openStored(env *envelope.Envelope) *api.Opened {
	return d.open(env, d.host, env.Sender.Host == d.host)
}

// open opens env's sealed body with this host's keys and the binding of
// the host that signed it (proven: its signature is; otherwise nothing is
// opened).
func (d *deadLetters) open(env *envelope.Envelope, signedBy string, proven bool) *api.Opened {
	o := &api.Opened{SealedTo: []string{}}
	ids, err := seal.Recipients(env.Sealed)
	var kr *seal.Keyring
	if d.keys != nil {
		kr = d.keys()
	}
	mine := map[string]bool{}
	if kr != nil {
		for _, k := range kr.Keys() {
			mine[k.ID] = true
		}
	}
	for _, id := range ids {
		host := ""
		switch {
		case mine[id.String()]:
			host = d.host
		case d.keyHost != nil:
			host = d.keyHost(id.String())
		}
		if host == "" {
			host = "key " + id.String()
		}
		if !slices.Contains(o.SealedTo, host) {
			o.SealedTo = append(o.SealedTo, host)
		}
	}
	switch {
	case err != nil:
		o.Reason, o.Detail = "tampered", err.Error()
	case !proven:
		o.Reason, o.Detail = "not_authentic", "its signature is not proven, so it is not opened"
	case kr == nil:
		o.Reason, o.Detail = "not_for_us", "this gateway holds no sealing keys"
	default:
		text, err := seal.Open(seal.Bind(string(env.Kind), env.MsgID, signedBy), env.Sealed, kr)
		var se *seal.Error
		switch {
		case err == nil:
			o.Readable, o.Text = true, string(text)
		case errors.As(err, &se):
			o.Reason, o.Detail = se.Reason(), err.Error()
		default:
			o.Reason, o.Detail = "tampered", err.Error()
		}
	}
	return o
}

// hostList says the hosts a dead letter is sealed to.
func hostList(hosts []string) string {
	if len(hosts) == 1 {
		return "host " + hosts[0]
	}
	return "hosts " + strings.Join(hosts, ", ")
}

// replayWhere is the hint of a sealed dead letter not readable here: run
// the replay on a host it is sealed to.
func replayWhere(msgID string, hosts []string, here string) string {
	var named []string
	for _, h := range hosts {
		if h != here && !strings.HasPrefix(h, "key ") {
			named = append(named, h)
		}
	}
	if len(named) == 0 {
		return "its text opens only with a key this host no longer holds, or no host it knows: purge it with: fleet-dlq purge " + msgID
	}
	return "run fleet-dlq replay " + msgID + " on host " + strings.Join(named, " or ")
}

// replayEnv delivers orig again under a new msg id. deadKey is this host's
// dead letter of it, removed once the replay is delivered ("" for one from
// bridge.dlq, which fleet-dlq acks itself).
func (d *deadLetters) replayEnv(orig *envelope.Envelope, deadKey string) (*api.Response, error) {
	switch orig.Kind {
	case envelope.Send, envelope.Reply, envelope.Broadcast:
	default:
		return nil, fault.New(fault.Usage, fault.KindNotReplayable, "a %s is not delivered again (only SEND, REPLY and BROADCAST are): %s", orig.Kind, orig.MsgID)
	}
	n := *orig
	n.MsgID, n.ReplayOf, n.Created, n.Expires = envelope.NewID(), orig.MsgID, time.Now().UTC(), time.Time{}
	n.Recipient.Group = "" // a broadcast copy goes again to the member it was for
	if n.Recipient.Gid == "" {
		return nil, fault.New(fault.Usage, fault.KindNotReplayable, "dead letter %s names no recipient entity", orig.MsgID)
	}
	if err := d.replayable(&n); err != nil {
		return nil, err
	}
	raw, err := envelope.Encode(&n)
	if err != nil {
		return nil, err
	}
	prev, err := d.st.PutReplay(orig.MsgID, orig.Sender.Host, raw)
	if err != nil {
		return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not record the replay").
			WithHint("free space in the state folder %s", d.stateDir)
	}
	if prev != nil { // a replay raced this one
		return d.resend(prev, deadKey)
	}
	state, err := d.deliverAgain(&n)
	if err != nil {
		if fault.KindOf(err) == fault.KindUnknownRecipient {
			// a local recipient that left (a remote one: deliverAgain)
			if derr := d.st.DropReplay(orig.MsgID, orig.Sender.Host); derr != nil {
				d.log.Error("forgetting a replay that did not happen", "msg_id", orig.MsgID, "err", derr)
			}
		}
		return nil, err
	}
	d.replayed(orig.MsgID, deadKey, &n)
	return &api.Response{Sent: &api.Sent{MsgID: n.MsgID, TraceID: n.TraceID, State: state,
		Recipient: n.Recipient.String(), Gid: n.Recipient.Gid, ReplayOf: orig.MsgID}}, nil
}

// replayable says whether env can be delivered from here: to an entity
// of this host, or published as this host's own message.
func (d *deadLetters) replayable(env *envelope.Envelope) error {
	if d.reg.Get(env.Recipient.Gid) != nil {
		return nil
	}
	if ident.GidHost(env.Recipient.Gid) == d.host {
		return fault.New(fault.NoRecipient, fault.KindUnknownRecipient, "no recipient %s: it left this host; the dead letter stays", env.Recipient.String())
	}
	if env.Sender.Host != d.host {
		return fault.New(fault.Usage, fault.KindNotReplayable,
			"message %s was sent from %s: only its sender's gateway signs it again", env.ReplayOf, env.Sender.String()).
			WithHint("run fleet-dlq replay on host %s", env.Sender.Host)
	}
	if d.br() == nil {
		return fault.New(fault.Unavailable, fault.KindBrokerDown, "recipient %s is on another host and this gateway has no broker", env.Recipient.String())
	}
	return nil
}

// deliverAgain hands a replay to its recipient's inbox here or publishes
// it; its state as a send reports it.
func (d *deadLetters) deliverAgain(env *envelope.Envelope) (string, error) {
	if d.reg.Get(env.Recipient.Gid) != nil {
		if err := d.caps.Room(env); err != nil {
			// refused, as by a full broker inbox below: no new dead letter
			if derr := d.st.DropReplay(env.ReplayOf, env.Sender.Host); derr != nil {
				d.log.Error("forgetting a refused replay", "replay_of", env.ReplayOf, "err", derr)
			}
			return "", err
		}
		rec, err := d.in.Accept(env)
		if err != nil {
			return "", err
		}
		return rec.State, nil
	}
	// not Gateway.publish: a replay refused by a full inbox is not a new dead
	// letter with a bounce — the dead letter it replays is still there
	now := time.Now().UTC()
	if err := d.st.RecordOutboundKeep(env, now, keptBytes(env))(); err != nil {
		return "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not record the replay").
			WithHint("free space in the state folder %s", d.stateDir)
	}
	d.audit.Message("published", env, 0, "replay of "+env.ReplayOf)
	err := d.br().Publish(d.ctx(), env.Recipient.Gid, env, true)
	switch kind := fault.KindOf(err); {
	case err == nil:
		d.audit.Message("confirmed", env, 0, "")
		return store.Accepted, nil
	case kind == fault.KindInboxFull || kind == fault.KindUnknownRecipient:
		// refused for sure (nacked, or returned unroutable): nothing of
		// this replay exists anywhere; a later one starts afresh
		if derr := d.st.ForgetRecord(env.MsgID); derr != nil {
			d.log.Error("forgetting a refused replay", "msg_id", env.MsgID, "err", derr)
		}
		if derr := d.st.DropReplay(env.ReplayOf, env.Sender.Host); derr != nil {
			d.log.Error("forgetting a refused replay", "replay_of", env.ReplayOf, "err", derr)
		}
	}
	// otherwise the outcome is unknown (no confirm, a lost connection):
	// the replay stays recorded, and the next replay sends the same
	// envelope, which the recipient's dedup drops if it has it
	return "", err
}

// resend sends a replay made before once more: a copy its recipient has
// is dropped there by its msg id.
func (d *deadLetters) resend(raw []byte, deadKey string) (*api.Response, error) {
	env, err := envelope.Decode(raw, 1<<30)
	if err != nil {
		return nil, err
	}
	if err := d.replayable(env); err != nil {
		return nil, err
	}
	state, err := d.deliverAgain(env)
	if err != nil {
		return nil, err
	}
	d.replayed(env.ReplayOf, deadKey, env)
	return &api.Response{Sent: &api.Sent{MsgID: env.MsgID, TraceID: env.TraceID, State: state,
		Recipient: env.Recipient.String(), Gid: env.Recipient.Gid, ReplayOf: env.ReplayOf, Again: true}}, nil
}

// replayedAs is what dead letter msgID was replayed as (prev, the
// replay recorded), in the state its record has now; nothing is sent.
func replayedAs(st *store.Store, msgID string, prev []byte) (*api.Response, error) {
	if prev == nil {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s on this host, and none replayed", msgID).
			WithHint("list them with: fleet-dlq list")
	}
	env, err := envelope.Decode(prev, 1<<30)
	if err != nil {
		return nil, err
	}
	state := store.Accepted
	if r, err := st.Record(store.Key(env)); err == nil {
		state = r.State
	}
	return &api.Response{Sent: &api.Sent{MsgID: env.MsgID, TraceID: env.TraceID, State: state,
		Recipient: env.Recipient.String(), Gid: env.Recipient.Gid, ReplayOf: env.ReplayOf, Again: true, SenderGid: env.Sender.Gid}}, nil
}

// replayed removes the dead letter a replay delivered, and says so.
func (d *deadLetters) replayed(orig, deadKey string, env *envelope.Envelope) {
	if deadKey != "" {
		if _, err := d.st.ForgetDead([]string{deadKey}); err != nil {
			d.log.Warn("a replayed dead letter was not removed", "msg_id", deadKey, "err", err)
		}
	}
	d.audit.Write(audit.Line{Event: "replayed", TraceID: env.TraceID, MsgID: env.MsgID, Kind: string(env.Kind),
		Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Reason: "replay of " + orig})
	d.log.Info("dead letter delivered again", "replay_of", orig, "msg_id", env.MsgID, "trace_id", env.TraceID)
}

// Purge serves OpPurgeDead.
func (d *deadLetters) Purge(req *api.PurgeDeadRequest) (*api.Response, error) {
	if len(req.MsgIDs) == 0 {
		return nil, fault.New(fault.Usage, fault.KindUsage, "no dead letters named to purge")
	}
	n, err := d.st.ForgetDead(req.MsgIDs)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			n = 0
		} else {
			return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "could not purge")
		}
	}
	for _, id := range req.MsgIDs {
		d.audit.Write(audit.Line{Event: "purged", MsgID: id})
	}
	return &api.Response{Count: n}, nil
}
