package gwapp

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/trust"
	ucli "github.com/urfave/cli/v2"
)

// brokerSetupCommand is fleet-gw broker-setup: the broker login of one
// gateway (or of an operator), made with rabbitmqctl by whoever
// administers the broker. What each login may do is in
// pkg/broker/provision.go.
func brokerSetupCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name:  "broker-setup",
		Usage: "make the broker login of one host's gateway (or an operator's), with least privilege; run by the broker's administrator",
		UsageText: "fleet-gw broker-setup --broker amqps://BROKER:5671/VHOST --host HOST [--output FILE]\n" +
			"fleet-gw broker-setup --broker URI --operator NAME\n" +
			"fleet-gw broker-setup --broker URI --host HOST --remove\n" +
			"... --dry-run   (print the rabbitmqctl commands instead)",
		Description: "Creates the fleet's exchanges and bridge.dlq in the vhost, the user fleet-gw-HOST@VHOST with a new " +
			"random password, its permissions (only HOST's own queues; presence only as HOST) and prints the " +
			"FLEET_BROKER URI for HOST's gateway on stdout (or writes it, mode 0600, to --output). The password " +
			"reaches rabbitmqctl on its standard input, never its arguments. Running it again is harmless and " +
			"gives the login a new password: restart HOST's gateway with the new URI. --remove deletes the login " +
			"and closes its connections; its queues stay. --operator NAME makes fleet-op-NAME@VHOST, which may read, " +
			"replay and purge bridge.dlq and nothing else. The run is one rabbitmqctl import_definitions (the password " +
			"goes in hashed), then a check that the login authenticates; --dry-run prints the same as separate commands.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "broker", Usage: "the broker address the gateway will use, without credentials: amqps://HOST:PORT/VHOST"},
			&ucli.StringFlag{Name: "host", Usage: "the host id whose gateway gets the login"},
			&ucli.StringFlag{Name: "operator", Usage: "make an operator's login fleet-op-NAME instead"},
			&ucli.BoolFlag{Name: "remove", Usage: "delete the login and close its connections"},
			&ucli.BoolFlag{Name: "dry-run", Usage: "print the rabbitmqctl commands, run nothing"},
			cli.Choice("queue-type", "bridge.dlq's queue type: classic, or quorum on a cluster (as the gateways' inbox-queue-type)", "classic", "classic", "quorum"),
			&ucli.StringFlag{Name: "output", Usage: "write the URI to this file (mode 0600) instead of stdout"},
			&ucli.StringFlag{Name: "rabbitmqctl", Value: "rabbitmqctl", EnvVars: []string{"FLEET_RABBITMQCTL"},
				Usage: "how to run rabbitmqctl: a command and its leading arguments, split at spaces (e.g. \"sudo rabbitmqctl -n rabbit@broker\")"},
		},
		Action: func(c *ucli.Context) error {
			if c.NArg() > 0 {
				return cli.Usage("fleet-gw broker-setup takes no arguments, got %q", c.Args().First())
			}
			host, op := c.String("host"), c.String("operator")
			switch {
			case host != "" && op != "":
				return cli.Usage("--host and --operator are one login each: give one")
			case host != "":
				if !trust.HostRE.MatchString(host) {
					return cli.Usage("--host %q is not a host id (letters, digits, '-' and '_', at most 63)", host)
				}
			case op != "":
				if !ident.ValidName(op) {
					return cli.Usage("--operator %q is not a name (a letter, then letters, digits, '-' or '_')", op)
				}
			default:
				return cli.Usage("name the login: --host HOST (a gateway) or --operator NAME")
			}
			base := c.String("broker")
			if base == "" {
				return cli.Usage("--broker is required: the address the gateway will connect to, e.g. amqps://broker:5671/fleet")
			}
			_, vhost, err := broker.ParseBase(base)
			if err != nil {
				return cli.Usage("%v", err)
			}
			g := broker.HostGrant(vhost, host)
			if op != "" {
				g = broker.OperatorGrant(vhost, op)
			}
			ctl := strings.Fields(c.String("rabbitmqctl"))
			if len(ctl) == 0 {
				return cli.Usage("--rabbitmqctl is empty")
			}
			qt := c.String("queue-type") // one of its choices: the parser checked
			p := broker.Provisioner{Ctl: ctl, QueueType: qt}
			w := c.App.Writer
			if c.Bool("remove") {
				if c.Bool("dry-run") {
					for _, s := range broker.RemoveSteps(g.User) {
						fmt.Fprintln(w, s.Shell(strings.Join(ctl, " ")))
					}
					return nil
				}
				if err := runnable(ctl); err != nil {
					return err
				}
				if err := p.Run(broker.RemoveSteps(g.User)); err != nil {
					return ctlFailed(err)
				}
				return report(c, map[string]any{"user": g.User, "removed": true}, g.User+": removed, its connections closed")
			}
			if c.Bool("dry-run") {
				fmt.Fprintln(w, "# PASSWORD: a new random password (make one with: head -c 24 /dev/urandom | base64 | tr '+/' '-_' | tr -d =)")
				fmt.Fprintln(w, "# if the user exists: change_password instead of add_user (a new password; restart its gateway)")
				for _, s := range broker.SetupSteps(g, vhost, qt) {
					fmt.Fprintln(w, s.Shell(strings.Join(ctl, " ")))
				}
				return nil
			}
			if err := runnable(ctl); err != nil {
				return err
			}
			// the file is made before the login: a rotation whose new
			// password could not be saved would leave the host with none
			var out *privateFile
			if path := c.String("output"); path != "" {
				if out, err = createPrivate(path); err != nil {
					return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "cannot write %s", path)
				}
				defer out.abort()
			}
			uri, err := p.Setup(g, base)
			if err != nil {
				return ctlFailed(err)
			}
			if out != nil {
				if err := out.commit(uri + "\n"); err != nil {
					return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "cannot write %s: the login was made, run this again for a new password", out.path)
				}
				return report(c, map[string]any{"user": g.User, "vhost": vhost, "output": out.path},
					fmt.Sprintf("%s: login ready in vhost %s; its URI is in %s", g.User, vhost, out.path))
			}
			_, err = fmt.Fprintln(w, uri)
			return err
		},
	}
}

func runnable(ctl []string) error {
	if _, err := exec.LookPath(ctl[0]); err != nil {
		return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "cannot run %s", ctl[0]).
			WithHint("run this where rabbitmqctl reaches the broker node (or say how with --rabbitmqctl)")
	}
	return nil
}

func ctlFailed(err error) error {
	return fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "the broker login was not made").
		WithHint("is the node up, and may this user run rabbitmqctl against it?")
}

// privateFile is a secret's file in the making: created owner-only (never
// through a moment with wider permissions) under a temporary name, renamed
// into place by commit.
type privateFile struct {
	path string
	f    *os.File
	done bool
}

func createPrivate(path string) (*privateFile, error) {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &privateFile{path: path, f: f}, nil
}

func (p *privateFile) commit(data string) error {
	_, err := p.f.WriteString(data)
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p.f.Name(), p.path)
	}
	p.done = err == nil
	return err
}

func (p *privateFile) abort() {
	if !p.done {
		p.f.Close()
		os.Remove(p.f.Name())
	}
}
