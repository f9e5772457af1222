package cli

import (
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/urfave/cli/v2"
)

// NewStopApp is fleet-stop.
func NewStopApp() *cli.App {
	app := newApp("fleet-stop", "stop an entity wherever it runs: its process ends and it leaves the fleet")
	app.UsageText = "fleet-stop [options] NAME|NAME@HOST|GID"
	app.Description = "Asks the gateway of the entity's host (found through the roster view) to stop it: " +
		"the launcher that started it closes its tmux window or ends its process group, then the entity leaves " +
		"the fleet as with fleet-roster leave — what still waits in its inbox is dead-lettered with reason " +
		"\"recipient left the fleet\" and its credential dies. An entity that was joined rather than spawned only leaves. " +
		"The caller is an entity (FLEET_TOKEN or --as NAME)."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "give up waiting for the answer after this long (exit 75)"},
	)
	app.Action = runStop
	return app
}

func runStop(c *cli.Context) error {
	if c.NArg() != 1 {
		return usage("want exactly one entity to stop, got %d arguments", c.NArg()).WithHint("fleet-stop NAME|NAME@HOST|GID")
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return usage("--timeout must be positive")
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	defer s.client.Close()
	target := c.Args().First()
	defer waitNotice(c, fmt.Sprintf("waiting for %s to stop (at most %v)", target, timeout))()
	resp, err := s.client.Call(&api.StopRequest{Target: target, TimeoutMS: timeout.Milliseconds()})
	if err != nil {
		return err
	}
	st := resp.Stopped
	if c.Bool("json") {
		return printJSON(c.App.Writer, st)
	}
	what := "it was not spawned: nothing else to stop"
	if st.Process != "" {
		what = "stopped its " + st.Process
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-stop: %s@%s left the fleet (%s); %d waiting message(s) dead-lettered\n",
		st.Name, st.Host, what, st.DeadLettered)
	return nil
}
