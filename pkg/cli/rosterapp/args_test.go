package rosterapp

import (
	"io"
	"slices"
	"testing"

	fleetcli "github.com/fleetd/fleet/pkg/cli"
	ucli "github.com/urfave/cli/v2"
)

func TestInterspersedRoster(t *testing.T) {
	cases := []struct {
		name     string
		in, want []string
	}{
		{"join with repeated group",
			[]string{"fleet-roster", "join", "NAME", "--mode", "pull", "--group", "a", "--group", "b"},
			[]string{"fleet-roster", "join", "--mode", "pull", "--group", "a", "--group", "b", "--", "NAME"}},
		{"app flags before the subcommand stay there",
			[]string{"fleet-roster", "--socket", "/s", "join", "w", "--mode", "inject", "--exec", "cat -n"},
			[]string{"fleet-roster", "--socket", "/s", "join", "--mode", "inject", "--exec", "cat -n", "--", "w"}},
		{"a flag value is not a subcommand",
			[]string{"fleet-roster", "--config", "join", "list"},
			[]string{"fleet-roster", "--config", "join", "list"}},
		{"subcommand name as a later argument is text",
			[]string{"fleet-roster", "dead", "list"},
			[]string{"fleet-roster", "dead", "--", "list"}},
		{"subcommand flags after its argument",
			[]string{"fleet-roster", "status", "busy", "--as", "bob", "--json"},
			[]string{"fleet-roster", "status", "--as", "bob", "--json", "--", "busy"}},
		{"-- in a subcommand",
			[]string{"fleet-roster", "join", "--mode", "pull", "--", "--odd-name"},
			[]string{"fleet-roster", "join", "--mode", "pull", "--", "--odd-name"}},
		{"bare subcommand",
			[]string{"fleet-roster", "list", "--json"},
			[]string{"fleet-roster", "list", "--json"}},
		{"no subcommand",
			[]string{"fleet-roster", "--json"},
			[]string{"fleet-roster", "--json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := fleetcli.Interspersed(NewRosterApp(), tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("interspersed(%q)\n got  %q\n want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestRosterJoinFlagsAfterName(t *testing.T) {
	app := NewRosterApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	var (
		ran    bool
		mode   string
		groups []string
		exec   string
		args   []string
		socket string
	)
	i := slices.IndexFunc(app.Commands, func(c *ucli.Command) bool { return c.Name == "join" })
	if i < 0 {
		t.Fatal("fleet-roster has no join command")
	}
	app.Commands[i].Action = func(c *ucli.Context) error {
		ran = true
		mode, groups, exec, args = c.String("mode"), c.StringSlice("group"), c.String("exec"), c.Args().Slice()
		for _, ctx := range c.Lineage() {
			if ctx.IsSet("socket") {
				socket = ctx.String("socket")
			}
		}
		return nil
	}
	in := []string{"fleet-roster", "--socket", "/s", "join", "worker", "--mode", "inject", "--group", "a", "--exec", "cat -n", "--group", "b"}
	if err := app.Run(fleetcli.Interspersed(app, in)); err != nil || !ran {
		t.Fatalf("Run: %v (ran %v)", err, ran)
	}
	if mode != "inject" || exec != "cat -n" || socket != "/s" ||
		!slices.Equal(groups, []string{"a", "b"}) || !slices.Equal(args, []string{"worker"}) {
		t.Errorf("parsed mode %q exec %q socket %q groups %q args %q", mode, exec, socket, groups, args)
	}
}
