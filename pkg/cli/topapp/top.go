// Package topapp is fleet-top's command definition: the fleet on one
// screen — hosts, entities, the live message flow, open asks, dead
// letters and, as an entity, its inbox — or,
// with --once or when stdout is not a terminal, one snapshot as tables.
//
// The live view is built on Bubble Tea v2 (charm.land/bubbletea/v2
// v2.1.1) with Lip Gloss v2 and Bubbles v2 (v2.1.1 both), not on tview
// (v0.42.0) nor on Bubble Tea's v1 line. Bubble Tea is an Elm-style loop:
// one model, one Update that takes every input (a key, a window size, a
// watch event, the answer of a call to the gateway) as a message, and one
// View that returns the whole screen as a string, so the screen is a pure
// function of the model and its formatting can be tested without a
// terminal. tview owns its widgets' state and redraws them from its own
// goroutine, which fits forms better than a view fed by a stream. v2 is
// the maintained line (v1 gets fixes only); its renderer writes only the
// cells that changed, reads the terminal's size on every resize, and
// downsamples colour to what the terminal says it has. The package lives
// apart from pkg/cli, as fleet-roster's does, so the short commands do
// not link any of it.
package topapp

import (
	"fmt"
	"os"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	ucli "github.com/urfave/cli/v2"
)

// NewTopApp is fleet-top.
func NewTopApp() *ucli.App {
	app := fleetcli.NewApp("fleet-top", "the fleet on one screen: hosts, entities, the live message flow, open asks, dead letters")
	app.UsageText = "fleet-top [options] [--as NAME] [--once]"
	app.Description = "On a terminal, a full-screen view that redraws as the gateway's watch stream says what " +
		"happens: the hosts (this one and its peers: live, stale, gone, untrusted), the entities of every host " +
		"(state in colour: idle green, busy yellow, stuck, detached or unhooked red, stale or gone grey; for how long " +
		"(another host's row says so for idle and busy, from its presence); pending, dead, last delivery), the message " +
		"flow (each event's time, event, kind, sender → recipient, size and short msg id, never a message's text), " +
		"this host's open asks (asker → askee, size, when opened, time left), this host's dead letters and, with " +
		"--as NAME, that entity's INBOX: the text of the mail that reaches its own inbox while fleet-top runs " +
		"(it reads, never drains: fleet-recv still gets it). Rows are read again when an entity joins, leaves or " +
		"changes state, when a peer changes state, on every event of an ask or its answer (at most once a second), and every 10 seconds. " +
		"Keys: q or Ctrl-C quit; ? shows the keys; Tab moves to the next pane (Shift-Tab back); up and down move in " +
		"it; / filters the rows and events by a substring, with host:HOST and group:GROUP terms beside it (Esc " +
		"clears it); h and g filter by the next host or group in turn, then by none; Enter on an event, an ask or a " +
		"dead letter shows its trace (as fleet-trace); r on a dead letter replays it, after a y/n confirm (as " +
		"fleet-dlq replay MSG_ID); a on an open ask put to the --as entity answers it (as fleet-send --answer " +
		"ASK_ID); s sends a message as the --as entity (a prompt for NAME, then TEXT), or in INBOX replies to the " +
		"selected message (as fleet-send --reply-to MSG_ID). " +
		"With --once, or when stdout is not a terminal, it prints one snapshot as tables (HOSTS, ENTITIES, " +
		"OPEN ASKS, DEAD LETTERS) and exits 0; OPEN ASKS is left out against a gateway too old to list them. " +
		"Every text that came from elsewhere (names, reasons, bodies) is printed inert: no control character or " +
		"escape sequence of it reaches the terminal. " +
		"NO_COLOR set to anything but the empty string turns colour off. It works in 80x24 and follows resizes: " +
		"every line is cut to the width, never wrapped."
	app.Flags = append(fleetcli.ConnFlags(), fleetcli.AsFlag(),
		&ucli.BoolFlag{Name: "once", Usage: "print one snapshot as tables and exit (also when stdout is not a terminal)"},
	)
	app.Action = run
	return app
}

func run(c *ucli.Context) error {
	if c.NArg() > 0 {
		return fleetcli.Usage("fleet-top takes no arguments, got %q", c.Args().First()).WithHint("see: fleet-top --help")
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	src := &source{c: c, client: s.Client, as: lineageString(c, "as")}
	defer src.close()
	if c.Bool("once") || !fleetcli.IsTerminal(os.Stdout) {
		snap, err := src.snapshot()
		if err != nil {
			return err
		}
		return printSnapshot(c.App.Writer, snap, time.Now())
	}
	return live(c, src)
}

func lineageString(c *ucli.Context, name string) string {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet(name) {
			return ctx.String(name)
		}
	}
	return ""
}

// noColor is NO_COLOR's rule (no-color.org): set to anything non-empty,
// no colour.
func noColor() bool { return os.Getenv("NO_COLOR") != "" }

// snapshot is what one read of the gateway shows.
type snapshot struct {
	Status *api.GatewayStatus
	Rows   []api.EntityRow
	Dead   []api.DeadLetter
	// Asks: this host's open asks; HasAsks: the gateway lists them (an
	// older one does not)
	Asks    []api.OpenAsk
	HasAsks bool
	Read    time.Time
}

// names maps the gids of the snapshot's rows to NAME@HOST.
func (s *snapshot) names() map[string]string {
	m := make(map[string]string, len(s.Rows))
	for _, r := range s.Rows {
		if r.Gid != "" && r.Name != "" {
			m[r.Gid] = r.Name + "@" + r.Host
		}
	}
	return m
}

// hostRow is one line of the hosts pane and table.
type hostRow struct {
	Host, State, Trusted, Heard string
}

// hostRows are this host (first, its broker's state) and its peers.
func hostRows(st *api.GatewayStatus, now time.Time) []hostRow {
	if st == nil {
		return nil
	}
	out := []hostRow{{Host: st.Host, State: "this host", Trusted: "-",
		Heard: fmt.Sprintf("broker %s · %d entities · %d pending · %d dead", st.Broker.State, st.Entities, st.Pending, st.Dead)}}
	for _, p := range st.Peers {
		trusted := "no"
		if p.Trusted {
			trusted = "yes"
		}
		heard := "never"
		if !p.LastHeard.IsZero() {
			heard = ago(now.Sub(p.LastHeard)) + " ago"
		}
		out = append(out, hostRow{Host: p.Host, State: p.State, Trusted: trusted, Heard: heard})
	}
	return out
}

// nameAt is a row's NAME@HOST ("-@HOST" for a host row with no entity).
func nameAt(r api.EntityRow) string {
	name := r.Name
	if name == "" {
		name = "-"
	}
	return name + "@" + r.Host
}

// shortID is the last 8 characters of a msg id: a UUIDv7's first
// digits are its time, the same for messages of one second, its last
// are random.
func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}
