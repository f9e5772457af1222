package rosterapp

import (
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
)

// acceptCommand is fleet-roster accept NAME add|remove|reset|list
// [PATTERN...]: an entity's inbound policy (pkg/gateway/policy.go).
func acceptCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "accept",
		Usage:     "who may message, ask, broadcast to or stop an entity of this host: add, remove, reset or list its patterns",
		ArgsUsage: "NAME add|remove PATTERN... | NAME reset | NAME list",
		Description: "A PATTERN is NAME, NAME@HOST, @HOST, group:G or *, optionally limited to kinds: PATTERN/KIND,KIND " +
			"(SEND, ASK, BROADCAST, STOP). An entity with no policy of its own follows the host's accept-default " +
			"(fleet-config(5); * unless set): an add gives it a policy of its own of just those patterns, a remove starts from " +
			"the default's. reset goes back to the default. " +
			"A message the policy does not accept is never delivered: a sender on this host gets exit 77, kind not_accepted, " +
			"naming the policy; one on another host has its message refused here (dead, and a BOUNCE). A reply to a message " +
			"the entity sent is always taken. Every refusal is in the audit log (not_accepted).",
		Flags:  []ucli.Flag{fleetcli.JSONFlag()},
		Action: runAccept,
	}
}

func runAccept(c *ucli.Context) error {
	args := c.Args().Slice()
	if len(args) < 2 {
		return fleetcli.Usage("want NAME and an action (add, remove, reset or list), got %d arguments", len(args))
	}
	name, action, patterns := args[0], args[1], args[2:]
	switch action {
	case "add", "remove":
		if len(patterns) == 0 {
			return fleetcli.Usage("accept %s needs a PATTERN: NAME, NAME@HOST, @HOST, group:G or *, optionally /KIND,...", action)
		}
		if _, err := accept.ParseAll(patterns); err != nil {
			return fleetcli.Usage("%v", err)
		}
	case "reset", "list":
		if len(patterns) > 0 {
			return fleetcli.Usage("accept %s takes no pattern", action)
		}
	default:
		return fleetcli.Usage("accept: %q is not add, remove, reset or list", action)
	}
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	resp, err := s.Client.Call(&api.AcceptRequest{Name: name, Action: action, Patterns: patterns})
	if err != nil {
		return err
	}
	e := resp.Entity
	if c.Bool("json") {
		return fleetcli.PrintJSON(c.App.Writer, map[string]any{"name": e.Name, "accept": orEmpty(e.Accept), "accept_from": e.AcceptFrom})
	}
	rules := "nobody"
	if len(e.Accept) > 0 {
		rules = strings.Join(e.Accept, " ")
	}
	if action == "list" {
		for _, r := range e.Accept {
			fmt.Fprintln(c.App.Writer, r)
		}
		if e.AcceptFrom == "default" {
			fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s follows the host's accept-default\n", name)
		} else if len(e.Accept) == 0 {
			fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s accepts nobody (replies to its own messages still come)\n", name)
		}
		return nil
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-roster: %s accepts: %s (%s)\n", name, rules, map[string]string{"own": "its own policy", "default": "the host's accept-default"}[e.AcceptFrom])
	return nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
