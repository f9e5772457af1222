package gateway

import (
	"os"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/version"
)

// dispatch hands a request to its verb: the socket (socket.go) reads
// it, the entity verbs (entities.go), the sends and the parts answer it.
func (g *Gateway) dispatch(c *conn, req *api.Request) (*api.Response, error) {
	if g.runCtx.Err() != nil {
		return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
	}
	switch req.Op {
	case api.OpHello:
		if req.Proto != api.Proto {
			return nil, fault.New(fault.Data, fault.KindProtocol,
				"client speaks socket protocol %d, this gateway speaks %d", req.Proto, api.Proto).
				WithHint("use the fleet commands of the same release as fleet-gw")
		}
		c.good = true
		return &api.Response{Hello: &api.Hello{
			Proto: api.Proto, Host: g.cfg.Host, Version: version.Version,
			MaxBody: g.cfg.MaxBody, Pid: os.Getpid(),
		}}, nil
	case api.OpJoin:
		return g.join(req)
	case api.OpLeave:
		return g.leave(req)
	case api.OpRoster:
		return g.roster()
	case api.OpWhoami:
		b, err := g.caller(req)
		if err != nil {
			return nil, err
		}
		row := g.row(b.snapshot(), nil, nil)
		// live asks are not in the store's pending count; fleet-mcp's
		// new-mail check must see them too
		row.Asks = len(b.liveHead(time.Now()))
		return &api.Response{Entity: &row}, nil
	case api.OpStatus:
		return g.setStatus(c.pid, req)
	case api.OpGatewayStatus:
		return g.gatewayStatus()
	case api.OpSend:
		if req.AnswerTo != "" {
			return g.answer(req)
		}
		return g.send(req)
	case api.OpLookup:
		return g.lookup(req)
	case api.OpWait:
		return g.waitState(req)
	case api.OpBcast:
		return g.broadcast(req)
	case api.OpGroups:
		return g.setGroups(req)
	case api.OpSpawn: // control.go
		return g.ctl.Spawn(req)
	case api.OpStop: // control.go
		return g.ctl.Stop(req)
	case api.OpDead:
		return g.dead(req)
	case api.OpReplay: // dlq.go
		return g.dlq.Replay(req)
	case api.OpOpenDead: // dlq.go
		return g.dlq.OpenDead(req)
	case api.OpPurgeDead:
		return g.dlq.Purge(req)
	case api.OpTrace: // trace.go
		return g.tracer.Trace(req)
	case api.OpAck:
		return nil, fault.New(fault.Data, fault.KindProtocol, "ack outside recv")
	}
	return nil, fault.New(fault.Data, fault.KindProtocol, "unknown op %q", req.Op).
		WithHint("use the fleet commands of the same release as fleet-gw")
}

// caller returns the entity whose credential the request presents.
func (g *Gateway) caller(req *api.Request) (*mailbox, error) {
	if req.Token == "" {
		return nil, fault.New(fault.Refused, fault.KindNoCredential, "no credential: this command acts as an entity").
			WithHint("set FLEET_TOKEN, or pass --as NAME for an entity registered on this host")
	}
	gid, secret, err := ident.Parse(req.Token)
	if err != nil {
		return nil, err
	}
	if h := ident.GidHost(gid); h != g.cfg.Host {
		// the credential names its host: say so, rather than "not valid"
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "the credential is one of host %s, not of this host (%s)", h, g.cfg.Host).
			WithHint("run the command on %s, where its entity lives; here, use a credential fleet-roster join printed on %s (or --as NAME)", h, g.cfg.Host)
	}
	b := g.reg.Get(gid)
	if b == nil || !ident.Check(secret, b.snapshot().TokenHash) {
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "credential is not valid on this gateway").
			WithHint("a credential is issued by fleet-roster join and dies with fleet-roster leave")
	}
	return b, nil
}

func (g *Gateway) dead(req *api.Request) (*api.Response, error) {
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
		out = append(out, api.DeadLetter{Record: g.apiRecord(&d.Record), Envelope: env})
	}
	return &api.Response{Dead: out}, nil
}
