package rosterapp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/hooks"
	"github.com/fleetd/fleet/pkg/ident"
	ucli "github.com/urfave/cli/v2"
)

// hooksCommand is fleet-roster hooks: the agent CLIs' turn-hook recipes
// (scripts/hooks) merged into their own settings, and what still blocks
// them (pkg/hooks).
func hooksCommand() *ucli.Command {
	project := &ucli.StringFlag{Name: "project", Usage: "the project folder's settings (DIR/.claude, .codex, .gemini, .opencode, .github/hooks) instead of the user's"}
	return &ucli.Command{
		Name:  "hooks",
		Usage: "install the turn hooks (busy and idle), or fleet-mcp as an MCP server, into Claude Code, Codex CLI, Gemini CLI or OpenCode; status, remove, doctor",
		Subcommands: []*ucli.Command{
			{
				Name:      "install",
				Usage:     "merge fleet-turn's hooks into the CLI's settings (twice changes nothing; the user's own settings stay)",
				ArgsUsage: "claude|codex|gemini|opencode|copilot",
				Flags: []ucli.Flag{fleetcli.JSONFlag(), project,
					&ucli.BoolFlag{Name: "trust", Usage: "codex: record the hooks as trusted in its config.toml, as its /hooks review does"},
					&ucli.StringFlag{Name: "mcp", Usage: "instead of the hooks: write the CLI's MCP server entry \"fleet\": fleet-mcp --as `NAME` (the entity's credential file, never a token)"},
					&ucli.BoolFlag{Name: "force", Usage: "with --mcp: replace an entry named fleet that differs from fleet's"},
					&ucli.StringFlag{Name: "approve", Usage: "with --mcp, codex: the fleet-mcp `TOOLS` (comma-separated, or all) Codex runs without asking; by default it asks before each tool that is not read-only"}},
				Action: runHooksInstall,
			},
			{
				Name:      "status",
				Usage:     "which of the recipe's hooks are installed (an event only with every command of the recipe's), what keeps them from running, and fleet-mcp's MCP entry (present, missing or differs)",
				ArgsUsage: "[claude|codex|gemini|opencode|copilot]",
				Flags:     []ucli.Flag{fleetcli.JSONFlag(), project},
				Action:    runHooksStatus,
			},
			{
				Name:      "remove",
				Usage:     "take fleet-turn's hooks out of the CLI's settings (nothing else); with --mcp, fleet-mcp's entry instead",
				ArgsUsage: "claude|codex|gemini|opencode|copilot",
				Flags: []ucli.Flag{fleetcli.JSONFlag(), project,
					&ucli.BoolFlag{Name: "mcp", Usage: "take out the MCP server entry \"fleet\" when it runs fleet-mcp (nothing else)"}},
				Action: runHooksRemove,
			},
			{
				Name:      "doctor",
				Usage:     "status, the gateway, the pane's entity, and with --watch the live loop: busy then idle through the agent's real hooks",
				ArgsUsage: "claude|codex|gemini|opencode|copilot",
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
		return nil, fleetcli.Usage("name one agent CLI: claude, codex, gemini, opencode or copilot")
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
	if c.IsSet("mcp") {
		return installMCP(c, cl, home, project)
	}
	if c.Bool("force") || c.IsSet("approve") {
		return fleetcli.Usage("--force and --approve go with --mcp NAME").WithHint("fleet-roster hooks install %s --mcp NAME", cl.Name)
	}
	if c.Bool("trust") && cl.Name != "codex" {
		return fleetcli.Usage("--trust is for codex (the other CLIs need no hook trust)")
	}
	path, err := cl.Install(home, project)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot install the %s hooks into %s", cl.Name, path)
	}
	if cl.Name == "opencode" {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: fleet's plugin is %s\n", path)
	} else {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: fleet-turn's hooks are in %s\n", path)
	}
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
	if c.Bool("mcp") {
		return removeMCP(c, cls[0], home, project)
	}
	path, n, err := cls[0].Remove(home, project)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot remove the %s hooks from %s", cls[0].Name, path)
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"cli": cls[0].Name, "file": path, "removed": n})
	}
	if cls[0].Name == "opencode" {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %d plugin file(s) of fleet's removed: %s\n", n, path)
		return nil
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
	printMCP(w, st.MCP)
	return nil
}

func printMCP(w io.Writer, m *hooks.MCPStatus) {
	if m == nil {
		return
	}
	as := ""
	if m.Entity != "" {
		as = " as " + m.Entity
	}
	fmt.Fprintf(w, "  mcp: %s%s (%s)\n", m.State, as, m.File)
	for _, n := range m.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// installMCP is hooks install --mcp NAME: fleet-mcp's entry in the CLI's
// MCP configuration, and its status.
func installMCP(c *ucli.Context, cl *hooks.CLI, home, project string) error {
	if c.Bool("trust") {
		return fleetcli.Usage("--trust is for the hooks, not --mcp")
	}
	var approve []string
	for _, t := range strings.Split(c.String("approve"), ",") {
		if t = strings.TrimSpace(t); t != "" {
			approve = append(approve, t)
		}
	}
	name := c.String("mcp")
	path, changed, err := cl.InstallMCP(home, project, hooks.MCPOptions{Entity: name, Approve: approve, Force: c.Bool("force")})
	if err != nil {
		return mcpFault(err, cl, name, path)
	}
	if changed {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: fleet-mcp --as %s is the MCP server \"fleet\" in %s\n", name, path)
	} else {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s already has fleet-mcp --as %s; nothing changed\n", path, name)
	}
	// fleet-mcp --as NAME needs NAME's credential file in the state folder
	if cfg, err := fleetcli.LoadConfig(c); err == nil {
		if _, err := ident.Load(cfg.StateDir, name); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "fleet-roster: note: %v; fleet-mcp --as %s needs it: fleet-roster join %s --mode pull\n", err, name, name)
		}
	}
	st, err := cl.CheckMCP(home, project, name)
	if err != nil {
		return mcpFault(err, cl, name, path)
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"cli": cl.Name, "changed": changed, "mcp": st})
	}
	fmt.Fprintf(c.App.Writer, "%s:\n", cl.Name)
	printMCP(c.App.Writer, st)
	return nil
}

func removeMCP(c *ucli.Context, cl *hooks.CLI, home, project string) error {
	path, removed, err := cl.RemoveMCP(home, project)
	if err != nil {
		return mcpFault(err, cl, "", path)
	}
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"cli": cl.Name, "file": path, "removed": removed})
	}
	if removed {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: fleet-mcp's entry removed from %s\n", path)
	} else {
		fmt.Fprintf(c.App.ErrWriter, "fleet-roster: no fleet-mcp entry named fleet in %s; nothing changed\n", path)
	}
	return nil
}

// mcpFault is an installer error with its exit code and the next step.
func mcpFault(err error, cl *hooks.CLI, name, path string) error {
	var (
		usage   *hooks.UsageError
		differs *hooks.DiffersError
		unedit  *hooks.UneditableError
	)
	switch {
	case errors.As(err, &usage):
		return fleetcli.Usage("%s", usage.Msg)
	case errors.As(err, &differs):
		return fault.New(fault.Refused, fault.KindNameTaken, "%v", err).
			WithHint("fleet-roster hooks install %s --mcp %s --force replaces it (the rest of the file stays)", cl.Name, name)
	case errors.As(err, &unedit):
		return fault.New(fault.Refused, fault.KindBadConfig, "%v", err).WithHint("see fleet-roster(1), hooks")
	case strings.Contains(err.Error(), "not valid TOML") || strings.Contains(err.Error(), "not a JSON object") || strings.Contains(err.Error(), "is not an object"):
		return fault.Wrap(fault.Data, fault.KindBadConfig, err, "cannot read the %s MCP configuration", cl.Name).WithHint("fix %s, then run this again", path)
	}
	return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the %s MCP configuration %s", cl.Name, path)
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
	resp, err := s.Client.Call(&api.RosterRequest{})
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
		resp, err := s.Client.Call(&api.RosterRequest{})
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
