package docs

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/examples"
	ucli "github.com/urfave/cli/v2"
)

// TestExamplesParse runs every fleet command line of every EXAMPLES
// section (man page and --help alike) through the real parser: the
// command-line rule (cli.Reorder) and urfave/cli itself, flags, required
// flags and the flags' own checks (a choice flag's values), up to the
// action of the command the line names, which is replaced by a recorder.
// A renamed flag, a removed command or a bad value fails here.
func TestExamplesParse(t *testing.T) {
	lines := 0
	for _, page := range examples.Names() {
		for _, ex := range examples.For(page) {
			for _, line := range strings.Split(ex.Cmd, "\n") {
				if configLine.MatchString(line) {
					continue
				}
				for _, newApp := range AllApps() {
					name := newApp().Name
					calls, err := examples.Calls(line, name)
					if err != nil {
						t.Errorf("%s example %q: %v", page, line, err)
					}
					for _, args := range calls {
						lines++
						if err := parseOnly(newApp(), append([]string{name}, args...)); err != nil {
							t.Errorf("%s example %q: %s %q: %v", page, line, name, args, err)
						}
					}
				}
			}
		}
	}
	if lines < 40 {
		t.Errorf("only %d command lines found in the examples: is the table read?", lines)
	}
}

// TestExamplesParseCanFail: the parse catches what an example could rot
// into.
func TestExamplesParseCanFail(t *testing.T) {
	for _, line := range [][]string{
		{"fleet-send", "--bogus", "bob", "hi"},
		{"fleet-roster", "join", "bob"},                                // --mode is required
		{"fleet-send", "--as", "alice", "--until", "read", "bob", "x"}, // not a value of --until
		{"fleet-gw", "trust", "forget", "build2"},                      // no such command
		{"fleet-gw"}, // a command is needed
	} {
		var app *ucli.App
		for _, newApp := range AllApps() {
			if a := newApp(); a.Name == line[0] {
				app = a
			}
		}
		if err := parseOnly(app, line); err == nil {
			t.Errorf("%q parses", line)
		}
	}
}

// parseOnly runs app on args with every action replaced: nil when the
// line reached the action of a command (not a help page).
func parseOnly(app *ucli.App, args []string) error {
	ran := false
	stub := func(*ucli.Context) error { ran = true; return nil }
	var walk func([]*ucli.Command)
	walk = func(cmds []*ucli.Command) {
		for _, c := range cmds {
			if c.Action != nil {
				c.Action = stub
			}
			walk(c.Subcommands)
		}
	}
	if app.Action != nil {
		app.Action = stub
	}
	walk(app.Commands)
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, io.Discard
	ordered, err := cli.Reorder(app, args)
	if err != nil {
		return err
	}
	if err := app.RunContext(context.Background(), ordered); err != nil {
		return err
	}
	if !ran {
		return errString("no command ran (a help page?): " + strings.TrimSpace(out.String()))
	}
	return nil
}

type errString string

func (e errString) Error() string { return string(e) }

// TestHelpShowsExamples: every command's --help ends with the EXAMPLES of
// its man page, from the same table; a command's own help (every one
// has some) shows those that call it, and no other.
func TestHelpShowsExamples(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	help := func(newApp func() *ucli.App, args ...string) string {
		app := newApp()
		var out bytes.Buffer
		app.Writer = &out
		if code := cli.Main(app, append([]string{app.Name}, args...)); code != 0 {
			t.Fatalf("%s %q: exit %d", app.Name, args, code)
		}
		return out.String()
	}
	for _, newApp := range AllApps() {
		name := newApp().Name
		text := help(newApp, "--help")
		exs := examples.For(name)
		if len(exs) == 0 || !strings.Contains(text, "\nEXAMPLES:\n") {
			t.Errorf("%s --help: no EXAMPLES", name)
			continue
		}
		page := string(files["man/"+name+".1"])
		for _, ex := range exs {
			for _, l := range strings.Split(ex.Cmd, "\n") {
				if !strings.Contains(text, "       "+l+"\n") {
					t.Errorf("%s --help does not show %q", name, l)
				}
				if !strings.Contains(page, "\n"+roffCode(l)+"\n") {
					t.Errorf("%s.1 does not show %q", name, l)
				}
			}
		}
	}
	// every command's and subcommand's own --help has examples too
	for _, newApp := range AllApps() {
		var walk func(path []string, cmds []*ucli.Command)
		walk = func(path []string, cmds []*ucli.Command) {
			for _, c := range cmds {
				if c.Hidden {
					continue
				}
				p := append(slices.Clone(path), c.Name)
				if text := help(newApp, append(p, "--help")...); !strings.Contains(text, "\nEXAMPLES:\n") {
					t.Errorf("%s %s --help: no EXAMPLES", newApp().Name, strings.Join(p, " "))
				}
				walk(p, c.Subcommands)
			}
		}
		walk(nil, newApp().Commands)
	}
	byName := map[string]func() *ucli.App{}
	for _, newApp := range AllApps() {
		byName[newApp().Name] = newApp
	}
	join := help(byName["fleet-roster"], "join", "--help")
	if !strings.Contains(join, "fleet-roster join bob --mode inject") || strings.Contains(join, "fleet-roster leave bob") {
		t.Errorf("fleet-roster join --help: want the joins' examples only:\n%s", join)
	}
	trust := help(byName["fleet-gw"], "trust", "--help")
	if !strings.Contains(trust, "fleet-gw trust remove build2") || strings.Contains(trust, "fleet-gw run") {
		t.Errorf("fleet-gw trust --help: want the trust examples only:\n%s", trust)
	}
}
