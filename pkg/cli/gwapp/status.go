package gwapp

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// statusCommand is fleet-gw status: the running gateway's health, for a
// person, a script or a service manager.
func statusCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "ask the running gateway how it is: exit 0 healthy, 69 no gateway, 75 degraded (its broker not connected)",
		Description: "Prints the gateway's version, host id, uptime, broker state (connected, blocked, connecting, " +
			"down, or none in single-host mode; since when, and why), trusted hosts, the peers (each other host " +
			"this one trusts or hears: trusted or not, when last heard, and live, stale, gone, unknown or " +
			"untrusted), entities, messages pending and dead, and when the oldest pending message was sent. Exit 0 when healthy, 69 when no gateway " +
			"answers on the socket, 75 when it runs degraded (a broker is configured but not connected).",
		UsageText:       "fleet-gw status [--json]",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Flags:           append(gwFlags(), cli.JSONFlag()),
		Action: func(c *ucli.Context) error {
			if c.NArg() > 0 {
				return cli.Usage("fleet-gw status takes no arguments, got %q", c.Args().First())
			}
			cfg, err := cli.LoadConfig(c)
			if err != nil {
				return err
			}
			client, err := cli.DialGateway(cfg)
			if err != nil {
				return err
			}
			defer client.Close()
			resp, err := client.Call(&api.GatewayStatusRequest{})
			if err != nil {
				return err
			}
			st := resp.GatewayStatus
			if st == nil {
				return fault.New(fault.Software, fault.KindProtocol, "the gateway sent no status")
			}
			w := c.App.Writer
			if c.Bool("json") {
				if err := cli.PrintJSON(w, st); err != nil {
					return err
				}
			} else {
				since := func(t time.Time) string {
					if t.IsZero() {
						return ""
					}
					return fmt.Sprintf(" since %s (%s ago)", t.Format(time.RFC3339), time.Since(t).Round(time.Second))
				}
				fmt.Fprintf(w, "gateway   %s on host %s, pid %d, up %s (%s)\n", st.Version, st.Host, st.Pid, st.Uptime, st.Started.Format(time.RFC3339))
				broker := st.Broker.State
				if st.Broker.Node != "" {
					broker += " to " + st.Broker.Node
				}
				if st.Broker.State != "none" {
					broker += since(st.Broker.Since)
				}
				if st.Broker.Detail != "" {
					broker += ": " + st.Broker.Detail
				}
				fmt.Fprintf(w, "broker    %s\n", broker)
				fmt.Fprintf(w, "trusted   %d hosts\n", st.Trusted)
				for _, p := range st.Peers {
					heard := "never heard since this gateway started"
					if !p.LastHeard.IsZero() {
						heard = fmt.Sprintf("last heard %s (%s ago)", p.LastHeard.Format(time.RFC3339), time.Since(p.LastHeard).Round(time.Second))
					}
					trusted := "trusted"
					if !p.Trusted {
						trusted = "not trusted"
					}
					admits := "admits this host: unknown"
					if p.Admits != nil && *p.Admits {
						admits = "admits this host"
					} else if p.Admits != nil {
						admits = "does not admit this host"
					}
					fmt.Fprintf(w, "peer      %s %s, %s, %s, %s\n", p.Host, p.State, trusted, admits, heard)
				}
				fmt.Fprintf(w, "entities  %d, %d messages pending, %d dead\n", st.Entities, st.Pending, st.Dead)
				if !st.OldestPending.IsZero() {
					fmt.Fprintf(w, "oldest    pending message sent %s\n", since(st.OldestPending)[len(" since "):])
				}
				if len(st.Held) > 0 {
					var held []string
					for _, s := range []string{"starting", "stuck", "unhooked", "detached"} {
						if n := st.Held[s]; n > 0 {
							held = append(held, fmt.Sprintf("%d %s", n, s))
						}
					}
					fmt.Fprintf(w, "held      mail of %s (fleet-roster --json says why: status_reason)\n", strings.Join(held, ", "))
				}
			}
			if !st.Healthy {
				return fault.New(fault.TempFail, fault.KindBrokerDown, "degraded: the broker is %s%s", st.Broker.State, sinceShort(st.Broker.Since)).
					WithHint("remote hosts cannot be reached meanwhile; local sends keep working")
			}
			return nil
		},
	}
}

func sinceShort(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return " for " + time.Since(t).Round(time.Second).String()
}
