package rosterapp

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/hooks"
	ucli "github.com/urfave/cli/v2"
)

// hooksCommand is fleet-roster hooks: the agent CLIs' turn-hook recipes
// (scripts/hooks) merged into their own settings, and what still blocks
// them (pkg/hooks).
func hooksCommand() *ucli.Command {
	project := &ucli.StringFlag{Name: "project", Usage: "the project folder's settings (DIR/.claude, .codex, .gemini) instead of the user's"}
	return &ucli.Command{
		Name:  "hooks",
		Usage: "install the turn hooks (busy and idle) into Claude Code, Codex CLI or Gemini CLI; status, remove, doctor",
		Subcommands: []*ucli.Command{
			{
				Name:      "install",
				Usage:     "merge fleet-turn's hooks into the CLI's settings (twice changes nothing; the user's own settings stay)",
				ArgsUsage: "claude|codex|gemini",
				Flags: []ucli.Flag{fleetcli.JSONFlag(), project,
					&ucli.BoolFlag{Name: "trust", Usage: "codex: record the hooks as trusted in its config.toml, as its /hooks review does"}},
				Action: runHooksInstall,
			},
			{
				Name:      "status",
				Usage:     "which of the recipe's hooks are installed (an event only with every command of the recipe's), and what keeps them from running",
				ArgsUsage: "[claude|codex|gemini]",
				Flags:     []ucli.Flag{fleetcli.JSONFlag(), project},
				Action:    runHooksStatus,
			},
			{
				Name:      "remove",
				Usage:     "take fleet-turn's hooks out of the CLI's settings (nothing else)",
				ArgsUsage: "claude|codex|gemini",
				Flags:     []ucli.Flag{fleetcli.JSONFlag(), project},
				Action:    runHooksRemove,
			},
			{
				Name:      "doctor",
				Usage:     "status, the gateway, the pane's entity, and with --watch the live loop: busy then idle through the agent's real hooks",
				ArgsUsage: "claude|codex|gemini",
				Flags: append([]ucli.Flag{fleetcli.JSONFlag(), project,
					&ucli.StringFlag{Name: "entity", Usage: "the inject entity whose agent runs the hooks (default: the one joined on $TMUX_PANE)"},
					&ucli.DurationFlag{Name: "watch", Usage: "wait this long for the entity to go busy then idle (submit a prompt in the agent, or send it a message)"},
				}, fleetcli.ConnFlags()...),
				Action: runHooksDoctor,
			},
		},
	}
}

func cliArg(c *ucli.Context, optional bool) ([]*hooks.CLI, error) {
	switch {
	case c.NArg() == 0 && optional:
		return hooks.CLIs, nil
	case c.NArg() != 1:
		return nil, fleetcli.Usage("name one agent CLI: claude, codex or gemini")
	}
	cl, err := hooks.Find(c.Args().First())
	if err != nil {
		return nil, fleetcli.Usage("%v", err)
	}
	return []*hooks.CLI{cl}, nil
}

// hooksArgs are a hooks subcommand's CLI(s), the home folder and the
// --project folder ("" for the user's settings).
func hooksArgs(c *ucli.Context, optional bool) (cls []*hooks.CLI, home, project string, err error) {
	if cls, err = cliArg(c, optional); err != nil {
		return nil, "", "", err
	}
	if home, err = homeDir(); err != nil {
		return nil, "", "", err
	}
	if project, err = projectDir(c); err != nil {
		return nil, "", "", err
	}
	return cls, home, project, nil
}

func homeDir() (string, error) {
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "no home folder")
	}
	return h, nil
}

func projectDir(c *ucli.Context) (string, error) {
	p := c.String("project")
	if p == "" {
		return "", nil
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fleetcli.Usage("--project %s: %v", p, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return "", fleetcli.Usage("--project %s is not a folder", p)
	}
	return abs, nil
}

func runHooksInstall(c *ucli.Context) error {
	cls, home, project, err := hooksArgs(c, false)
	if err != nil {
		return err
	}
	cl := cls[0]
	if c.Bool("trust") && cl.Name != "codex" {
		return fleetcli.Usage("--trust is for codex (the other CLIs need no hook trust)")
	}
	path, err := cl.Install(home, project)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot install the %s hooks into %s", cl.Name, path)
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: fleet-turn's hooks are in %s\n", path)
	if c.Bool("trust") {
		if err := hooks.CodexTrust(home, path); err != nil {
			return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the hooks' trust in Codex's config.toml")
		}
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: Codex's config.toml trusts them\n")
	}
	return printStatus(c, cl, home, project)
}

func runHooksRemove(c *ucli.Context) error {
	cls, home, project, err := hooksArgs(c, false)
	if err != nil {
		return err
	}
	path, n, err := cls[0].Remove(home, project)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot remove the %s hooks from %s", cls[0].Name, path)
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"cli": cls[0].Name, "file": path, "removed": n})
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %d hook group(s) of fleet-turn removed from %s\n", n, path)
	return nil
}

func runHooksStatus(c *ucli.Context) error {
	cls, home, project, err := hooksArgs(c, true)
	if err != nil {
		return err
	}
	for _, cl := range cls {
		if err := printStatus(c, cl, home, project); err != nil {
			return err
		}
	}
	return nil
}

func printStatus(c *ucli.Context, cl *hooks.CLI, home, project string) error {
	st, err := cl.Check(home, project)
	if err != nil {
		return fault.Wrap(fault.Data, fault.KindUsage, err, "cannot read the %s settings", cl.Name)
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, st)
	}
	w := c.App.Writer
	state := "ready"
	if !st.OK() {
		state = "blocked"
	}
	fmt.Fprintf(w, "%s: %s (%s)\n", st.CLI, state, st.File)
	if len(st.Installed) > 0 {
		fmt.Fprintf(w, "  hooks: %s\n", strings.Join(st.Installed, ", "))
	}
	for _, b := range st.Blockers {
		fmt.Fprintf(w, "  blocked: %s\n", b)
	}
	return nil
}

// runHooksDoctor is status plus what only a running fleet can show: the
// gateway answers, the pane's entity and its state, and with --watch the
// loop itself — the entity goes busy then idle, through the agent's own
// hooks, while the user (or a message) runs a turn.
func runHooksDoctor(c *ucli.Context) error {
	cls, home, project, err := hooksArgs(c, false)
	if err != nil {
		return err
	}
	st, err := cls[0].Check(home, project)
	if err != nil {
		return fault.Wrap(fault.Data, fault.KindUsage, err, "cannot read the %s settings", cls[0].Name)
	}
	report := map[string]any{"hooks": st}
	problems := append([]string{}, st.Blockers...)
	s, err := fleetcli.Connect(c)
	if err != nil {
		problems = append(problems, "the gateway: "+err.Error())
	}
	var row *api.EntityRow
	if s != nil {
		defer s.Client.Close()
		row, err = doctorEntity(c, s)
		if err != nil {
			problems = append(problems, err.Error())
		} else {
			report["entity"] = row
			switch row.Status {
			case "detached", "unhooked", "stuck":
				problems = append(problems, fmt.Sprintf("%s reads %s: %s", row.Name, row.Status, row.StatusReason))
			}
		}
	}
	if d := c.Duration("watch"); d > 0 && row != nil && len(problems) == 0 {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: watching %s for %v: submit a prompt in its agent, or send it a message\n", row.Name, d)
		seen, err := watchLoop(s, row.Name, d)
		report["loop"] = seen
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	report["problems"] = problems
	if c.Bool("json") {
		if err := fleetcli.PrintJSON(c.App.Writer, report); err != nil {
			return err
		}
	} else {
		if err := printStatus(c, cls[0], home, project); err != nil {
			return err
		}
		if row != nil {
			fmt.Fprintf(c.App.Writer, "  entity: %s %s %s\n", row.Name, row.Status, row.StatusReason)
		}
		if seen, ok := report["loop"].([]string); ok {
			fmt.Fprintf(c.App.Writer, "  loop: %s\n", strings.Join(seen, " → "))
		}
	}
	if len(problems) > 0 {
		return fault.New(fault.Unavailable, fault.KindHooksBlocked, "the %s hooks cannot work yet: %s", cls[0].Name, problems[0]).
			WithHint("fleet-roster hooks status %s", cls[0].Name)
	}
	return nil
}

// doctorEntity is the entity the doctor looks at: --entity, or the inject
// entity joined on the pane the doctor runs in.
func doctorEntity(c *ucli.Context, s *fleetcli.Session) (*api.EntityRow, error) {
	resp, err := s.Client.Call(&api.Request{Op: api.OpRoster})
	if err != nil {
		return nil, err
	}
	name, pane := c.String("entity"), os.Getenv("TMUX_PANE")
	for i := range resp.Entities {
		r := &resp.Entities[i]
		if r.Host != s.Cfg.Host {
			continue
		}
		if name != "" && r.Name == name || name == "" && pane != "" && r.Target == pane {
			return r, nil
		}
	}
	if name != "" {
		return nil, fmt.Errorf("no entity named %s on this host", name)
	}
	return nil, fmt.Errorf("no inject entity is joined on this pane (%s): fleet-roster join NAME --mode inject --tmux-target \"$TMUX_PANE\", or --entity NAME", pane)
}

// watchLoop waits up to d for entity name to read busy and then idle.
func watchLoop(s *fleetcli.Session, name string, d time.Duration) ([]string, error) {
	deadline := time.Now().Add(d)
	var seen []string
	for time.Now().Before(deadline) {
		resp, err := s.Client.Call(&api.Request{Op: api.OpRoster})
		if err != nil {
			return seen, err
		}
		for _, r := range resp.Entities {
			if r.Name != name || r.Host != s.Cfg.Host {
				continue
			}
			if len(seen) == 0 || seen[len(seen)-1] != r.Status {
				seen = append(seen, r.Status)
			}
			if r.Status == "idle" && len(seen) >= 2 && seen[len(seen)-2] == "busy" {
				return seen, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return seen, fmt.Errorf("%s did not go busy then idle within %v (seen: %s)", name, d, strings.Join(seen, " → "))
}
