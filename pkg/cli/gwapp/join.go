package gwapp

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/private"
	"github.com/fleetd/fleet/pkg/trust"
	ucli "github.com/urfave/cli/v2"
)

// Joining a host with one bundle (man 7 fleet-security, JOINING A HOST):
// fleet-gw operator bundle on the operator's machine, fleet-gw join on
// the host.

func bundleCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name:  "bundle",
		Usage: "make a new host's join bundle: its certificate, the operator's public line, its broker login and TLS files, in one 0600 file",
		Description: "Certifies the host's enrolment request (fleet-gw cert request on the host) and puts in one " +
			"line, signed by the operator key: the certificate, the operator's trust line (operator NAME KEY: the " +
			"public key only, never the operator key itself), the broker URI with the host's login (the file " +
			"fleet-gw broker-setup --output made) and the TLS files of --ca, --tls-cert and --tls-key. It holds the " +
			"broker password and the client key: --out FILE writes it mode 0600, --out - prints it once. Carry it " +
			"to the host by a channel you trust; there run: fleet-gw join FILE.",
		UsageText:    "fleet-gw operator bundle --key FILE --uri FILE [--ca FILE] [--tls-cert FILE --tls-key FILE] [--days N] --out FILE|- REQUEST-FILE",
		OnUsageError: app.OnUsageError,
		Flags: []ucli.Flag{keyFlag(),
			&ucli.StringFlag{Name: "uri", Usage: "the file holding the host's broker URI with its login (fleet-gw broker-setup --host HOST --output FILE)"},
			&ucli.StringFlag{Name: "ca", Usage: "amqps: the CA file the host checks the broker's certificate with"},
			&ucli.StringFlag{Name: "tls-cert", Usage: "amqps: the host's client certificate file, if the broker asks for one"},
			&ucli.StringFlag{Name: "tls-key", Usage: "amqps: that client certificate's key file"},
			&ucli.IntFlag{Name: "days", Value: 365, Usage: fmt.Sprintf("days the host's certificate is valid (at most %d)", int(trust.MaxCertLife/(24*time.Hour)))},
			&ucli.StringFlag{Name: "out", Usage: "write the bundle to this new file, mode 0600 (- prints it once on stdout)"},
		},
		Action: func(c *ucli.Context) error {
			o, err := operatorKey(c)
			if err != nil {
				return err
			}
			out := c.String("out")
			if out == "" {
				return cli.Usage("--out FILE is required (or --out - to print the bundle once)")
			}
			if c.String("uri") == "" {
				return cli.Usage("--uri FILE is required: the host's broker login").
					WithHint("on the broker's machine: fleet-gw broker-setup --broker URL --host HOST --output HOST.uri")
			}
			in, err := readInput(c, "enrolment request")
			if err != nil {
				return err
			}
			uri, err := private.ReadFile("broker URI file", c.String("uri"), true, 64<<10)
			if fe := fault.NotPrivate(err); fe != nil {
				return fe
			}
			if err != nil {
				return fault.Wrap(fault.Usage, fault.KindUsage, err, "cannot read the broker URI file")
			}
			raw, r, cert, err := hostBundle(c, o, in, func(*trust.Request) (string, error) { return strings.TrimSpace(string(uri)), nil })
			if err != nil {
				return err
			}
			return writeBundle(c, out, raw, r, cert, o)
		},
	}
}

// writeBundle writes a bundle to out, a new file mode 0600, or prints it
// once (out "-").
func writeBundle(c *ucli.Context, out, raw string, r *trust.Request, cert *trust.Cert, o *trust.Operator) error {
	if out == "-" {
		_, err := fmt.Fprintln(c.App.Writer, raw)
		return err
	}
	f, err := private.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "cannot write the bundle %s (a bundle is never written over)", out)
	}
	_, err = f.WriteString(raw + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "cannot write the bundle %s", out)
	}
	fmt.Fprintf(c.App.ErrWriter, "fleet-gw: bundle for %s in %s (operator %s, key id %s; certified until %s): it holds %s's broker password, carry it by a channel you trust; on %s run: fleet-gw join %s\n",
		r.Host, out, o.Name, trust.KeyID(o.Key.Public().(ed25519.PublicKey)), cert.NotAfter.Format(time.RFC3339), r.Host, r.Host, filepath.Base(out))
	return nil
}

// hostBundle checks --days and the enrolment request in, gets the host's
// broker URI with its login (login: read from a file, or made at once by
// fleet-gw operator enrol), reads the TLS files of --ca, --tls-cert and
// --tls-key, certifies the request and signs the bundle.
func hostBundle(c *ucli.Context, o *trust.Operator, in string, login func(*trust.Request) (string, error)) (string, *trust.Request, *trust.Cert, error) {
	days := c.Int("days")
	if days < 1 || time.Duration(days)*24*time.Hour > trust.MaxCertLife {
		return "", nil, nil, cli.Usage("--days %d: a certificate is valid for 1 to %d days", days, int(trust.MaxCertLife/(24*time.Hour)))
	}
	r, err := trust.ParseRequest(in)
	if err != nil {
		return "", nil, nil, badObject(err, "on the new host run: fleet-gw cert request --host HOST > HOST.req")
	}
	files := map[string]string{}
	for _, flag := range []string{"ca", "tls-cert", "tls-key"} {
		if p := c.String(flag); p != "" {
			data, err := os.ReadFile(p)
			if err != nil {
				return "", nil, nil, fault.Wrap(fault.Usage, fault.KindUsage, err, "--%s", flag)
			}
			files[flag] = string(data)
		}
	}
	// certified before the login is asked for: enrol makes (or rotates)
	// the login, and nothing that can fail without it comes after it
	cert, err := trust.Certify(o.Key, r, time.Duration(days)*24*time.Hour)
	if err != nil {
		return "", nil, nil, badObject(err, "")
	}
	uri, err := login(r)
	if err != nil {
		return "", nil, nil, err
	}
	b := trust.Bundle{Host: r.Host, Broker: uri, CA: files["ca"], ClientCert: files["tls-cert"], ClientKey: files["tls-key"], Cert: cert.Raw}
	if u, err := url.Parse(b.Broker); err == nil && u.User != nil {
		_, vhost, _ := broker.ParseBase((&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String())
		if want := broker.HostUser(vhost, r.Host); u.User.Username() != want {
			return "", nil, nil, cli.Usage("the broker login is %s, not %s's (%s)", u.User.Username(), r.Host, want).
				WithHint("make the host's own: fleet-gw broker-setup --host %s --output FILE", r.Host)
		}
	}
	raw, err := trust.MakeBundle(o, b)
	if err != nil {
		return "", nil, nil, cli.Usage("%v", err)
	}
	return raw, r, cert, nil
}

// joinFile is one file fleet-gw join writes.
type joinFile struct {
	path, what string
	data       []byte
}

func joinCommand(app *ucli.App) *ucli.Command {
	return &ucli.Command{
		Name:  "join",
		Usage: "install a join bundle (fleet-gw operator bundle) on this host: then fleet-gw run needs nothing else",
		Description: "Checks the bundle (its operator's signature, its certificate, that it was made from this host's " +
			"request: the certificate's key is this state folder's host key) and installs it: the certificate, " +
			"the operator's trust line, the TLS files (in STATE/broker/, 0600), and a config file (0600: it holds " +
			"the broker password) naming the host, the state folder, the broker and those files. A bundle for another " +
			"host or another key, or altered, is refused; so is a bundle whose operator is not one this host already " +
			"trusts, when it trusts some. On first use the bundle's operator is taken on trust: compare its key id, " +
			"printed here, with the operator's. An existing different config file or file is never written over " +
			"without --force.",
		UsageText:    "fleet-gw join [--force] BUNDLE-FILE|-",
		OnUsageError: app.OnUsageError,
		Flags: append(gwFlags(), &ucli.BoolFlag{Name: "force", Usage: "write over an existing, different config file, TLS file, certificate or operator line"},
			cli.JSONFlag()),
		Action: func(c *ucli.Context) error {
			if c.NArg() != 1 {
				return cli.Usage("fleet-gw join takes the bundle file, or - to read it from stdin").WithHint("fleet-gw join HOST.bundle")
			}
			var raw []byte
			var err error
			if c.Args().First() == "-" {
				// piped from fleet-gw operator enrol (over ssh): the
				// password never touches a disk before the config file
				if f, ok := c.App.Reader.(*os.File); ok && cli.IsTerminal(f) {
					return cli.Usage("fleet-gw join - reads the bundle from stdin, and stdin is a terminal").
						WithHint("ssh HOST fleet-gw cert request --host HOST | fleet-gw operator enrol ... | ssh HOST fleet-gw join -")
				}
				raw, err = io.ReadAll(io.LimitReader(c.App.Reader, 512<<10))
			} else {
				raw, err = private.ReadFile("join bundle", c.Args().First(), true, 512<<10)
				if fe := fault.NotPrivate(err); fe != nil {
					return fe.WithHint("a bundle holds a broker password: chmod 600 %s", c.Args().First())
				}
			}
			if err != nil {
				return fault.Wrap(fault.Usage, fault.KindUsage, err, "cannot read the bundle")
			}
			if len(bytes.TrimSpace(raw)) == 0 {
				return badObject(errors.New("no bundle: the input is empty"), "the command before the pipe failed? run it alone to see its error")
			}
			b, err := trust.ParseBundle(string(raw))
			if err != nil {
				return badObject(err, "ask the operator for a new one: fleet-gw operator bundle")
			}
			cfgPath := c.String("config")
			if cfgPath == "" {
				cfgPath = os.Getenv("FLEET_CONFIG")
			}
			if cfgPath == "" {
				d, err := os.UserConfigDir()
				if err != nil {
					return cli.Usage("no config file: %v", err).WithHint("name one with --config FILE")
				}
				cfgPath = filepath.Join(d, "fleet", "config")
			}
			cfg, err := cli.LoadConfigIfExists(c, cfgPath)
			if err != nil {
				return err
			}
			host := c.String("host")
			if host == "" {
				host = os.Getenv("FLEET_HOST")
			}
			if host != "" && host != b.Host {
				return badObject(fmt.Errorf("the bundle is for host %s, and this host is %s", b.Host, host), "")
			}
			// the state folder: absolute, as the config file will name it
			dir, err := filepath.Abs(cfg.StateDir)
			if err != nil {
				return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "state folder %s", cfg.StateDir)
			}
			if err := private.MakeDir(dir); err != nil {
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot make the state folder %s", dir)
			}
			priv, _, err := hostKeys(dir)
			if err != nil {
				return err
			}
			if !bytes.Equal(b.Parsed.PublicKey(), priv.Public().(ed25519.PublicKey)) {
				return badObject(fmt.Errorf("the bundle's certificate is for another key than this host's (made from another host's request, or another state folder: %s)", dir),
					"in the state folder the gateway will use, run: fleet-gw cert request --host "+b.Host)
			}
			force := c.Bool("force")
			trustPath := cfg.TrustFile
			if !filepath.IsAbs(trustPath) {
				trustPath, _ = filepath.Abs(trustPath)
			}
			ops := trust.Open(trustPath).Operators() // public key -> name
			sameName := false
			for _, name := range ops {
				sameName = sameName || name == b.OperatorName
			}
			if _, ok := ops[b.Parsed.Operator]; !ok && !force {
				if sameName {
					return fault.New(fault.Refused, fault.KindBadCert, "this host trusts another key as operator %s: the bundle's operator (key id %s) is not it", b.OperatorName, b.OperatorID()).
						WithHint("a bundle of the operator this host trusts; or, if the operator's key changed, --force")
				}
				if len(ops) > 0 {
					return fault.New(fault.Refused, fault.KindBadCert, "the bundle's operator %s (key id %s) is not one this host trusts", b.OperatorName, b.OperatorID()).
						WithHint("a bundle of an operator in the trust file (fleet-gw trust list); or --force to add this one")
				}
			}
			// the files, all checked before any is written
			tls := filepath.Join(dir, "broker")
			conf := []string{"# written by fleet-gw join from the bundle of operator " + b.OperatorName + " (key id " + b.OperatorID() + ")",
				"# it holds the broker password: keep it mode 0600",
				"host = " + b.Host, "state-dir = " + strconv.Quote(dir), "broker = " + strconv.Quote(b.Broker)}
			var files []joinFile
			for _, f := range []struct{ name, key, data string }{{"ca.pem", "broker-ca", b.CA}, {"client.pem", "broker-cert", b.ClientCert}, {"client.key", "broker-key", b.ClientKey}} {
				if f.data == "" {
					continue
				}
				p := filepath.Join(tls, f.name)
				files = append(files, joinFile{p, "TLS file", []byte(f.data)})
				conf = append(conf, f.key+" = "+strconv.Quote(p))
			}
			files = append(files, joinFile{trust.HostCertPath(dir), "host certificate", []byte(b.Cert + "\n")},
				joinFile{cfgPath, "config file", []byte(strings.Join(conf, "\n") + "\n")})
			var differ []string
			for _, f := range files {
				old, err := os.ReadFile(f.path)
				if err == nil && !bytes.Equal(old, f.data) {
					differ = append(differ, f.what+" "+f.path)
				}
			}
			if len(differ) > 0 && !force {
				return fault.New(fault.Refused, fault.KindBadConfig, "this host has a different %s: fleet-gw join writes over nothing of its own", strings.Join(differ, ", ")).
					WithHint("look at it; to replace it by the bundle's: fleet-gw join --force %s", c.Args().First())
			}
			for _, d := range []string{tls, filepath.Dir(cfgPath)} {
				if d == tls && len(files) == 2 {
					continue
				}
				if err := os.MkdirAll(d, 0o700); err != nil {
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot make %s", d)
				}
			}
			for _, f := range files {
				if err := private.WriteFile(f.path, f.data, 0o600); err != nil {
					return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the %s %s", f.what, f.path)
				}
			}
			e, _ := trust.ParseLine(b.Operator)
			if _, err := trust.Add(trustPath, e); err != nil {
				if fe := fault.NotPrivate(err); fe != nil {
					return fe
				}
				return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot add the operator to the trust file %s", trustPath)
			}
			written := map[string]string{"FLEET_HOST": b.Host, "FLEET_STATE_DIR": dir, "FLEET_BROKER": b.Broker}
			for _, f := range files {
				switch filepath.Base(f.path) {
				case "ca.pem":
					written["FLEET_BROKER_CA"] = f.path
				case "client.pem":
					written["FLEET_BROKER_CERT"] = f.path
				case "client.key":
					written["FLEET_BROKER_KEY"] = f.path
				}
			}
			for _, env := range []string{"FLEET_HOST", "FLEET_STATE_DIR", "FLEET_BROKER", "FLEET_BROKER_CA", "FLEET_BROKER_CERT", "FLEET_BROKER_KEY"} {
				if v := os.Getenv(env); v != "" && v != written[env] {
					fmt.Fprintf(c.App.ErrWriter, "fleet-gw: warning: %s is set: it overrides the config file %s; unset it before fleet-gw run\n", env, cfgPath)
				}
			}
			if _, err := config.Load(nil, cfgPath); err != nil {
				return fault.Wrap(fault.Usage, fault.KindBadConfig, err, "the config file written is not read back")
			}
			return report(c, map[string]any{"host": b.Host, "operator": b.OperatorName, "operator_key_id": b.OperatorID(),
				"config": cfgPath, "state_dir": dir, "not_after": b.Parsed.NotAfter.UTC()},
				fmt.Sprintf("%s joined: certified by operator %s (key id %s) until %s; config %s; start the gateway: fleet-gw run",
					b.Host, b.OperatorName, b.OperatorID(), b.Parsed.NotAfter.Format(time.RFC3339), cfgPath))
		},
	}
}
