package gwapp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"crypto/ed25519"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/private"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
	ucli "github.com/urfave/cli/v2"
)

// Operator-certified hosts (man 7 fleet-security, OPERATOR-CERTIFIED
// HOSTS): fleet-gw operator runs on the operator's machine, with the
// operator key; fleet-gw cert runs on a host.

// readInput reads one line-sized object from the file named by the only
// argument, or from stdin ("-" or none).
func readInput(c *ucli.Context, what string) (string, error) {
	if c.NArg() > 1 {
		return "", cli.Usage("give one %s file (or - or nothing for stdin), got %d arguments", what, c.NArg())
	}
	var r io.Reader = c.App.Reader
	if c.NArg() == 1 && c.Args().First() != "-" {
		f, err := os.Open(c.Args().First())
		if err != nil {
			return "", fault.Wrap(fault.Usage, fault.KindUsage, err, "cannot read the %s", what)
		}
		defer f.Close()
		r = f
	} else if f, ok := r.(*os.File); ok && cli.IsTerminal(f) {
		fmt.Fprintf(c.App.ErrWriter, "fleet-gw: reading the %s from stdin (end with Ctrl-D)\n", what)
	}
	data, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

func badObject(err error, hint string) error {
	fe := fault.New(fault.Data, fault.KindBadCert, "%v", err)
	if hint != "" {
		fe = fe.WithHint("%s", hint)
	}
	return fe
}

// operatorKey reads --key.
func operatorKey(c *ucli.Context) (*trust.Operator, error) {
	path := c.String("key")
	if path == "" {
		return nil, cli.Usage("--key FILE is required: the operator key file fleet-gw operator init made")
	}
	o, err := trust.ReadOperator(path)
	if fe := fault.NotPrivate(err); fe != nil {
		return nil, fe
	}
	if err != nil {
		return nil, fault.Wrap(fault.Usage, fault.KindBadConfig, err, "cannot read the operator key").
			WithHint("make one with: fleet-gw operator init --out FILE")
	}
	return o, nil
}

func keyFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "key", Usage: "the operator key file (made by fleet-gw operator init; kept offline)"}
}

func operatorCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name:  "operator",
		Usage: "on the operator's machine: make the operator key, certify hosts, revoke them",
		Description: "An operator key certifies hosts: every gateway whose trust file has the operator's line " +
			"(operator NAME KEY) admits a host that presents a valid certificate of that operator, with no line " +
			"for that host. Keep the key on the operator's machine, offline: never in a gateway's state folder " +
			"(init refuses one). See man 7 fleet-security, OPERATOR-CERTIFIED HOSTS.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Subcommands: []*ucli.Command{{
			Name:         "init",
			Usage:        "make an operator key in FILE (0600) and print its trust line: operator NAME KEY",
			UsageText:    "fleet-gw operator init --out FILE [--name NAME]",
			OnUsageError: app.OnUsageError,
			Flags: []ucli.Flag{
				&ucli.StringFlag{Name: "out", Usage: "where to write the key (a new file, outside any gateway state folder)"},
				&ucli.StringFlag{Name: "name", Value: "ops", Usage: "the operator's name in trust files"},
				&ucli.StringFlag{Name: "state-dir", Usage: "a gateway state folder the key must not go into (env FLEET_STATE_DIR)"},
			},
			Action: func(c *ucli.Context) error {
				if c.NArg() > 0 {
					return cli.Usage("fleet-gw operator init takes no arguments, got %q", c.Args().First())
				}
				if c.String("out") == "" {
					return cli.Usage("--out FILE is required").WithHint("fleet-gw operator init --out ~/fleet-operator.key")
				}
				dirs := []string{c.String("state-dir"), os.Getenv("FLEET_STATE_DIR")}
				o, err := trust.NewOperator(c.String("out"), c.String("name"), dirs...)
				var sd *trust.StateDirError
				switch {
				case errors.As(err, &sd):
					return fault.New(fault.Refused, fault.KindNotPrivate, "%v", err).
						WithHint("write it on the operator's machine, outside every gateway state folder, and keep it offline")
				case errors.Is(err, os.ErrExist):
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "%s exists: an operator key is never written over", c.String("out"))
				case err != nil && strings.Contains(err.Error(), "not an operator name"):
					return cli.Usage("%v", err)
				case err != nil:
					if fe := fault.NotPrivate(err); fe != nil {
						return fe
					}
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the operator key")
				}
				fmt.Fprintf(c.App.ErrWriter, "fleet-gw: operator key written to %s: keep it offline; on each host run: fleet-gw trust add '<the line below>'\n", c.String("out"))
				_, err = fmt.Fprintln(c.App.Writer, o.Line())
				return err
			},
		}, {
			Name:         "line",
			Usage:        "print the operator's trust line (operator NAME KEY) again",
			UsageText:    "fleet-gw operator line --key FILE",
			OnUsageError: app.OnUsageError,
			Flags:        []ucli.Flag{keyFlag()},
			Action: func(c *ucli.Context) error {
				o, err := operatorKey(c)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(c.App.Writer, o.Line())
				return err
			},
		}, {
			Name:  "certify",
			Usage: "certify a host's enrolment request (fleet-gw cert request): print its certificate",
			Description: "Reads the request from FILE or stdin, checks that the host signed it with the key it names, " +
				"and prints the certificate (one line) on stdout: install it on that host with fleet-gw cert install.",
			UsageText:    "fleet-gw operator certify --key FILE [--days N] [REQUEST-FILE]",
			OnUsageError: app.OnUsageError,
			Flags: []ucli.Flag{keyFlag(),
				&ucli.IntFlag{Name: "days", Value: 365, Usage: fmt.Sprintf("days the certificate is valid (at most %d)", int(trust.MaxCertLife/(24*time.Hour)))},
				cli.JSONFlag()},
			Action: func(c *ucli.Context) error {
				o, err := operatorKey(c)
				if err != nil {
					return err
				}
				days := c.Int("days")
				if days < 1 || time.Duration(days)*24*time.Hour > trust.MaxCertLife {
					return cli.Usage("--days %d: a certificate is valid for 1 to %d days", days, int(trust.MaxCertLife/(24*time.Hour)))
				}
				in, err := readInput(c, "enrolment request")
				if err != nil {
					return err
				}
				r, err := trust.ParseRequest(in)
				if err != nil {
					return badObject(err, "on the new host run: fleet-gw cert request > HOST.req")
				}
				cert, err := trust.Certify(o.Key, r, time.Duration(days)*24*time.Hour)
				if err != nil {
					return badObject(err, "")
				}
				if c.Bool("json") {
					return cli.PrintJSON(c.App.Writer, certJSON(cert))
				}
				fmt.Fprintf(c.App.ErrWriter, "fleet-gw: certified %s (key %s, serial %s) until %s; on %s run: fleet-gw cert install FILE\n",
					cert.Host, cert.Key, cert.Serial, cert.NotAfter.Format(time.RFC3339), cert.Host)
				_, err = fmt.Fprintln(c.App.Writer, cert.Raw)
				return err
			},
		}, bundleCommand(app), enrolCommand(app), {
			Name:  "revoke",
			Usage: "revoke hosts' certificates: sign the next revocation list into --list FILE and print it",
			Description: "Every certificate of each HOST issued until now is void (a certificate issued later, " +
				"the host enrolled again, is not). The list in --list FILE (the operator's copy, kept beside the key) " +
				"gets the next serial and is printed on stdout: import it on any one host with fleet-gw cert revoked " +
				"--import FILE, and every gateway that trusts this operator has it within one presence interval.",
			UsageText:    "fleet-gw operator revoke --key FILE --list FILE HOST...",
			OnUsageError: app.OnUsageError,
			Flags: []ucli.Flag{keyFlag(),
				&ucli.StringFlag{Name: "list", Usage: "the operator's revocation list file (made on first use)"}},
			Action: func(c *ucli.Context) error {
				o, err := operatorKey(c)
				if err != nil {
					return err
				}
				if c.String("list") == "" {
					return cli.Usage("--list FILE is required: the operator's copy of its revocation list")
				}
				if c.NArg() == 0 {
					return cli.Usage("fleet-gw operator revoke takes the HOSTs to revoke")
				}
				prev, err := trust.ReadRevocationsFile(c.String("list"))
				if err == nil && prev != nil && !prev.Verify() {
					err = errors.New("its signature is not its operator's (altered)")
				}
				if err != nil {
					return badObject(fmt.Errorf("the revocation list %s: %w", c.String("list"), err), "restore the list from the operator's backup")
				}
				next, err := trust.Revoke(o.Key, prev, c.Args().Slice())
				if err != nil {
					return cli.Usage("%v", err)
				}
				if err := private.WriteFile(c.String("list"), []byte(next.Raw+"\n"), 0o600); err != nil {
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the revocation list %s", c.String("list"))
				}
				fmt.Fprintf(c.App.ErrWriter, "fleet-gw: revocation list %d revokes %s; on any one host run: fleet-gw cert revoked --import %s\n",
					next.Serial, strings.Join(c.Args().Slice(), ", "), c.String("list"))
				_, err = fmt.Fprintln(c.App.Writer, next.Raw)
				return err
			},
		}},
	}
}

// certView is a certificate in JSON.
type certView struct {
	Host      string    `json:"host"`
	Serial    string    `json:"serial"`
	Key       string    `json:"key"`
	SealKey   string    `json:"seal_key,omitempty"`
	Operator  string    `json:"operator"`
	Issued    time.Time `json:"issued"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	State     string    `json:"state,omitempty"`
	Cert      string    `json:"cert"`
}

func certJSON(c *trust.Cert) certView {
	return certView{Host: c.Host, Serial: c.Serial, Key: c.Key, SealKey: c.SealKey, Operator: c.Operator,
		Issued: c.Issued.UTC(), NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(), Cert: c.Raw}
}

func certCommand(app *ucli.App) *ucli.Command {
	flags := func() []ucli.Flag { return append(gwFlags(), cli.JSONFlag()) }
	hostKey := func(c *ucli.Context) (string, string, ed25519.PrivateKey, *seal.Keyring, error) {
		cfg, err := cli.LoadConfig(c)
		if err != nil {
			return "", "", nil, nil, err
		}
		priv, sealing, err := hostKeys(cfg.StateDir)
		if err != nil {
			return "", "", nil, nil, err
		}
		return cfg.Host, cfg.StateDir, priv, sealing, nil
	}
	return &ucli.Command{
		Name:  "cert",
		Usage: "on a host: ask for, install and show its operator certificate; import revocations",
		Description: "A host certified by an operator is admitted by every gateway that trusts that operator " +
			"(an operator line in its trust file), without a line of its own there. See man 7 fleet-security, " +
			"OPERATOR-CERTIFIED HOSTS.",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Subcommands: []*ucli.Command{{
			Name:         "request",
			Usage:        "print this host's enrolment request (one line) for the operator to certify",
			UsageText:    "fleet-gw cert request > HOST.req",
			OnUsageError: app.OnUsageError,
			Flags:        gwFlags(),
			Action: func(c *ucli.Context) error {
				if c.NArg() > 0 {
					return cli.Usage("fleet-gw cert request takes no arguments, got %q", c.Args().First())
				}
				host, _, priv, sealing, err := hostKey(c)
				if err != nil {
					return err
				}
				req, err := trust.MakeSealedRequest(host, priv, sealing.Public().String())
				if err != nil {
					return cli.Usage("%v", err)
				}
				fmt.Fprintf(c.App.ErrWriter, "fleet-gw: enrolment request of %s: on the operator's machine run: fleet-gw operator certify --key FILE REQUEST-FILE\n", host)
				_, err = fmt.Fprintln(c.App.Writer, req)
				return err
			},
		}, {
			Name:         "install",
			Usage:        "check and keep this host's certificate (from fleet-gw operator certify); a running gateway presents it within one presence interval",
			UsageText:    "fleet-gw cert install [CERT-FILE]",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				host, dir, priv, sealing, err := hostKey(c)
				if err != nil {
					return err
				}
				in, err := readInput(c, "certificate")
				if err != nil {
					return err
				}
				cert, err := trust.InstallCert(dir, host, priv.Public().(ed25519.PublicKey), in)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				var pe *os.PathError
				if errors.As(err, &pe) {
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot keep the certificate in %s", dir)
				}
				if err != nil {
					return badObject(err, "ask the operator to certify this host's request: fleet-gw cert request")
				}
				switch cert.SealKey {
				case sealing.Public().String():
				case "":
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: warning: this certificate names no sealing key (its request predates sealing keys): ask for a new one with: fleet-gw cert request\n")
				default:
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: warning: this certificate names sealing key %s, not this host's current one (%s): ask for a new one with: fleet-gw cert request\n", cert.SealKey, sealing.Public())
				}
				if cfg, err := cli.LoadConfig(c); err == nil {
					if _, ok := trust.Open(cfg.TrustFile).Operators()[cert.Operator]; !ok {
						fmt.Fprintf(c.App.ErrWriter, "fleet-gw: warning: the trust file %s does not hold this certificate's operator: the hosts it certifies are not admitted here; add the operator's line: fleet-gw trust add 'operator NAME KEY'\n", cfg.TrustFile)
					}
				}
				return report(c, certJSON(cert), fmt.Sprintf("%s: certified by operator key %s (%s) until %s; the gateway presents it within one presence interval",
					host, trust.KeyID(cert.OperatorKey()), cert.Operator, cert.NotAfter.Format(time.RFC3339)))
			},
		}, {
			Name:         "show",
			Usage:        "print this host's certificate (the line; --json: its fields)",
			UsageText:    "fleet-gw cert show [--json]",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				cfg, err := cli.LoadConfig(c)
				if err != nil {
					return err
				}
				cert, err := trust.ReadHostCert(cfg.StateDir)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				if err != nil {
					return badObject(err, "install a new one with: fleet-gw cert install FILE")
				}
				if cert == nil {
					return fault.New(fault.NoRecipient, fault.KindUnknownHost, "host %s has no certificate", cfg.Host).
						WithHint("fleet-gw cert request, certified by the operator, then: fleet-gw cert install FILE")
				}
				if c.Bool("json") {
					v := certJSON(cert)
					v.State = "valid"
					if why := cert.Current(time.Now()); why != "" {
						v.State = why
					}
					return cli.PrintJSON(c.App.Writer, v)
				}
				_, err = fmt.Fprintln(c.App.Writer, cert.Raw)
				return err
			},
		}, {
			Name:  "revoked",
			Usage: "list the hosts revoked by the operators this gateway trusts; --import FILE takes a newer list",
			Description: "With --import FILE (made by fleet-gw operator revoke), the list is checked against the " +
				"operators in the trust file and kept in the state folder if it is newer than the one held; the running " +
				"gateway refuses the revoked hosts and carries the list to every other gateway within one presence interval.",
			UsageText:    "fleet-gw cert revoked [--import FILE] [--json]",
			OnUsageError: app.OnUsageError,
			Flags:        append(flags(), &ucli.StringFlag{Name: "import", Usage: "a revocation list file to take"}),
			Action: func(c *ucli.Context) error {
				if c.NArg() > 0 {
					return cli.Usage("fleet-gw cert revoked takes no arguments, got %q", c.Args().First()).
						WithHint("import a list with: fleet-gw cert revoked --import FILE")
				}
				cfg, err := cli.LoadConfig(c)
				if err != nil {
					return err
				}
				ops := map[string]string{}
				entries, err := trust.Read(cfg.TrustFile)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				if err != nil {
					return fault.Wrap(fault.Usage, fault.KindBadConfig, err, "the trust file is unreadable")
				}
				for _, e := range entries {
					if e.Operator != "" {
						ops[e.Key] = e.Operator
					}
				}
				lists, errs := trust.LoadRevocations(cfg.StateDir)
				for _, e := range errs {
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: warning: %v\n", e)
				}
				if path := c.String("import"); path != "" {
					data, err := os.ReadFile(path)
					if err != nil {
						return fault.Wrap(fault.Usage, fault.KindUsage, err, "cannot read the revocation list")
					}
					r, err := trust.ParseRevocations(string(data))
					if err != nil {
						return badObject(err, "import the file fleet-gw operator revoke wrote (--list FILE)")
					}
					name, trusted := ops[r.Operator]
					switch {
					case !trusted:
						return fault.New(fault.Refused, fault.KindNotAuthentic, "the revocation list is signed by operator key %s, which the trust file %s does not hold", r.Operator, cfg.TrustFile).
							WithHint("trust the operator first: fleet-gw trust add 'operator NAME KEY'")
					case !r.Verify():
						return fault.New(fault.Refused, fault.KindNotAuthentic, "the revocation list's signature is not its operator's (altered)")
					}
					if old := lists[r.Operator]; old != nil && old.Serial >= r.Serial {
						fmt.Fprintf(c.App.ErrWriter, "fleet-gw: operator %s's list %d is already held (this one is %d): nothing to do\n", name, old.Serial, r.Serial)
					} else {
						if err := trust.SaveRevocations(cfg.StateDir, r); err != nil {
							if fe := fault.NotPrivate(err); fe != nil {
								return fe
							}
							return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot keep the revocation list in %s", cfg.StateDir)
						}
						lists[r.Operator] = r
						fmt.Fprintf(c.App.ErrWriter, "fleet-gw: operator %s's revocation list %d taken: the gateway refuses its hosts and spreads it within one presence interval\n", name, r.Serial)
					}
				}
				var keys []string
				for k := range lists {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					r := lists[k]
					name := ops[k]
					if name == "" {
						name = "(not trusted)"
					}
					for _, h := range r.Hosts {
						if c.Bool("json") {
							err = cli.PrintJSON(c.App.Writer, map[string]any{"host": h.Host, "before": h.Before.UTC(),
								"operator": name, "operator_key": k, "serial": r.Serial})
						} else {
							_, err = fmt.Fprintln(c.App.Writer, h.Host, h.Before.UTC().Format(time.RFC3339), name, r.Serial)
						}
						if err != nil {
							return err
						}
					}
				}
				return nil
			},
		}},
	}
}
