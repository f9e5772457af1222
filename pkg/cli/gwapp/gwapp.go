// Package gwapp is fleet-gw's command definition. It lives apart from
// pkg/cli so that the short commands do not link (and initialise) the
// gateway, the store and the broker client: their start-up time is part of
// every call.
package gwapp

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"

	"log/slog"
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
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
			// the daemon catches SIGINT and SIGTERM from its start (a
			// command's context catches them once waited on: cli.Main)
			_ = c.Context.Done()
			if c.NArg() > 0 {
				return cli.Usage("fleet-gw run takes no arguments, got %q", c.Args().First())
			}
			if err := cli.RefuseBrokerPassword(c, "broker", "put the URI in FLEET_BROKER or in the config file (mode 0600)"); err != nil {
				return err
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
				// MiB of memory (scripts/BENCHMARKS.md). GOGC overrides it.
				debug.SetGCPercent(300)
			}
			return gateway.New(cfg, slog.New(h)).Run(c.Context)
		},
	}, {
		Name:            "key",
		Usage:           "print this host's trust line (HOST PUBLIC-KEY SEALING-KEY), creating its signing and sealing keys if needed",
		Description:     "Collect every host's line into each gateway's trust file (trust-file): across hosts, a message is admitted only when a host in it signed it. The third field is the host's public sealing key (age1..., STATE_DIR/seal.key), what other hosts will seal message bodies to.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Flags:           gwFlags(),
		Action: func(c *ucli.Context) error {
			cfg, err := cli.LoadConfig(c)
			if err != nil {
				return err
			}
			priv, sealing, err := hostKeys(cfg.StateDir)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(c.App.Writer, trust.SealedLine(cfg.Host, priv.Public().(ed25519.PublicKey), sealing.Public().String()))
			return err
		},
	}, statusCommand(app), trustCommand(app), sealCommand(app), certCommand(app), operatorCommand(app), joinCommand(app), brokerSetupCommand(app)}
	return app
}

// hostKeys reads, or makes on first use, the host's signing key and,
// beside it, its sealing key (pkg/seal): wherever one is made the other
// is too.
func hostKeys(stateDir string) (ed25519.PrivateKey, *seal.Keyring, error) {
	priv, err := trust.HostKey(stateDir)
	if err == nil {
		var k *seal.Keyring
		if k, err = seal.LoadKeyring(stateDir); err == nil {
			return priv, k, nil
		}
	}
	if fe := fault.NotPrivate(err); fe != nil {
		return nil, nil, fe
	}
	return nil, nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot read or create the host key in %s", stateDir)
}

// trustCommand is fleet-gw trust: the trust file, edited the way an
// operator enrols hosts. A running gateway sees each change at its next
// message, without a restart.
func trustCommand(app *ucli.App) *ucli.Command {
	file := func(c *ucli.Context) (string, error) {
		cfg, err := cli.LoadConfig(c)
		if err != nil {
			return "", err
		}
		return cfg.TrustFile, nil
	}
	cantWrite := func(path string, err error) error {
		return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the trust file %s", path)
	}
	flags := func() []ucli.Flag { return append(gwFlags(), cli.JSONFlag()) }
	return &ucli.Command{
		Name:  "trust",
		Usage: "list, add and remove the hosts whose signed messages this gateway admits",
		Description: "Across hosts a message is admitted only when a host in the trust file signed it; " +
			"with none trusted, no other host is admitted. Enrol host B on host A: on B run `fleet-gw key`, " +
			"then on A: fleet-gw trust add B KEY (or paste the whole line). Changes apply to a running gateway " +
			"at once, messages already queued from a removed host included.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Subcommands: []*ucli.Command{{
			Name:         "list",
			Usage:        "print the trusted hosts (HOST KEY [SEALING-KEY] per line) and operators (operator NAME KEY); JSON Lines with --json",
			UsageText:    "fleet-gw trust list [--json]",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				if c.NArg() > 0 {
					return cli.Usage("fleet-gw trust list takes no arguments, got %q", c.Args().First())
				}
				path, err := file(c)
				if err != nil {
					return err
				}
				entries, err := trust.Read(path)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				if err != nil {
					return fault.Wrap(fault.Usage, fault.KindBadConfig, err, "the trust file is unreadable, so no other host is admitted").
						WithHint("fix or remove the line it names; fleet-gw trust add rewrites the file")
				}
				for _, e := range entries {
					if c.Bool("json") {
						err = cli.PrintJSON(c.App.Writer, e)
					} else {
						_, err = fmt.Fprintln(c.App.Writer, e.String())
					}
					if err != nil {
						return err
					}
				}
				if len(entries) == 0 && !c.Bool("json") {
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: no host is trusted (%s): messages from other hosts are refused\n", path)
				}
				var unsealed []string
				for _, e := range entries {
					if e.Host != "" && !e.Sealing() {
						unsealed = append(unsealed, e.Host)
					}
				}
				if len(unsealed) > 0 && !c.Bool("json") {
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: no sealing key announced by %s (a line of before sealing keys): on each, run fleet-gw key and add its line here again\n", strings.Join(unsealed, ", "))
				}
				return nil
			},
		}, {
			Name:         "add",
			Usage:        "trust HOST's key (the line fleet-gw key prints on HOST), or an operator's (operator NAME KEY); replaces a key it had",
			UsageText:    "fleet-gw trust add HOST KEY [SEALING-KEY] | fleet-gw trust add 'HOST KEY SEALING-KEY' | fleet-gw trust add 'operator NAME KEY'",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				var e trust.Entry
				var err error
				switch c.NArg() {
				case 1:
					e, err = trust.ParseLine(c.Args().First())
				case 2:
					e, err = trust.Check(c.Args().Get(0), c.Args().Get(1))
				case 3:
					e, err = trust.ParseLine(strings.Join(c.Args().Slice(), " "))
				default:
					return cli.Usage("fleet-gw trust add takes HOST KEY [SEALING-KEY] (or the line fleet-gw key prints)").
						WithHint("on the other host run: fleet-gw key")
				}
				if err != nil {
					return cli.Usage("%v", err).WithHint("on the other host run: fleet-gw key")
				}
				path, err := file(c)
				if err != nil {
					return err
				}
				changed, err := trust.Add(path, e)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				if err != nil {
					if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
						return cantWrite(path, err)
					}
					return fault.Wrap(fault.Usage, fault.KindBadConfig, err, "the trust file is unreadable").
						WithHint("fix or remove the line it names")
				}
				what := "trusted"
				if !changed {
					what = "already trusted"
				}
				if e.Operator != "" {
					return report(c, map[string]any{"operator": e.Operator, "key": e.Key, "changed": changed},
						fmt.Sprintf("operator %s: %s: the hosts it certifies are admitted", e.Operator, what))
				}
				return report(c, map[string]any{"host": e.Host, "key": e.Key, "changed": changed}, fmt.Sprintf("%s: %s", e.Host, what))
			},
		}, {
			Name:         "remove",
			Usage:        "stop trusting HOST (or operator NAME, and so the hosts it certified): refused from now on, queued messages included",
			UsageText:    "fleet-gw trust remove HOST | fleet-gw trust remove operator NAME",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				if c.NArg() == 2 && c.Args().First() == "operator" {
					name := c.Args().Get(1)
					path, err := file(c)
					if err != nil {
						return err
					}
					was, err := trust.RemoveOperator(path, name)
					if fe := fault.NotPrivate(err); fe != nil {
						return fe
					}
					if err != nil {
						return cantWrite(path, err)
					}
					if !was {
						return fault.New(fault.NoRecipient, fault.KindUnknownHost, "operator %s is not in the trust file %s", name, path).
							WithHint("list the trusted hosts and operators with: fleet-gw trust list")
					}
					return report(c, map[string]any{"operator": name, "removed": true}, "operator "+name+": no longer trusted")
				}
				if c.NArg() != 1 {
					return cli.Usage("fleet-gw trust remove takes one HOST (or: operator NAME)")
				}
				host := c.Args().First()
				path, err := file(c)
				if err != nil {
					return err
				}
				was, err := trust.Remove(path, host)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				if err != nil {
					return cantWrite(path, err)
				}
				if !was {
					return fault.New(fault.NoRecipient, fault.KindUnknownHost, "host %s is not in the trust file %s", host, path).
						WithHint("list the trusted hosts with: fleet-gw trust list")
				}
				return report(c, map[string]any{"host": host, "removed": true}, host+": no longer trusted")
			},
		}},
	}
}

// report prints a one-shot result: JSON with --json, else a line on stderr
// (stdout stays data only).
func report(c *ucli.Context, v any, line string) error {
	if c.Bool("json") {
		return cli.PrintJSON(c.App.Writer, v)
	}
	_, err := fmt.Fprintln(c.App.ErrWriter, "fleet-gw: "+line)
	return err
}

// gwFlags are fleet-gw run's flags: one per configuration key.
func gwFlags() []ucli.Flag {
	var flags []ucli.Flag
	for _, k := range config.Keys {
		usage := k.Usage + " (env " + k.Env + "; default " + k.Default + ")"
		if choices, ok := config.Choices[k.Name]; ok {
			// no default of its own: the config supplies it
			f := cli.Choice(k.Name, usage, "", choices...)
			f.Hint = config.ChoiceHints[k.Name]
			flags = append(flags, f)
			continue
		}
		flags = append(flags, &ucli.StringFlag{Name: k.Name, Usage: usage})
	}
	return append(flags, &ucli.StringFlag{Name: "config", Usage: "config file (env FLEET_CONFIG)"})
}
