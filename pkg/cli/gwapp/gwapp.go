// Package gwapp is fleet-gw's command definition. It lives apart from
// pkg/cli so that the short commands do not link (and initialise) the
// gateway, the store and the broker client: their start-up time is part of
// every call.
package gwapp

import (
	"fmt"
	"runtime/debug"

	"log/slog"
	"net/url"
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	ucli "github.com/urfave/cli/v2"
)

// NewGatewayApp is fleet-gw.
func NewGatewayApp() *ucli.App {
	app := cli.NewApp("fleet-gw", "the fleet gateway: owns this host's entities and their inboxes")
	app.Description = "One fleet-gw runs per host. It keeps the host's entities, stores their messages " +
		"durably, delivers them (inject into tmux or a command, or hold for fleet-recv) and serves the " +
		"local socket every other fleet command talks to. With no broker configured it runs a whole " +
		"single-host fleet on its embedded store."
	app.UsageText = "fleet-gw run [options]"
	app.Commands = []*ucli.Command{{
		Name:            "run",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Usage:           "run the gateway in the foreground until SIGINT or SIGTERM",
		Description: "The first SIGINT/SIGTERM stops taking new work and drains in-flight deliveries " +
			"within --drain-timeout; a second one aborts at once.",
		Flags: gwFlags(),
		Action: func(c *ucli.Context) error {
			if c.NArg() > 0 {
				return cli.Usage("fleet-gw run takes no arguments, got %q", c.Args().First())
			}
			if c.IsSet("broker") {
				if u, err := url.Parse(c.String("broker")); err == nil {
					if _, has := u.User.Password(); has {
						return cli.Usage("--broker would show the broker password to every user through ps").
							WithHint("put the URI in FLEET_BROKER or in the config file (mode 0600)")
					}
				}
			}
			cfg, err := cli.LoadConfig(c)
			if err != nil {
				return err
			}
			var h slog.Handler
			opts := &slog.HandlerOptions{Level: slog.LevelInfo}
			if cli.IsTerminal(os.Stderr) {
				h = slog.NewTextHandler(os.Stderr, opts)
			} else {
				h = slog.NewJSONHandler(os.Stderr, opts)
			}
			if os.Getenv("GOGC") == "" {
				// A gateway's live heap is small and its garbage is per
				// message: collecting at 4x the live heap instead of 2x
				// gives about 7% more durable throughput here for a few
				// MiB of memory (README, Performance). GOGC overrides it.
				debug.SetGCPercent(300)
			}
			return gateway.New(cfg, slog.New(h)).Run(c.Context)
		},
	}, {
		Name:            "key",
		Usage:           "print this host's trust line (HOST PUBLIC-KEY), creating its signing key if needed",
		Description:     "Collect every host's line into each gateway's trust file (trust-file): across hosts, a message is admitted only when a host in it signed it.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Flags:           gwFlags(),
		Action: func(c *ucli.Context) error {
			cfg, err := cli.LoadConfig(c)
			if err != nil {
				return err
			}
			priv, err := gateway.HostKey(cfg)
			if err != nil {
				return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot read or create the host key in %s", cfg.StateDir)
			}
			_, err = fmt.Fprintln(c.App.Writer, gateway.TrustLine(cfg.Host, priv))
			return err
		},
	}}
	return app
}

// gwFlags are fleet-gw run's flags: one per configuration key.
func gwFlags() []ucli.Flag {
	var flags []ucli.Flag
	for _, k := range config.Keys {
		flags = append(flags, &ucli.StringFlag{
			Name:  k.Name,
			Usage: k.Usage + " (env " + k.Env + "; default " + k.Default + ")",
		})
	}
	return append(flags, &ucli.StringFlag{Name: "config", Usage: "config file (env FLEET_CONFIG)"})
}
