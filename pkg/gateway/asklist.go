package gateway

// asklist.go — the open asks of this host, as OpAsks lists them
// (fleet-top's ASKS pane): the asks its entities put and still wait on
// (asks.waiting), and the asks put to its entities from other hosts that
// were delivered here and neither answered nor expired (asks.seen). An
// ask between two entities of this host is in both: it is listed once,
// while its asker waits. The list is the asks part's own verb: nothing
// outside it reads its maps.

import (
	"sort"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
)

// Open lists the asks open now. own is the gid of the caller when it
// asked for its own asks' text ("": no text at all): an ask put to own
// carries its body, no other ever does.
func (a *asks) Open(host string, now time.Time, own string) []api.OpenAsk {
	a.mu.Lock()
	defer a.mu.Unlock()
	listed := map[string]bool{}
	var out []api.OpenAsk
	add := func(env *envelope.Envelope) {
		if env == nil || listed[env.MsgID] || env.Expired(now) {
			return
		}
		listed[env.MsgID] = true
		o := api.OpenAsk{MsgID: env.MsgID, TraceID: env.TraceID, Kind: string(env.Kind),
			Asker: env.Sender.String(), AskerGid: env.Sender.Gid, Target: env.Recipient.String(), TargetGid: env.Recipient.Gid,
			Size: len(env.Body), Opened: env.Created.UTC(), Deadline: env.Expires.UTC()}
		if own != "" && env.Recipient.Gid == own {
			o.Body = env.Body
		}
		out = append(out, o)
	}
	for _, w := range a.waiting {
		add(w.env)
	}
	for _, s := range a.seen {
		// one asked here is open while its asker waits (listed above);
		// one from another host, until it is answered or expires
		if s.env.Sender.Host != host && !s.answered {
			add(s.env)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Opened.Equal(out[j].Opened) {
			return out[i].Opened.Before(out[j].Opened)
		}
		return out[i].MsgID < out[j].MsgID
	})
	return out
}

// Close marks the ask id, put to an entity of this host, answered: it is
// no longer open (an answer sent, whatever became of it).
func (a *asks) Close(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s, ok := a.seen[id]; ok {
		s.answered = true
		a.seen[id] = s
	}
}
