package gwapp

import (
	"fmt"
	"os"
	"strings"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/trust"
	ucli "github.com/urfave/cli/v2"
)

// enrolCommand is fleet-gw operator enrol: a host's broker login, its
// certificate and its join bundle in one step, for an operator who can
// run rabbitmqctl against the broker — so that one line enrols a host:
//
//	ssh HOST fleet-gw cert request --host HOST | fleet-gw operator enrol --key K --broker URI | ssh HOST fleet-gw join -
func enrolCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name: "enrol",
		Usage: "make a host's broker login, certify its request and print its join bundle, in one step " +
			"(broker-setup, then bundle): for an operator who can run rabbitmqctl",
		Description: "Reads the host's enrolment request (fleet-gw cert request on the host) from REQUEST-FILE or " +
			"stdin, makes the host's least-privilege broker login as fleet-gw broker-setup --host does (a new password; " +
			"run again, it rotates it), certifies the request with the operator key and writes the join bundle, as " +
			"fleet-gw operator bundle does, to stdout (or --out FILE, mode 0600). The bundle holds the broker password: " +
			"on a terminal it is not printed unless --out - says so; piped into ssh HOST fleet-gw join - it never " +
			"touches a disk here.",
		UsageText: "fleet-gw operator enrol --key FILE --broker amqps://BROKER:5671/VHOST [--ca FILE] [--tls-cert FILE --tls-key FILE] [--days N] [--out FILE|-] [REQUEST-FILE|-]\n" +
			"ssh HOST fleet-gw cert request --host HOST | fleet-gw operator enrol --key FILE --broker URI | ssh HOST fleet-gw join -",
		OnUsageError: app.OnUsageError,
		Flags: []ucli.Flag{keyFlag(),
			&ucli.StringFlag{Name: "broker", Usage: "the broker address the host's gateway will use, without credentials: amqps://HOST:PORT/VHOST"},
			&ucli.StringFlag{Name: "rabbitmqctl", Value: "rabbitmqctl", EnvVars: []string{"FLEET_RABBITMQCTL"},
				Usage: "how to run rabbitmqctl: a command and its leading arguments, split at spaces (e.g. \"ssh broker sudo rabbitmqctl\")"},
			cli.Choice("queue-type", "bridge.dlq's queue type: classic, or quorum on a cluster (as the gateways' inbox-queue-type)", "classic", "classic", "quorum"),
			&ucli.StringFlag{Name: "ca", Usage: "amqps: the CA file the host checks the broker's certificate with"},
			&ucli.StringFlag{Name: "tls-cert", Usage: "amqps: the host's client certificate file, if the broker asks for one"},
			&ucli.StringFlag{Name: "tls-key", Usage: "amqps: that client certificate's key file"},
			&ucli.IntFlag{Name: "days", Value: 365, Usage: "days the host's certificate is valid"},
			&ucli.StringFlag{Name: "out", Usage: "write the bundle to this new file, mode 0600 (default: stdout, when it is not a terminal; - prints it anyway)"},
		},
		Action: func(c *ucli.Context) error {
			o, err := operatorKey(c)
			if err != nil {
				return err
			}
			base := c.String("broker")
			if base == "" {
				return cli.Usage("--broker is required: the address the host's gateway will connect to, e.g. amqps://broker:5671/fleet")
			}
			_, vhost, err := broker.ParseBase(base)
			if err != nil {
				return cli.Usage("%v", err)
			}
			out := c.String("out")
			if out == "" {
				if f, ok := c.App.Writer.(*os.File); ok && cli.IsTerminal(f) {
					return cli.Usage("the bundle holds the host's broker password: not printed on a terminal").
						WithHint("pipe it to the host: ... | ssh HOST fleet-gw join -  (or --out FILE, or --out - to print it)")
				}
				out = "-"
			}
			ctl := strings.Fields(c.String("rabbitmqctl"))
			if len(ctl) == 0 {
				return cli.Usage("--rabbitmqctl is empty")
			}
			if err := runnable(ctl); err != nil {
				return err
			}
			in, err := readInput(c, "enrolment request")
			if err != nil {
				return err
			}
			if out != "-" {
				if _, err := os.Stat(out); err == nil {
					return fault.New(fault.CantCreate, fault.KindOutput, "%s exists: a bundle is never written over", out)
				}
			}
			p := broker.Provisioner{Ctl: ctl, QueueType: c.String("queue-type")}
			made := ""
			raw, r, cert, err := hostBundle(c, o, in, func(r *trust.Request) (string, error) {
				uri, err := p.Setup(broker.HostGrant(vhost, r.Host), base)
				if err != nil {
					return "", ctlFailed(err)
				}
				made = broker.HostUser(vhost, r.Host)
				return uri, nil
			})
			if err != nil {
				if made != "" {
					return fault.Wrap(fault.CodeOf(err), fault.KindOf(err), err, "the login %s was made but no bundle: run this again (a new password)", made)
				}
				return err
			}
			if err := writeBundle(c, out, raw, r, cert, o); err != nil {
				return fault.Wrap(fault.CodeOf(err), fault.KindOf(err), err, "the login %s was made but its bundle not written: run this again (a new password)", made)
			}
			fmt.Fprintf(c.App.ErrWriter, "fleet-gw: %s enrolled: login %s in vhost %s, certified by operator %s until %s\n",
				r.Host, made, vhost, o.Name, cert.NotAfter.Format("2006-01-02"))
			return nil
		},
	}
}
