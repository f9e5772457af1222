package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/trust"
)

// A name means one entity across the hosts a gateway trusts: scripts and
// agent prompts say "main2", not a gid, and one duplicate must not break
// them on every host.
//
//   - Join and spawn refuse a name a trusted host has, as this gateway last
//     heard it (64 name_taken, naming NAME@HOST), whatever that host's
//     state: a stopped host's entity keeps its name and its inbox.
//   - Two joins of one name that neither host could see (at once, within
//     a presence interval; or while the two did not trust each other yet,
//     or could not hear each other) both succeed. Then the name belongs to
//     the entity whose gid was made first: a gid is HOST.UUIDv7, and a v7
//     uuid begins with the time it was made, in ms, so every gateway
//     orders the two gids the same way whatever it heard first (within one
//     ms, by the rest of the uuid), and the order never changes while both
//     live. A bare NAME goes to that holder on every host — on the other
//     one's host too — and the send's warning says so; the other is reached
//     as NAME@HOST or by gid. fleet-roster marks every row of the name with
//     name_holder; the host of the one that lost logs an error once (with
//     the fix: leave it and join it under another name), every other host
//     a warning. When one of them leaves, the name is one entity again.
//   - A name only a host this gateway does not trust announces is 67
//     untrusted_host, naming that host and that it is not trusted: its
//     presence was refused, so what it says is unproven, repeated only as
//     a hint and never routed to; never a "did you mean" of another entity.

// nameBook owns what this gateway believes of names beyond one host: the
// conflicts it told, and what hosts it does not trust announce (rumours:
// never believed, only named in an error).
type nameBook struct {
	log *slog.Logger
	ttl time.Duration // a rumour is repeated for this long after it was last heard

	mu        sync.Mutex
	conflicts map[string]string  // name -> the conflict last told (its gids, the holder's first)
	rumours   map[string]*rumour // untrusted host -> what it announces
}

// rumour is what a host this gateway does not trust announces of itself.
type rumour struct {
	names map[string]string // gid -> name
	heard time.Time
}

// Bounds of what untrusted hosts can make this gateway hold.
const (
	maxRumourHosts = 64
	maxRumourNames = 1024 // per host
)

func newNameBook(log *slog.Logger, ttl time.Duration) *nameBook {
	return &nameBook{log: log, ttl: ttl, conflicts: map[string]string{}, rumours: map[string]*rumour{}}
}

// firstMade reports whether gid a was made before gid b: by the uuid (a
// v7 uuid begins with its time; the same hex spelling orders as numbers),
// then by host. Every gateway orders two gids the same way.
func firstMade(a, b string) bool {
	ha, ua, _ := strings.Cut(a, ".")
	hb, ub, _ := strings.Cut(b, ".")
	if ua != ub {
		return ua < ub
	}
	return ha < hb
}

// holder is the row, of rows of one name, that the name means: the
// entity made first.
func holder(rows []api.EntityRow) api.EntityRow {
	h := rows[0]
	for _, r := range rows[1:] {
		if firstMade(r.Gid, h.Gid) {
			h = r
		}
	}
	return h
}

// others are rows' NAME@HOST but the holder's, sorted.
func others(rows []api.EntityRow, h api.EntityRow) []string {
	var out []string
	for _, r := range rows {
		if r.Gid != h.Gid {
			out = append(out, r.Name+"@"+r.Host)
		}
	}
	sort.Strings(out)
	return out
}

// conflictWarning is what a send by a bare name that more than one
// trusted host has is told: where it went, and why.
func conflictWarning(rows []api.EntityRow, h api.EntityRow) string {
	return fmt.Sprintf("%s is on more than one trusted host: sent to %s@%s, the first to join (the other: %s; name one as NAME@HOST)",
		h.Name, h.Name, h.Host, strings.Join(others(rows, h), ", "))
}

// Free refuses name for a new entity of this host if a trusted host has
// it (remote: the rows of that name this gateway heard of). away says
// why a host is not reachable now ("" if it is; nil: not asked).
func (n *nameBook) Free(name string, remote []api.EntityRow, away func(host string) string) error {
	if len(remote) == 0 {
		return nil
	}
	h := holder(remote)
	e := fault.New(fault.Usage, fault.KindNameTaken,
		"%s is already an entity of host %s (%s@%s): a name is one entity across the hosts this gateway trusts", name, h.Host, name, h.Host)
	if away != nil {
		if a := away(h.Host); a != "" {
			e = fault.New(fault.Usage, fault.KindNameTaken,
				"%s is already an entity of host %s (%s@%s), which keeps its name and inbox while away (%s): a name is one entity across the hosts this gateway trusts",
				name, h.Host, name, h.Host, a)
			return e.WithHint("choose another name; if host %s is retired for good, stop trusting it: fleet-gw trust remove %s (or, certified, revoke it: fleet-gw operator revoke)", h.Host, h.Host)
		}
	}
	return e.WithHint("choose another name; message that one as %s@%s", name, h.Host)
}

// Tell says, once, that name is on more than one trusted host (rows: every
// trusted entity of that name, this host's included), or that it no
// longer is. self is this host.
func (n *nameBook) Tell(self, name string, rows []api.EntityRow) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.tellLocked(self, name, rows)
}

// TellAll is Tell for every name of rows (a whole roster); a conflict
// told before whose name rows no longer have twice is over.
func (n *nameBook) TellAll(self string, rows []api.EntityRow) {
	byName := named(rows)
	n.mu.Lock()
	defer n.mu.Unlock()
	for name := range n.conflicts {
		if len(byName[name]) < 2 {
			n.tellLocked(self, name, nil)
		}
	}
	for name, rs := range byName {
		if len(rs) > 1 {
			n.tellLocked(self, name, rs)
		}
	}
}

// named groups rows of entities (not the rows of untrusted hosts) by name.
func named(rows []api.EntityRow) map[string][]api.EntityRow {
	out := map[string][]api.EntityRow{}
	for _, r := range rows {
		if r.Name != "" && r.Status != "untrusted" {
			out[r.Name] = append(out[r.Name], r)
		}
	}
	return out
}

// tellLocked is Tell; n.mu is held.
func (n *nameBook) tellLocked(self, name string, rows []api.EntityRow) {
	if len(rows) < 2 {
		if _, was := n.conflicts[name]; was {
			delete(n.conflicts, name)
			n.log.Info("name conflict over: the name is one entity again", "entity", name)
		}
		return
	}
	h := holder(rows)
	gids := []string{h.Gid}
	var mine []string // this host's entities of the name that are not the holder
	for _, r := range rows {
		if r.Gid == h.Gid {
			continue
		}
		gids = append(gids, r.Gid)
		if r.Host == self {
			mine = append(mine, r.Gid)
		}
	}
	slices.Sort(gids[1:])
	key := strings.Join(gids, " ")
	if n.conflicts[name] == key {
		return
	}
	if len(n.conflicts) >= maxSnapshotRows {
		return // as many as a host has entities: no more to tell
	}
	n.conflicts[name] = key
	attrs := []any{"entity", name, "holder", h.Name + "@" + h.Host, "holder_gid", h.Gid, "others", strings.Join(others(rows, h), ",")}
	if len(mine) > 0 {
		n.log.Error("name conflict: an entity of this host has a name that another trusted host's entity had first; a bare "+name+
			" means "+name+"@"+h.Host+" on every host, and this one is reached only as "+name+"@"+self+" or by gid",
			append(attrs, "gid", strings.Join(mine, ","), "fix", "fleet-roster leave "+name+" here, then join it under another name")...)
		return
	}
	n.log.Warn("name conflict: a name is on more than one trusted host; a bare "+name+" means the first to join, "+name+"@"+h.Host, attrs...)
}

// mark sets name_holder on every row of a name that more than one
// trusted host has (rows: a whole roster).
func mark(rows []api.EntityRow) {
	for name, rs := range named(rows) {
		if len(rs) < 2 {
			continue
		}
		h := holder(rs)
		for i := range rows {
			if rows[i].Name == name && rows[i].Status != "untrusted" {
				rows[i].NameHolder = name + "@" + h.Host
			}
		}
	}
}

// Heard notes what a presence message refused as not trusted says, as
// host (its header's claim; nothing of it is proven): the names it
// announces of its own entities. Only what holds to the grammar of a
// trusted host's presence is kept, within bounds.
func (n *nameBook) Heard(host string, env *envelope.Envelope) {
	if !trust.HostRE.MatchString(host) || env == nil || env.Sender.Host != host {
		return
	}
	var b struct {
		Host     string `json:"host"`
		Leaving  bool   `json:"leaving"`
		Snapshot *struct {
			Page int               `json:"page"`
			Rows []json.RawMessage `json:"rows"`
		} `json:"snapshot"`
		Change *struct {
			Row  json.RawMessage `json:"row"`
			Gone string          `json:"gone"`
		} `json:"change"`
	}
	if json.Unmarshal([]byte(env.Body), &b) != nil || b.Host != host {
		return
	}
	var rows []json.RawMessage
	switch {
	case b.Snapshot != nil:
		rows = b.Snapshot.Rows
	case b.Change != nil && b.Change.Row != nil:
		rows = []json.RawMessage{b.Change.Row}
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if b.Leaving {
		delete(n.rumours, host)
		return
	}
	r := n.rumours[host]
	if r == nil {
		for h, old := range n.rumours { // what is no longer heard makes room
			if now.Sub(old.heard) > n.ttl {
				delete(n.rumours, h)
			}
		}
		if len(n.rumours) >= maxRumourHosts {
			return
		}
		r = &rumour{names: map[string]string{}}
		n.rumours[host] = r
	}
	r.heard = now
	if b.Snapshot != nil && b.Snapshot.Page == 0 {
		clear(r.names) // a snapshot is the host's whole word
	}
	if b.Change != nil && b.Change.Gone != "" {
		delete(r.names, b.Change.Gone)
	}
	for _, raw := range rows {
		var e struct {
			Name string `json:"name"`
			Gid  string `json:"gid"`
		}
		if json.Unmarshal(raw, &e) != nil || !nameRE.MatchString(e.Name) || ident.GidHost(e.Gid) != host {
			continue
		}
		if _, ok := r.names[e.Gid]; !ok && len(r.names) >= maxRumourNames {
			continue
		}
		r.names[e.Gid] = e.Name
	}
}

// Rumoured returns the hosts, sorted, that trusted says are not trusted
// and that announced name (on host, if given) within the TTL.
func (n *nameBook) Rumoured(name, host string, trusted func(host string) bool) []string {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for h, r := range n.rumours {
		if (host != "" && h != host) || now.Sub(r.heard) > n.ttl || trusted(h) {
			continue
		}
		for _, nm := range r.names {
			if nm == name {
				out = append(out, h)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// untrustedName is the 67 for a name no trusted host has: to (NAME, or
// NAME@HOST with host set) that hosts this gateway does not trust
// announce, or that names a host it does not trust.
func untrustedName(to, name, host string, hosts []string) error {
	var e *fault.Error
	switch {
	case host != "" && len(hosts) > 0:
		e = fault.New(fault.NoRecipient, fault.KindUntrustedHost,
			"no recipient %s: host %s is not trusted by this gateway; it announces %s, but its word is unproven and nothing is sent there", to, host, name)
	case host != "":
		e = fault.New(fault.NoRecipient, fault.KindUntrustedHost,
			"no recipient %s: host %s is not trusted by this gateway, and nothing is sent there", to, host)
	default:
		which := "host " + hosts[0] + ", which this gateway does not trust, announces"
		if len(hosts) > 1 {
			which = "hosts " + strings.Join(hosts, ", ") + ", which this gateway does not trust, announce"
		}
		e = fault.New(fault.NoRecipient, fault.KindUntrustedHost,
			"no recipient %s on the hosts this gateway trusts: %s %s, unproven; nothing is sent there", to, which, name)
		host = hosts[0]
	}
	return e.WithHint("if %s is one of yours: on %s run `fleet-gw key`, then here: fleet-gw trust add %s KEY", host, host, host)
}
