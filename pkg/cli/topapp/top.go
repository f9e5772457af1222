// Package topapp is fleet-top's command definition: the fleet on one
// screen — hosts, entities, the live message flow and dead letters — or,
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

// refreshEvery is how often the rows are read again with no event.
const refreshEvery = 2 * time.Second

// NewTopApp is fleet-top.
func NewTopApp() *ucli.App {
	app := fleetcli.NewApp("fleet-top", "the fleet on one screen: hosts, entities, the live message flow, dead letters")
	app.UsageText = "fleet-top [options] [--as NAME] [--once]"
	app.Description = "On a terminal, a full-screen view that redraws as the gateway's watch stream says what " +
		"happens: the hosts (this one and its peers: live, stale, gone, untrusted), the entities of every host " +
		"(state in colour: idle green, busy yellow, stuck, detached or unhooked red, stale or gone grey; pending, " +
		"dead, last delivery), the message flow (each event's time, event, kind, sender → recipient, size and " +
		"short msg id, never a message's text) and this host's dead letters. Rows are read again when an entity " +
		"joins, leaves or changes state, when a peer changes state, and every 2 seconds. " +
		"Keys: q or Ctrl-C quit; ? shows the keys; Tab moves to the next pane; up and down move in it; / filters " +
		"the rows and events by a substring (Esc clears it); Enter on an event or a dead letter shows its trace " +
		"(as fleet-trace); r on a dead letter replays it, after a y/n confirm (as fleet-dlq replay MSG_ID); " +
		"s sends a message as the --as entity (a prompt for NAME, then TEXT). " +
		"With --once, or when stdout is not a terminal, it prints one snapshot as tables (HOSTS, ENTITIES, " +
		"DEAD LETTERS) and exits 0. Open asks are not shown: the gateway's API does not list them. " +
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
