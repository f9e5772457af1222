package gateway

import (
	"os"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/version"
)

// dispatch hands a request to its verb: the socket (socket.go) reads
// it, the entity verbs (entities.go), the sends and the parts answer it.
func (g *Gateway) dispatch(c *conn, req api.Request) (*api.Response, error) {
	if g.runCtx.Err() != nil {
		return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
	}
	switch req := req.(type) {
	case *api.HelloRequest:
		if req.Proto != api.Proto {
			return nil, fault.New(fault.Data, fault.KindProtocol,
				"client speaks socket protocol %d, this gateway speaks %d", req.Proto, api.Proto).
				WithHint("use the fleet commands of the same release as fleet-gw")
		}
		c.good = true
		return &api.Response{Hello: &api.Hello{
			Proto: api.Proto, Host: g.cfg.Host, Version: version.Version,
			MaxBody: g.cfg.MaxBody, Pid: os.Getpid(), Features: api.Features,
		}}, nil
	case *api.JoinRequest:
		return g.join(req)
	case *api.LeaveRequest:
		return g.leave(req)
	case *api.RosterRequest:
		return g.roster()
	case *api.WhoamiRequest:
		b, err := g.caller(req.Token)
		if err != nil {
			return nil, err
		}
		row := g.row(b.snapshot(), nil, nil)
		// live asks are not in the store's pending count; fleet-mcp's
		// new-mail check must see them too
		live := b.liveHead(time.Now())
		row.Asks = len(live)
		if len(live) > 0 {
			row.NewestAsk = live[len(live)-1].MsgID
		}
		row.NewestSeq = g.st.Newest(row.Gid)
		return &api.Response{Entity: &row}, nil
	case *api.StatusRequest:
		return g.setStatus(c.pid, req)
	case *api.GatewayStatusRequest:
		return g.gatewayStatus()
	case *api.SendRequest:
		if req.AnswerTo != "" {
			return g.answer(req)
		}
		return g.route.Send(req)
	case *api.LookupRequest:
		return g.route.Lookup(req)
	case *api.WaitRequest:
		return g.route.WaitState(req)
	case *api.BcastRequest:
		return g.broadcast(req)
	case *api.GroupsRequest:
		return g.setGroups(req)
	case *api.AcceptRequest: // policy.go
		b := g.reg.ByName(req.Name)
		if b == nil {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name)
		}
		e, err := g.policy.Change(b, req)
		if err != nil {
			return nil, err
		}
		if req.Action != "list" {
			g.notes.Change(e.Gid)
		}
		row := g.row(e, nil, nil)
		return &api.Response{Entity: &row}, nil
	case *api.SpawnRequest: // control.go
		return g.ctl.Spawn(req)
	case *api.StopRequest: // control.go
		return g.ctl.Stop(req)
	case *api.DeadRequest:
		return g.dead(req)
	case *api.ReplayRequest: // dlq.go
		return g.dlq.Replay(req)
	case *api.OpenDeadRequest: // dlq.go
		return g.dlq.OpenDead(req)
	case *api.PurgeDeadRequest:
		return g.dlq.Purge(req)
	case *api.TraceRequest: // trace.go
		return g.tracer.Trace(req)
	case *api.AsksRequest: // asklist.go
		own := ""
		if req.Text { // the text of the asks put to the caller: its credential
			b, err := g.caller(req.Token)
			if err != nil {
				return nil, err
			}
			own = b.snapshot().Gid
		}
		return &api.Response{Asks: g.asks.Open(g.cfg.Host, time.Now(), own)}, nil
	case *api.AckRequest:
		return nil, fault.New(fault.Data, fault.KindProtocol, "ack outside recv")
	}
	return nil, fault.New(fault.Data, fault.KindProtocol, "unknown op %q", api.OpOf(req)).
		WithHint("use the fleet commands of the same release as fleet-gw")
}

func (g *Gateway) dead(req *api.DeadRequest) (*api.Response, error) {
	gid := ""
	if req.Name != "" {
		var ok bool
		gid, ok = g.reg.Named(req.Name)
		if !ok {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name)
		}
	}
	list, err := g.st.DeadLetters(gid)
	if err != nil {
		return nil, err
	}
	out := make([]api.DeadLetter, 0, len(list))
	for _, d := range list {
		var env *envelope.Envelope
		if len(d.Envelope) > 0 {
			env, _ = envelope.Decode(d.Envelope, 1<<30)
		}
		out = append(out, api.DeadLetter{Record: g.route.Record(&d.Record), Envelope: env})
	}
	return &api.Response{Dead: out}, nil
}
