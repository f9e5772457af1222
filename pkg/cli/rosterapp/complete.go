package rosterapp

import (
	"fmt"
	"slices"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	ucli "github.com/urfave/cli/v2"
)

// CompleteCommand is the hidden command the generated shell completions
// (bash, zsh, fish; pkg/docs) call for the values only the running fleet
// knows. It prints them one a line, sorted, and nothing else: a gateway
// that does not answer is an error on stderr, which the completions
// discard.
const CompleteCommand = "__complete"

// CompleteKinds are what it completes: the entities (NAME and NAME@HOST)
// and hosts, groups and untrusted hosts of the roster view, and the
// launcher profiles of this host's config.
var CompleteKinds = []string{"entities", "hosts", "groups", "untrusted-hosts", "profiles"}

func completeCommand() *ucli.Command {
	return &ucli.Command{
		Name:      CompleteCommand,
		Hidden:    true,
		Usage:     "print the values a shell completion offers",
		ArgsUsage: "entities|hosts|groups|untrusted-hosts|profiles",
		Action:    runComplete,
	}
}

func runComplete(c *ucli.Context) error {
	kind := c.Args().First()
	if c.NArg() != 1 || !slices.Contains(CompleteKinds, kind) {
		return fleetcli.Usage("%s takes one of %s", CompleteCommand, fleetcli.OrList(CompleteKinds))
	}
	var out []string
	if kind == "profiles" {
		cfg, err := fleetcli.LoadConfig(c)
		if err != nil {
			return err
		}
		out = cfg.ProfileNames()
	} else {
		s, err := fleetcli.Connect(c)
		if err != nil {
			return err
		}
		defer s.Client.Close()
		resp, err := s.Client.Call(&api.RosterRequest{})
		if err != nil {
			return err
		}
		out = completions(kind, resp.Entities)
	}
	for _, v := range out {
		if _, err := fmt.Fprintln(c.App.Writer, v); err != nil {
			return err
		}
	}
	return nil
}

// completions are the values of kind in the roster's rows, sorted, each
// once. A host that is not trusted here lends no names, hosts or groups:
// its rows are only what it claims.
func completions(kind string, rows []api.EntityRow) []string {
	var out []string
	for _, r := range rows {
		untrusted := r.Status == "untrusted"
		switch {
		case kind == "untrusted-hosts" && untrusted:
			out = append(out, r.Host)
		case untrusted || kind == "untrusted-hosts":
		case kind == "entities":
			out = append(out, r.Name, r.Name+"@"+r.Host)
		case kind == "hosts":
			out = append(out, r.Host)
		case kind == "groups":
			out = append(out, r.Groups...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
