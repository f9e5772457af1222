package mcpapp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The control plane (U4) and the trace, as fleet-spawn, fleet-stop and
// fleet-trace ask for them: the same socket requests, the same defaults.
const (
	defaultControlSeconds = 30 // spawn, stop: fleet-spawn's and fleet-stop's --timeout
	defaultTraceSeconds   = 5  // trace: fleet-trace's --timeout
	maxTraceSeconds       = 60
	defaultMaxHops        = 200
	maxMaxHops            = 1000 // what one host gives per trace
	maxArgs               = 64
)

type SpawnIn struct {
	Name           string   `json:"name" jsonschema:"the new entity's name: a letter, then up to 63 letters, digits, '-' or '_'"`
	Host           string   `json:"host,omitempty" jsonschema:"the host to start it on (default: this one); the roster tool lists the hosts"`
	Profile        string   `json:"profile,omitempty" jsonschema:"the launcher profile of that host's gateway config (profile.NAME.*)"`
	Groups         []string `json:"groups,omitempty" jsonschema:"groups to make it a member of"`
	Args           []string `json:"args,omitempty" jsonschema:"arguments for the profile's command (its \"$@\")"`
	RequestID      string   `json:"request_id,omitempty" jsonschema:"the request's id; a call again with the same id starts nothing and answers with the same gid (use it to retry after a timeout)"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"how long to wait for the host's answer, in seconds"`
}

type SpawnOut struct {
	Spawned api.Spawned `json:"spawned" jsonschema:"the new entity: gid, name, host, request_id, profile, mode, groups"`
	Next    string      `json:"next" jsonschema:"what to do next"`
	Inbox   Inbox       `json:"inbox" jsonschema:"mail waiting for you now"`
}

type StopIn struct {
	Target         string `json:"target" jsonschema:"the entity to stop: NAME, NAME@HOST or a gid"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"how long to wait for its host's answer, in seconds"`
}

type StopOut struct {
	Stopped api.Stopped `json:"stopped" jsonschema:"the entity that left the fleet; dead_lettered: how much mail waiting for it was dead-lettered; process: what its launcher stopped (empty: it was joined, not spawned, and only left)"`
	Inbox   Inbox       `json:"inbox" jsonschema:"mail waiting for you now"`
}

type TraceIn struct {
	TraceID        string `json:"trace_id" jsonschema:"the flow's trace id (send, ask and receive results carry it)"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"how long to wait for the other hosts' answers, in seconds"`
	MaxHops        int    `json:"max_hops,omitempty" jsonschema:"return at most this many hops, the earliest"`
}

type TraceOut struct {
	TraceID string            `json:"trace_id"`
	Hops    []api.Hop         `json:"hops" jsonschema:"every hop the hosts that answered saw, by time (each host's own clock); no message text"`
	Omitted int               `json:"omitted,omitempty" jsonschema:"hops left out by max_hops"`
	Hosts   []api.TraceHost   `json:"hosts" jsonschema:"each host asked and how it answered: answered, no_answer or unreachable"`
	Names   map[string]string `json:"names,omitempty" jsonschema:"gid to name, for the hops' senders and recipients this gateway knows"`
	Note    string            `json:"note,omitempty" jsonschema:"what is missing, and what to call to get it"`
	Inbox   Inbox             `json:"inbox" jsonschema:"mail waiting for you now"`
}

func (s *server) addControlTools() {
	control := intRange(1, maxWaitSeconds).withDefault(defaultControlSeconds)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "spawn", Annotations: additive("Spawn an entity", false),
		Description: "Start a new entity (an agent or a script) on a host, through that host gateway's launcher " +
			"profile, and register it: it gets its own credential and inbox. Waits for the host's answer and returns " +
			"the new entity's gid. Each request is carried out once: to retry after a timeout, call again with the " +
			"request_id of the first call (a call without one is a new request and would start a second entity)."},
		map[string]prop{"name": pattern(namePattern, 64), "host": pattern(hostPattern, 63), "profile": pattern(namePattern, 64).withDefault("default"),
			"groups": {items: ptr(pattern(namePattern, 64))}, "args": {items: ptr(text(0, 4096))},
			"request_id": text(1, maxID), "timeout_seconds": control}}, s.spawn)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "stop", Annotations: destructive("Stop an entity", true),
		Description: "Stop an entity wherever it runs: its host's launcher closes its tmux window or ends its process, " +
			"and it leaves the fleet — mail still waiting for it is dead-lettered and its credential stops working. " +
			"An entity that was joined rather than spawned only leaves. Waits for the host's answer."},
		map[string]prop{"target": text(1, maxAddress), "timeout_seconds": control}}, s.stop)
	addTool(s.mcp, toolDef{&mcp.Tool{Name: "trace", Annotations: readOnly("Trace a flow"),
		Description: "Every hop of one flow (a trace id), from the audit logs of this host and every trusted host: " +
			"time, host, entity, kind, msg id, event (accepted, published, delivered, drained, dead, ...) and reason. " +
			"Hosts that do not answer within timeout_seconds are named in hosts and note; the hops they hold are missing."},
		map[string]prop{"trace_id": text(1, maxID), "timeout_seconds": intRange(1, maxTraceSeconds).withDefault(defaultTraceSeconds),
			"max_hops": intRange(1, maxMaxHops).withDefault(defaultMaxHops)}}, s.trace)
}

func ptr[T any](v T) *T { return &v }

func (s *server) spawn(ctx context.Context, req *mcp.CallToolRequest, in SpawnIn) (*mcp.CallToolResult, SpawnOut, error) {
	timeout, err := seconds("timeout_seconds", in.TimeoutSeconds, defaultControlSeconds)
	if err != nil {
		return nil, SpawnOut{}, toolError(err, "")
	}
	host, profile := in.Host, in.Profile
	if host == "" {
		host = s.gw.Host
	}
	if profile == "" {
		profile = "default"
	}
	stop := s.progress(ctx, req, fmt.Sprintf("waiting for host %s to spawn %s", host, in.Name))
	resp, err := s.call(ctx, &api.SpawnRequest{Name: in.Name, Host: host, Profile: profile, Groups: in.Groups,
		Args: in.Args, RequestID: in.RequestID, TimeoutMS: timeout.Milliseconds()})
	stop()
	if err != nil {
		hint := ""
		if fault.KindOf(err) == fault.KindTimeout || ctx.Err() != nil {
			hint = "the host may still start it: call spawn again with the same request_id (and no other change) to learn its gid without starting a second one"
			if in.RequestID == "" {
				hint = "the host may still start it; this call had no request_id, so look for " + in.Name + " with the roster tool before calling spawn again"
			}
		}
		if ctx.Err() != nil {
			err = fault.New(fault.TempFail, fault.KindTimeout, "cancelled while waiting for host %s to spawn %s", host, in.Name)
		}
		return nil, SpawnOut{}, toolError(err, hint)
	}
	sp := *resp.Spawned
	if sp.Groups == nil {
		sp.Groups = []string{}
	}
	return nil, SpawnOut{Spawned: sp, Inbox: s.inbox.now(),
		Next: fmt.Sprintf("%s@%s is registered (mode %s); send it work with the send tool, to %s@%s", sp.Name, sp.Host, sp.Mode, sp.Name, sp.Host)}, nil
}

func (s *server) stop(ctx context.Context, req *mcp.CallToolRequest, in StopIn) (*mcp.CallToolResult, StopOut, error) {
	timeout, err := seconds("timeout_seconds", in.TimeoutSeconds, defaultControlSeconds)
	if err != nil {
		return nil, StopOut{}, toolError(err, "")
	}
	stop := s.progress(ctx, req, "waiting for "+in.Target+" to stop")
	resp, err := s.call(ctx, &api.StopRequest{Target: in.Target, TimeoutMS: timeout.Milliseconds()})
	stop()
	if err != nil {
		if ctx.Err() != nil {
			err = fault.New(fault.TempFail, fault.KindTimeout, "cancelled while waiting for %s to stop", in.Target)
		}
		hint := ""
		if fault.KindOf(err) == fault.KindTimeout {
			hint = "its host may still stop it: look with the roster tool, and call stop again if it is still there"
		}
		return nil, StopOut{}, toolError(err, hint)
	}
	return nil, StopOut{Stopped: *resp.Stopped, Inbox: s.inbox.now()}, nil
}

func (s *server) trace(ctx context.Context, req *mcp.CallToolRequest, in TraceIn) (*mcp.CallToolResult, TraceOut, error) {
	timeout, err := bounded("timeout_seconds", in.TimeoutSeconds, defaultTraceSeconds, 1, maxTraceSeconds)
	if err != nil {
		return nil, TraceOut{}, toolError(err, "")
	}
	maxH, err := bounded("max_hops", in.MaxHops, defaultMaxHops, 1, maxMaxHops)
	if err != nil {
		return nil, TraceOut{}, toolError(err, "")
	}
	resp, err := s.call(ctx, &api.TraceRequest{TraceID: in.TraceID, TimeoutMS: (time.Duration(timeout) * time.Second).Milliseconds()})
	if err != nil {
		return nil, TraceOut{}, toolError(err, "")
	}
	tr := resp.Trace
	if tr == nil {
		return nil, TraceOut{}, toolError(fault.New(fault.Software, fault.KindProtocol, "the gateway sent no trace"), "")
	}
	out := TraceOut{TraceID: tr.TraceID, Hops: tr.Hops, Hosts: tr.Hosts, Names: tr.Names}
	if out.Hops == nil {
		out.Hops = []api.Hop{}
	}
	if out.Hosts == nil {
		out.Hosts = []api.TraceHost{}
	}
	if len(out.Hops) > maxH {
		out.Omitted, out.Hops = len(out.Hops)-maxH, out.Hops[:maxH]
	}
	var silent, refused []string
	for _, h := range tr.Hosts {
		if h.State == api.TraceNoAnswer || h.State == api.TraceUnreachable {
			silent = append(silent, h.Host)
		}
		if h.State == api.TraceRefused {
			refused = append(refused, h.Host+" ("+h.Detail+")")
		}
	}
	if len(tr.Hops) == 0 && len(silent) == 0 && len(refused) == 0 {
		return nil, TraceOut{}, toolError(fault.New(fault.NoRecipient, fault.KindUnknownTrace, "no host saw trace %s", in.TraceID),
			"a trace id is in the results of send, ask and receive (trace_id); audit logs keep what their rotation keeps")
	}
	if len(silent) > 0 {
		out.Note = fmt.Sprintf("no answer from %s within %ds: their hops are missing; call trace again, with a longer timeout_seconds (at most %d)",
			strings.Join(silent, ", "), timeout, maxTraceSeconds)
	}
	if len(refused) > 0 {
		if out.Note != "" {
			out.Note += "; "
		}
		out.Note += "refused by " + strings.Join(refused, ", ") + ": their hops are missing"
	}
	out.Inbox = s.inbox.now()
	return nil, out, nil
}
