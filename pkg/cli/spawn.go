package cli

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/urfave/cli/v2"
)

// NewSpawnApp is fleet-spawn.
func NewSpawnApp() *cli.App {
	app := newApp("fleet-spawn", "start an entity on a host through that gateway's launcher, and register it")
	app.UsageText = "fleet-spawn [options] [--host H] NAME [-- ARGS...]"
	setWords(app, Words{Lead: func(map[string]bool) int { return 1 }, Noun: "arguments"}) // NAME, then the command's
	app.Description = "Asks the gateway of host H (this host by default) to start an entity called NAME " +
		"with the launcher of its profile P (profile.P.* in that gateway's config file): a new tmux window, " +
		"or a detached command. The entity is registered there as fleet-roster join would, and its command " +
		"runs with FLEET_TOKEN, FLEET_ENTITY and FLEET_SOCKET set; ARGS reach the command as \"$@\". " +
		"Waits for the answer and prints the new entity's gid. " +
		"A pull entity's command is a worker that reads its mail with fleet-recv --follow, which rides out " +
		"restarts of the gateway; once the command's process is gone the entity reads detached in fleet-roster, " +
		"and the profile's nudge hook (profile.P.nudge), if it has one, runs while its mail waits. " +
		"The caller is an entity (FLEET_TOKEN or --as NAME). Each request is carried out once: " +
		"sent again with the same --request-id, it answers with the same gid and starts nothing."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.StringFlag{Name: "host", Usage: "the host to start the entity on (default: this one)"},
		&cli.StringFlag{Name: "profile", Value: "default", Usage: "the launcher profile of the target host"},
		&cli.StringSliceFlag{Name: "group", Usage: "make the entity a member of group G, named as an entity is (repeat for more)"},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up waiting for the answer after this long (exit 75)"},
		&cli.StringFlag{Name: "request-id", Usage: "the request's id (default: a fresh one); the same id is never carried out twice"},
	)
	app.Action = runSpawn
	return app
}

func runSpawn(c *cli.Context) error {
	if c.NArg() == 0 {
		return usage("no name for the new entity").WithHint("fleet-spawn --host H NAME")
	}
	name, args := c.Args().First(), c.Args().Tail()
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return usage("--timeout must be positive")
	}
	if err := ident.CheckMember(c.StringSlice("group")); err != nil {
		return err
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	defer s.client.Close()
	host := c.String("host")
	if host == "" {
		host = s.client.Hello.Host
	}
	defer waitNotice(c, fmt.Sprintf("waiting for host %s to spawn %s (at most %v)", host, name, timeout))()
	resp, err := s.client.Call(&api.SpawnRequest{Name: name, Host: host, Profile: c.String("profile"), Groups: c.StringSlice("group"),
		Args: args, RequestID: c.String("request-id"), TimeoutMS: timeout.Milliseconds(),
	})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, resp.Spawned) // clear_hosts names them
	}
	if hs := resp.Spawned.ClearHosts; len(hs) > 0 {
		fmt.Fprintf(c.App.ErrWriter, "fleet-spawn: warning: the request went in the clear to %s (no sealing key): the broker can read it\n", strings.Join(hs, ", "))
	}
	_, err = fmt.Fprintln(c.App.Writer, resp.Spawned.Gid)
	return err
}

// waitNotice says on a terminal's stderr what the command waits for, once
// the wait passes a second. The returned function ends it.
func waitNotice(c *cli.Context, what string) (done func()) {
	if !isTerminal(os.Stderr) {
		return func() {}
	}
	t := time.AfterFunc(time.Second, func() { fmt.Fprintf(c.App.ErrWriter, "%s: %s\n", c.App.Name, what) })
	return func() { t.Stop() }
}
