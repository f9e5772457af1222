// Package rosterapp is fleet-roster's command definition. It lives apart
// from pkg/cli because it renders tables (pkg/cli/table): tablewriter and
// its width tables are initialised at every start of a binary that links
// them, and fleet-send should not pay for fleet-roster's tables.
package rosterapp

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/table"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	ucli "github.com/urfave/cli/v2"
)

// NewRosterApp is fleet-roster.
func NewRosterApp() *ucli.App {
	app := fleetcli.NewApp("fleet-roster", "list, register and remove this host's entities; set the caller's status")
	app.UsageText = "fleet-roster [options] [list]\n" +
		"fleet-roster join NAME --mode pull|inject|hook [--tmux-target T [--program P] [--turns hooks|none] [--paste auto|line|bracketed] [--header before|after|off] | --exec CMD] [--nudge CMD] [--group G ...] [--accept PATTERN ...]\n" +
		"fleet-roster leave NAME\n" +
		"fleet-roster accept NAME add|remove PATTERN... | reset | list\n" +
		"fleet-roster status busy|idle [--pane]\n" +
		"fleet-roster group NAME [--add G ...] [--remove G ...]\n" +
		"fleet-roster dead [NAME]\n" +
		"fleet-roster whoami\n" +
		"fleet-roster hooks install|status|remove|doctor claude|codex|gemini|opencode|copilot [--project DIR]\n" +
		"fleet-roster hooks install claude|codex|gemini|opencode|copilot --mcp NAME [--force] [--approve TOOLS] [--project DIR]\n" +
		"fleet-roster hooks remove claude|codex|gemini|opencode|copilot --mcp [--project DIR]"
	app.Flags = append(fleetcli.ConnFlags(), append(listFlags(), fleetcli.JSONFlag())...)
	list := &ucli.Command{
		Name:   "list",
		Usage:  "list entities on every host: name, host, gid, mode, groups, status, pending, dead, last seen",
		Flags:  append(listFlags(), fleetcli.JSONFlag()),
		Action: runList,
	}
	app.Action = runList
	app.Commands = []*ucli.Command{
		list,
		{
			Name:      "join",
			Usage:     "register an entity on this host and issue its credential (shown once)",
			ArgsUsage: "NAME",
			Description: "Prints the credential on stdout (export it as FLEET_TOKEN in the entity's environment) " +
				"and saves it owner-only in the state folder, where --as NAME finds it. " +
				"A name is one entity across the hosts this gateway trusts: one another trusted host has is refused " +
				"(exit 64, naming NAME@HOST; fleet-broker(7), ONE NAME, ONE ENTITY).",
			Flags: []ucli.Flag{
				fleetcli.JSONFlag(),
				required(fleetcli.Choice("mode", "pull (held for fleet-recv), inject (delivered into a pane or command) or hook (held for the agent CLI's own hooks: fleet-recv --hook)", "", "pull", "inject", "hook")),
				&ucli.StringFlag{Name: "tmux-target", Usage: "inject: paste messages into this tmux pane; hook: the agent's pane, where an idle agent with mail waiting gets a wake notice (a count, never a message)"},
				&ucli.StringFlag{Name: "exec", Usage: "inject: run this command with the message JSON on stdin; exit 0 means delivered"},
				&ucli.StringFlag{Name: "nudge", Usage: "pull: run this command, with backoff, while unread messages wait and no fleet-recv reads them (env FLEET_ENTITY, FLEET_PENDING, FLEET_NUDGE, FLEET_STATUS, FLEET_STATUS_REASON)"},
				&ucli.StringSliceFlag{Name: "group", Usage: "member of group G, named as an entity is; not all, which everyone is in (repeat for more)"},
				&ucli.StringSliceFlag{Name: "accept", Usage: "take messages only from `PATTERN`: NAME, NAME@HOST, @HOST, group:G or *, optionally /KIND,... (SEND, ASK, BROADCAST, STOP); repeat for more (default: the host's accept-default)"},
				&ucli.StringFlag{Name: "program", Usage: "tmux: the program a paste needs in the pane's foreground (default: what runs there now, or, a shell, what runs at the agent's first hook)"},
				fleetcli.Choice("turns", "tmux: hooks (busy and idle from the agent's turn hooks; starting until the first) or none (a program without turns)", "hooks", "hooks", "none"),
				fleetcli.Choice("paste", "tmux: auto (lines when tmux says the program enabled bracketed paste), line (one line, newlines shown as ␊) or bracketed (lines, for Claude Code, Codex, Gemini CLI, IPython)", "auto", "auto", "line", "bracketed"),
				fleetcli.Choice("header", "tmux: the sender's header line before the body, after it, or off", "before", "before", "after", "off"),
				&ucli.DurationFlag{Name: "idle-screen", Usage: "tmux: a stuck agent whose screen stands still this long reads idle (0: never)"},
				&ucli.StringFlag{Name: "interrupt-on-urgent", Usage: "tmux inject: when urgent mail waits while the agent is in a turn, press agent CLI `CLI`'s own interrupt, then paste it as the next prompt; only for a CLI whose interrupt is measured safe: codex (fleet(7), URGENT MAIL)"},
			},
			Action: runJoin,
		},
		{
			Name:      "leave",
			Usage:     "remove an entity; what waits in its inbox is dead-lettered",
			ArgsUsage: "NAME",
			Flags:     []ucli.Flag{fleetcli.JSONFlag()},
			Action:    runLeave,
		},
		{
			Name:      "status",
			Usage:     "mark the caller busy (inject waits) or idle: an agent's turn hook",
			ArgsUsage: "busy|idle",
			Description: "An entity's status, as fleet-roster lists it: idle (pasted into, one message at a time), busy (a turn runs: " +
				"from the gateway's paste, then the agent's hooks), waiting (idle, on an ask of its own); and for a tmux entity, " +
				"the gateway's safety net: starting (joined, or its program came back: nothing is pasted until the agent's first hook), " +
				"stuck (busy for stuck-after with no hook; with --idle-screen, idle is read from a still screen), " +
				"unhooked (starting for start-bound with no hook: its hooks are missing or not trusted), " +
				"detached (the pane does not run the entity's program: nothing is typed, mail is held; for a pull entity, " +
				"nobody reads it: its fleet-recv --follow ended, none came back within 10s of the gateway's start, or the " +
				"process fleet-spawn started for it is gone — mail is held and its nudge fires, until a fleet-recv reads it). " +
				"--json gives the reason as status_reason. Remote rows also read stale, unknown, gone or untrusted.",
			Flags: []ucli.Flag{fleetcli.JSONFlag(), fleetcli.AsFlag(),
				&ucli.BoolFlag{Name: "pane", Usage: "the caller is the agent in an inject entity's tmux pane, found by its process (no credential; what fleet-turn uses inside tmux)"}},
			Action: runSetStatus,
		},
		{
			Name:   "whoami",
			Usage:  "the caller's own row (name, gid, host, mode, status, pending): no side effect",
			Flags:  []ucli.Flag{fleetcli.JSONFlag(), fleetcli.AsFlag()},
			Action: runWhoami,
		},
		{
			Name:      "group",
			Usage:     "add an entity to groups or remove it; its inbox is rebound at once",
			ArgsUsage: "NAME",
			Description: "A group is named as an entity is (a letter, then up to 63 letters, digits, '-' or '_'): " +
				"the name becomes the routing key broadcast.G. Any other name, or all (everyone is in it), exits 64 and changes nothing.",
			Flags: []ucli.Flag{
				fleetcli.JSONFlag(),
				&ucli.StringSliceFlag{Name: "add", Usage: "join group G, named as an entity is; not all (repeat for more)"},
				&ucli.StringSliceFlag{Name: "remove", Usage: "leave group G (repeat for more)"},
			},
			Action: runGroup,
		},
		acceptCommand(),
		hooksCommand(),
		{
			Name:      "dead",
			Usage:     "list dead letters, with the reason each died",
			ArgsUsage: "[NAME]",
			Flags:     []ucli.Flag{fleetcli.JSONFlag()},
			Action:    runDead,
		},
		completeCommand(),
	}
	for _, cmd := range app.Commands {
		// every subcommand takes the connection flags too, wherever they
		// are written, and reports usage errors the house way
		cmd.Flags = append(cmd.Flags, fleetcli.ConnFlags()...)
		cmd.HideHelpCommand = true
		cmd.OnUsageError = app.OnUsageError
	}
	return app
}

// required makes f a required flag.
func required(f *fleetcli.ChoiceFlag) *fleetcli.ChoiceFlag {
	f.Required = true
	return f
}

func listFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "host", Usage: "only entities on host H"},
		&ucli.StringFlag{Name: "group", Usage: "only members of group G"},
		&ucli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "stream changes (JSON Lines: entity rows, gone rows, and the gateway's events, never a message's text) or redraw the table (terminal)"},
		&ucli.BoolFlag{Name: "text", Usage: "with --watch: the events of messages stored in your own inbox carry their text (body); takes your credential (FLEET_TOKEN or --as)"},
		fleetcli.AsFlag(),
	}
}

func lineageString(c *ucli.Context, name string) string {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet(name) {
			return ctx.String(name)
		}
	}
	return ""
}

func lineageBool(c *ucli.Context, name string) bool {
	for _, ctx := range c.Lineage() {
		if ctx.Bool(name) {
			return true
		}
	}
	return false
}

func jsonOut(c *ucli.Context) bool {
	for _, ctx := range c.Lineage() {
		if ctx.Bool("json") {
			return true
		}
	}
	return !fleetcli.IsTerminal(os.Stdout)
}

func oneArg(c *ucli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", fleetcli.Usage("want exactly one %s, got %d arguments", what, c.NArg())
	}
	return c.Args().First(), nil
}

func runList(c *ucli.Context) error {
	if c.NArg() > 0 {
		return fleetcli.UnknownCommand(c.App, c.Args().First())
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	host, group := lineageString(c, "host"), lineageString(c, "group")
	fetch := func() ([]api.EntityRow, error) {
		resp, err := s.Client.Call(&api.RosterRequest{})
		if err != nil {
			return nil, err
		}
		rows := resp.Entities[:0]
		for _, r := range resp.Entities {
			if (host == "" || r.Host == host) && (group == "" || slices.Contains(r.Groups, group)) {
				rows = append(rows, r)
			}
		}
		return rows, nil
	}
	rows, err := fetch()
	if err != nil {
		return err
	}
	if !lineageBool(c, "watch") {
		if lineageBool(c, "text") {
			return fleetcli.Usage("--text is for --watch: the text of your own inbox's mail as it comes")
		}
		return printRoster(c, rows)
	}
	var stream *eventStream
	if s.Client.Hello.Has(api.FeatureWatch) { // an older gateway: the rows alone
		if stream, err = openEvents(c); err != nil {
			return err
		}
		defer stream.close()
	}
	return watchRoster(c, rows, fetch, stream)
}

func printRoster(c *ucli.Context, rows []api.EntityRow) error {
	for _, r := range rows {
		if r.Status == "untrusted" { // a host heard but not in the trust file
			fmt.Fprintf(c.App.ErrWriter, "fleet-roster: hint: host %s is not trusted here: on %s run `fleet-gw key`, then here: fleet-gw trust add %s KEY (or certify it: man 7 fleet-security)\n",
				r.Host, r.Host, r.Host)
		}
	}
	conflictHints(c, rows)
	if jsonOut(c) {
		for _, r := range rows {
			if err := fleetcli.PrintJSON(c.App.Writer, r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.App.ErrWriter, "fleet-roster: no entities; register one with: fleet-roster join NAME --mode pull")
		return nil
	}
	return table.Render(c.App.Writer, []string{"NAME", "HOST", "GID", "MODE", "GROUPS", "STATUS", "PENDING", "DEAD", "LAST SEEN"}, tableRows(rows))
}

// conflictHints says, once per name, that a name is on more than one
// trusted host (joined at once, or before the hosts trusted each other):
// which one a bare name means, and how to reach or rename the others.
func conflictHints(c *ucli.Context, rows []api.EntityRow) {
	others := map[string][]string{} // name -> its rows' NAME@HOST but the holder's
	holders := map[string]string{}
	for _, r := range rows {
		if r.NameHolder == "" {
			continue
		}
		holders[r.Name] = r.NameHolder
		if at := r.Name + "@" + r.Host; at != r.NameHolder {
			others[r.Name] = append(others[r.Name], at)
		}
	}
	names := make([]string, 0, len(holders))
	for n := range holders {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		slices.Sort(others[n])
		if len(others[n]) == 0 { // the others are filtered out
			fmt.Fprintf(c.App.ErrWriter, "fleet-roster: hint: %s is on more than one trusted host: a bare %s means %s, the first to join\n", n, n, holders[n])
			continue
		}
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: hint: %s is on more than one trusted host: a bare %s means %s, the first to join; "+
			"reach %s as NAME@HOST, or leave it there and join it under another name\n",
			n, n, holders[n], strings.Join(others[n], ", "))
	}
}

func tableRows(rows []api.EntityRow) [][]string {
	out := make([][]string, 0, len(rows))
	for _, r := range rows {
		seen := r.LastSeen
		if seen.IsZero() {
			seen = r.LastDelivery
		}
		last := "-"
		if !seen.IsZero() {
			last = seen.Local().Format(time.DateTime)
		}
		groups := strings.Join(r.Groups, ",")
		if groups == "" {
			groups = "-"
		}
		name := r.Name
		if name == "" {
			name = "-" // a host row (untrusted): no entity of it is believed
		}
		out = append(out, []string{name, r.Host, r.Gid, r.Mode, groups, r.Status,
			strconv.Itoa(r.Pending), strconv.Itoa(r.Dead), last})
	}
	return out
}

// fullEvery is how often the roster is read with no row event, rowPoll
// how often without a watch stream. A read of the whole
// roster costs the gateway about 6 ms per 1,000 rows (scripts/BENCHMARKS.md,
// bench-top): read twice a second it was half the gateway's CPU again.
const (
	rowPoll   = 500 * time.Millisecond
	fullEvery = 5 * time.Second
)

// watchRoster reads the view when the stream says rows changed, and
// every fullEvery, and prints what changed: JSON Lines of
// {"type":"entity",...} and {"type":"gone",...}, or a redrawn table on a
// terminal. It runs until interrupted.
func watchRoster(c *ucli.Context, rows []api.EntityRow, fetch func() ([]api.EntityRow, error), stream *eventStream) error {
	asJSON := jsonOut(c)
	type key struct{ host, gid string }
	seen := map[key]string{}
	emit := func(rows []api.EntityRow) error {
		if !asJSON {
			fmt.Fprint(c.App.Writer, "\033[H\033[2J")
			return table.Render(c.App.Writer, []string{"NAME", "HOST", "GID", "MODE", "GROUPS", "STATUS", "PENDING", "DEAD", "LAST SEEN"}, tableRows(rows))
		}
		now := map[key]bool{}
		for _, r := range rows {
			k := key{r.Host, r.Gid}
			now[k] = true
			// last_seen moves with every heartbeat: a change is anything else
			cmp := r
			cmp.LastSeen = time.Time{}
			data, _ := json.Marshal(cmp)
			if seen[k] == string(data) {
				continue
			}
			seen[k] = string(data)
			if err := fleetcli.PrintJSON(c.App.Writer, struct {
				Type string `json:"type"`
				api.EntityRow
			}{"entity", r}); err != nil {
				return err
			}
		}
		for k := range seen {
			if !now[k] {
				delete(seen, k)
				if err := fleetcli.PrintJSON(c.App.Writer, struct {
					Type string `json:"type"`
					Host string `json:"host"`
					Gid  string `json:"gid"`
				}{"gone", k.host, k.gid}); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := emit(rows); err != nil {
		return err
	}
	// the whole roster is read again after a row event (a burst of them
	// already queued is one read), and every fullEvery for what changes
	// without a row event (pending, dead, other hosts' rows); without a
	// stream (an older gateway), every rowPoll
	every := fullEvery
	if stream == nil {
		every = rowPoll
	}
	t := time.NewTicker(every)
	defer t.Stop()
	printEvent := func(ev api.WatchEvent) error {
		if !asJSON {
			return nil
		}
		return fleetcli.PrintJSON(c.App.Writer, struct {
			Type string `json:"type"`
			api.WatchEvent
		}{"event", ev})
	}
	for {
		select {
		case <-c.Context.Done():
			return nil
		case <-t.C:
		case ev, ok := <-stream.events():
			if !ok {
				return stream.err
			}
			if err := printEvent(ev); err != nil {
				return err
			}
			if !rowEvent[ev.Event] {
				continue
			}
			// the events already here first: one read for all of them
			for more := true; more; {
				select {
				case ev, ok := <-stream.events():
					if !ok {
						return stream.err
					}
					if err := printEvent(ev); err != nil {
						return err
					}
				default:
					more = false
				}
			}
		}
		rows, err := fetch()
		if err != nil {
			return err
		}
		if err := emit(rows); err != nil {
			return err
		}
	}
}

func runJoin(c *ucli.Context) error {
	name, err := oneArg(c, "NAME")
	if err != nil {
		return err
	}
	// each group becomes a routing key (ident.ValidGroup): checked before
	// the gateway is asked, as the gateway checks it again
	if err := ident.CheckMember(c.StringSlice("group")); err != nil {
		return err
	}
	if _, err := accept.ParseAll(c.StringSlice("accept")); err != nil {
		return fleetcli.Usage("%v", err)
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	if c.IsSet("interrupt-on-urgent") && !s.Client.Hello.Has(api.FeatureUrgent) {
		// an earlier gateway would join it without, silently
		return fault.New(fault.Data, fault.KindProtocol, "--interrupt-on-urgent: the gateway (fleet-gw %s) does not know it", s.Client.Hello.Version).
			WithHint("restart fleet-gw with the release of these commands, or leave --interrupt-on-urgent out")
	}
	resp, err := s.Client.Call(&api.JoinRequest{Name: name, Mode: c.String("mode"), TmuxTarget: c.String("tmux-target"),
		Exec: c.String("exec"), Nudge: c.String("nudge"), Groups: c.StringSlice("group"), Accept: c.StringSlice("accept"),
		Program: c.String("program"), IdleScreenMS: c.Duration("idle-screen").Milliseconds(),
		Turns: tmuxOnly(c, "turns"), Paste: tmuxOnly(c, "paste"), Header: tmuxOnly(c, "header"),
		InterruptOnUrgent: c.String("interrupt-on-urgent"),
	})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"entity": resp.Entity, "token": resp.Token, "credential_file": resp.CredFile})
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: registered %s (gid %s); credential saved to %s — shown once, below\n",
		resp.Entity.Name, resp.Entity.Gid, resp.CredFile)
	_, err = fmt.Fprintln(c.App.Writer, resp.Token)
	return err
}

func runLeave(c *ucli.Context) error {
	name, err := oneArg(c, "NAME")
	if err != nil {
		return err
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.LeaveRequest{Name: name})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"name": name, "dead_lettered": resp.Count})
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s left; %d waiting message(s) dead-lettered\n", name, resp.Count)
	return nil
}

func runGroup(c *ucli.Context) error {
	name, err := oneArg(c, "NAME")
	if err != nil {
		return err
	}
	if len(c.StringSlice("add")) == 0 && len(c.StringSlice("remove")) == 0 {
		return fleetcli.Usage("nothing to do: give --add G or --remove G")
	}
	if err := ident.CheckMember(c.StringSlice("add")); err != nil {
		return err
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.GroupsRequest{Name: name, Add: c.StringSlice("add"), Remove: c.StringSlice("remove")})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, resp.Entity)
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s is in groups: %s\n", name, strings.Join(resp.Entity.Groups, ", "))
	return nil
}

// tmuxOnly is a tmux setting's value if it was given or the entity has a
// pane (its default then), else "".
func tmuxOnly(c *ucli.Context, name string) string {
	if c.IsSet(name) || c.String("tmux-target") != "" {
		return c.String(name)
	}
	return ""
}

func runSetStatus(c *ucli.Context) error {
	st, err := oneArg(c, "status (busy or idle)")
	if err != nil {
		return err
	}
	if st != "busy" && st != "idle" {
		return fleetcli.Usage("status must be busy or idle, not %q", st)
	}
	if c.Bool("pane") && c.String("as") != "" {
		return fleetcli.Usage("--pane and --as both say who the caller is: give one")
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.StatusRequest{Status: st, Pane: c.Bool("pane")})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, resp.Entity)
	}
	return nil
}

func runWhoami(c *ucli.Context) error {
	if c.NArg() > 0 {
		return fleetcli.Usage("fleet-roster whoami takes no arguments, got %q", c.Args().First())
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.WhoamiRequest{})
	if err != nil {
		return err
	}
	e := resp.Entity
	if e == nil {
		return fault.New(fault.Software, fault.KindProtocol, "the gateway sent no entity")
	}
	if jsonOut(c) {
		return fleetcli.PrintJSON(c.App.Writer, e)
	}
	fmt.Fprintf(c.App.Writer, "%s@%s %s %s %s\n", e.Name, e.Host, e.Gid, e.Mode, e.Status)
	return nil
}

func runDead(c *ucli.Context) error {
	if c.NArg() > 1 {
		return fleetcli.Usage("want at most one NAME")
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.DeadRequest{Name: c.Args().First()})
	if err != nil {
		return err
	}
	if jsonOut(c) {
		for _, d := range resp.Dead {
			// the record's recipient as an entity {gid,name,host}
			out := struct {
				Record   any `json:"record"`
				Envelope any `json:"envelope,omitempty"`
			}{Record: fleetcli.RecordOut(&d.Record)}
			if d.Envelope != nil {
				out.Envelope = d.Envelope
			}
			if err := fleetcli.PrintJSON(c.App.Writer, out); err != nil {
				return err
			}
		}
		return nil
	}
	if len(resp.Dead) == 0 {
		fmt.Fprintln(c.App.ErrWriter, "fleet-roster: no dead letters")
		return nil
	}
	rows := make([][]string, 0, len(resp.Dead))
	for _, d := range resp.Dead {
		rows = append(rows, []string{d.Record.MsgID, d.Record.Recipient, strconv.Itoa(d.Record.Attempts),
			d.Record.Done.Local().Format(time.DateTime), d.Record.Reason})
	}
	return table.Render(c.App.Writer, []string{"MSG ID", "RECIPIENT", "ATTEMPTS", "DIED", "REASON"}, rows)
}
