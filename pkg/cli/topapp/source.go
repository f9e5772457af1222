package topapp

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// source is fleet-top's side of the gateway: one connection for the
// snapshots (one call at a time), a connection of its own for each
// trace, replay or send (a trace waits for other hosts: the rows go on
// being read meanwhile), and one for the watch stream.
type source struct {
	c      *ucli.Context
	as     string // --as NAME ("": none)
	mu     sync.Mutex
	client *api.Client
}

func (s *source) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		s.client.Close()
	}
}

// snapshot reads the gateway's status, the roster, the dead letters and
// the open asks (with the text of those put to the --as entity).
func (s *source) snapshot() (*snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := &snapshot{Read: time.Now()}
	resp, err := s.client.Call(&api.GatewayStatusRequest{})
	if err != nil {
		return nil, err
	}
	snap.Status = resp.GatewayStatus
	if resp, err = s.client.Call(&api.RosterRequest{}); err != nil {
		return nil, err
	}
	snap.Rows = resp.Entities
	if resp, err = s.client.Call(&api.DeadRequest{}); err != nil {
		return nil, err
	}
	snap.Dead = resp.Dead
	if s.client.Hello.Has(api.FeatureAsks) { // an older gateway lists none
		if resp, err = s.client.Call(&api.AsksRequest{Text: s.as != ""}); err != nil {
			return nil, err
		}
		snap.Asks, snap.HasAsks = resp.Asks, true
	}
	return snap, nil
}

// call makes one call on a connection of its own, with the --as
// credential when there is one.
func (s *source) call(req api.Request) (*api.Response, error) {
	sess, err := fleetcli.Connect(s.c)
	if err != nil {
		return nil, err
	}
	defer sess.Client.Close()
	return sess.Client.Call(req)
}

// trace is the hops of one flow, as fleet-trace gathers them.
func (s *source) trace(traceID string) (*api.Trace, error) {
	resp, err := s.call(&api.TraceRequest{TraceID: traceID, TimeoutMS: (5 * time.Second).Milliseconds()})
	if err != nil {
		return nil, err
	}
	if resp.Trace == nil {
		return nil, fault.New(fault.Software, fault.KindProtocol, "the gateway sent no trace")
	}
	return resp.Trace, nil
}

// replay delivers this host's dead letter msgID again, as fleet-dlq
// replay MSG_ID does for a letter of the store.
func (s *source) replay(msgID string) (*api.Sent, error) {
	resp, err := s.call(&api.ReplayRequest{MsgID: msgID})
	if err != nil {
		return nil, err
	}
	if resp.Sent == nil {
		return nil, fault.New(fault.Software, fault.KindProtocol, "the gateway sent no outcome")
	}
	return resp.Sent, nil
}

// send sends body to to as the --as entity.
func (s *source) send(to, body string) (*api.Sent, error) {
	if s.as == "" {
		return nil, fleetcli.Usage("sending needs an entity: start fleet-top --as NAME")
	}
	resp, err := s.call(&api.SendRequest{To: to, Body: body})
	if err != nil {
		return nil, err
	}
	if resp.Sent == nil {
		return nil, fault.New(fault.Software, fault.KindProtocol, "the gateway sent no outcome")
	}
	return resp.Sent, nil
}

// answer answers the ask askID as the --as entity, as fleet-send
// --answer ASK_ID does.
func (s *source) answer(askID, body string) (*api.Sent, error) {
	if s.as == "" {
		return nil, fleetcli.Usage("answering needs an entity: start fleet-top --as NAME")
	}
	return s.sent(&api.SendRequest{AnswerTo: askID, Body: body})
}

// reply replies to the message msgID of the --as entity's inbox, as
// fleet-send --reply-to MSG_ID does.
func (s *source) reply(msgID, body string) (*api.Sent, error) {
	if s.as == "" {
		return nil, fleetcli.Usage("replying needs an entity: start fleet-top --as NAME")
	}
	return s.sent(&api.SendRequest{ReplyTo: msgID, Body: body})
}

func (s *source) sent(req *api.SendRequest) (*api.Sent, error) {
	resp, err := s.call(req)
	if err != nil {
		return nil, err
	}
	if resp.Sent == nil {
		return nil, fault.New(fault.Software, fault.KindProtocol, "the gateway sent no outcome")
	}
	return resp.Sent, nil
}

// stream is the gateway's watch stream, read on a connection of its own
// as fleet-roster --watch reads it. Its reader never blocks: a full
// buffer drops the event (counted), so a slow screen never makes the
// gateway drop the watcher.
type stream struct {
	client  *api.Client
	ch      chan api.WatchEvent
	err     error // why it ended, once ch is closed
	dropped atomic.Int64
}

// openStream opens the stream and waits for the gateway's word that it
// is open.
func (s *source) openStream() (*stream, error) {
	sess, err := fleetcli.Connect(s.c)
	if err != nil {
		return nil, err
	}
	if !sess.Client.Hello.Has(api.FeatureWatch) {
		sess.Client.Close()
		return nil, fault.New(fault.Unavailable, fault.KindProtocol, "this gateway has no watch stream (an older build)").
			WithHint("fleet-top --once prints a snapshot; upgrade the gateway for the live flow")
	}
	// with --as, the text of the mail of that entity's own inbox (and
	// of no other)
	if _, err := sess.Client.Call(&api.WatchRequest{Text: s.as != ""}); err != nil {
		sess.Client.Close()
		return nil, err
	}
	st := &stream{client: sess.Client, ch: make(chan api.WatchEvent, 1024)}
	go func() {
		defer close(st.ch)
		for {
			resp, err := st.client.Read()
			if err != nil {
				st.err = err
				return
			}
			if resp.Event == nil {
				continue
			}
			select {
			case st.ch <- *resp.Event:
			default:
				st.dropped.Add(1)
			}
		}
	}()
	return st, nil
}

func (st *stream) close() { st.client.Close() }
