package cli

import (
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
)

// The JSON objects the short commands print (fleet-json(7)). An
// entity is always {"gid","name","host"} — in messages (the envelope's
// sender and recipient), in what a send returns and in a delivery state —
// and a time is RFC 3339 with its zone.

// Party is an entity reference in every JSON output.
type Party struct {
	Gid  string `json:"gid,omitempty"`
	Name string `json:"name,omitempty"`
	Host string `json:"host,omitempty"`
}

// partyOf builds the reference from a gid and a "name@host" (either may
// be empty, or the second a gid); a gid names its host.
func partyOf(gid, nameAtHost string) *Party {
	p := &Party{Gid: gid}
	if ident.IsGid(nameAtHost) {
		p.Gid = nameAtHost
	} else if name, host, ok := strings.Cut(nameAtHost, "@"); ok {
		p.Name, p.Host = name, host
	} else {
		p.Name = nameAtHost
	}
	if p.Host == "" && ident.IsGid(p.Gid) {
		p.Host = ident.GidHost(p.Gid)
	}
	return p
}

// named is a recipient as a text line names it: NAME@HOST, or — when
// the gateway knows no name for it (an entity that left and was
// forgotten) — its gid, saying so rather than inventing one.
func named(nameAtHost string) string {
	if ident.IsGid(nameAtHost) {
		return nameAtHost + " (name not known here)"
	}
	return nameAtHost
}

// RecordOut is a delivery state as every JSON output gives it
// (fleet-send --status, fleet-roster dead --json).
func RecordOut(r *api.Record) any { return recordOut(r) }

// PartyOf is partyOf, for the other command packages.
func PartyOf(gid, nameAtHost string) *Party { return partyOf(gid, nameAtHost) }

// PartyFrom is an envelope's party as every JSON output gives it.
func PartyFrom(p envelope.Party) *Party {
	out := partyOf(p.Gid, "")
	out.Name = p.Name
	if p.Host != "" {
		out.Host = p.Host
	}
	return out
}

// sentJSON is what fleet-send --json and fleet-ask print once a message
// is accepted.
type sentJSON struct {
	MsgID     string `json:"msg_id"`
	TraceID   string `json:"trace_id"`
	State     string `json:"state"`
	Recipient *Party `json:"recipient"`
	Warning   string `json:"warning,omitempty"` // the recipient's host reads stale or gone: the broker holds it
	// ClearHosts: the host got the text in the clear (it has no sealing
	// key; plaintext-hosts or seal-fallback = clear)
	ClearHosts []string `json:"clear_hosts,omitempty"`
}

func sentOut(s *api.Sent) sentJSON {
	return sentJSON{MsgID: s.MsgID, TraceID: s.TraceID, State: s.State, Recipient: partyOf(s.Gid, s.Recipient), Warning: s.Warning, ClearHosts: s.ClearHosts}
}

// recordJSON is a message's delivery state (fleet-send --status, --until).
type recordJSON struct {
	MsgID     string    `json:"msg_id"`
	Kind      string    `json:"kind"`
	TraceID   string    `json:"trace_id"`
	State     string    `json:"state"`
	Recipient *Party    `json:"recipient"`
	Attempts  int       `json:"attempts"`
	Reason    string    `json:"reason,omitempty"`
	Accepted  time.Time `json:"accepted"`
	Done      time.Time `json:"done,omitzero"`
	Warning   string    `json:"warning,omitempty"` // fleet-send --until: the recipient's host read stale or gone when sent
}

func recordOut(r *api.Record) recordJSON {
	return recordJSON{MsgID: r.MsgID, Kind: r.Kind, TraceID: r.TraceID, State: r.State, Recipient: partyOf(r.Gid, r.Recipient),
		Attempts: r.Attempts, Reason: r.Reason, Accepted: r.Accepted, Done: r.Done}
}
