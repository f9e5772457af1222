package gwapp

import (
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
	ucli "github.com/urfave/cli/v2"
)

// defaultGrace is how long a rotated-out sealing key still opens what
// was sealed to it: the other hosts seal to the new key from this host's
// next presence on (a second after a rotation, if its gateway runs), so
// what the old key still has to open is what was sealed before that and
// is waiting — in a broker inbox while this gateway was stopped, or
// published by a host that had not heard yet.
const defaultGrace = 72 * time.Hour

// sealKeyView is one key of the ring in JSON (no secret).
type sealKeyView struct {
	ID      string    `json:"id"`
	Public  string    `json:"public"`
	Current bool      `json:"current"`
	Until   time.Time `json:"until,omitzero"` // a retired key's grace deadline
	Expired bool      `json:"expired,omitempty"`
}

// rotatedView is what fleet-gw seal rotate --json prints.
type rotatedView struct {
	ID        string    `json:"id"`
	Public    string    `json:"public"`
	Previous  string    `json:"previous_id"`
	Until     time.Time `json:"previous_until"`
	TrustLine string    `json:"trust_line"` // what the hosts that trust this one by its line add
	// CertStale: this host's certificate names the old key; a new one
	// is asked for with fleet-gw cert request
	CertStale bool `json:"cert_stale,omitempty"`
}

// sealCommand is fleet-gw seal: this host's sealing keys (pkg/seal).
func sealCommand(app *ucli.App) *ucli.Command {
	flags := func() []ucli.Flag { return append(gwFlags(), cli.JSONFlag()) }
	keyring := func(c *ucli.Context) (string, string, ed25519.PrivateKey, *seal.Keyring, error) {
		cfg, err := cli.LoadConfig(c)
		if err != nil {
			return "", "", nil, nil, err
		}
		priv, kr, err := hostKeys(cfg.StateDir)
		if err != nil {
			return "", "", nil, nil, err
		}
		return cfg.Host, cfg.StateDir, priv, kr, nil
	}
	noArgs := func(c *ucli.Context) error {
		if c.NArg() > 0 {
			return cli.Usage("fleet-gw seal %s takes no arguments, got %q", c.Command.Name, c.Args().First()).
				WithHint("see: fleet-gw seal %s --help", c.Command.Name)
		}
		return nil
	}
	return &ucli.Command{
		Name:  "seal",
		Usage: "list, rotate and destroy this host's sealing keys (what other hosts seal message bodies to)",
		Description: "Each host has a sealing key beside its signing key (STATE_DIR/seal.key): other hosts seal " +
			"the text of every message for this host to its public half, which this host's presence announces and " +
			"its trust line and certificate name. Rotation: fleet-gw seal rotate makes a new current key; a running " +
			"gateway announces it within a second, and the other hosts seal to it from then on; the old key still " +
			"opens what was sealed to it until the grace ends, then opens nothing and is destroyed (by the gateway, " +
			"at its start and every minute, or by fleet-gw seal destroy).",
		HideHelpCommand: true,
		OnUsageError:    app.OnUsageError,
		Subcommands: []*ucli.Command{{
			Name:         "keys",
			Usage:        "list the sealing keys: the current one, then the retired ones with their grace deadline; JSON Lines with --json",
			UsageText:    "fleet-gw seal keys [--json]",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				_, _, _, kr, err := keyring(c)
				if err != nil {
					return err
				}
				now := time.Now()
				for _, k := range kr.Keys() {
					v := sealKeyView{ID: k.ID, Public: k.Public, Current: k.Current, Until: k.Until.UTC(), Expired: !k.Current && !now.Before(k.Until)}
					if c.Bool("json") {
						err = cli.PrintJSON(c.App.Writer, v)
					} else {
						_, err = fmt.Fprintln(c.App.Writer, keyLine(v, now))
					}
					if err != nil {
						return err
					}
				}
				return nil
			},
		}, {
			Name: "rotate",
			Usage: "make a new current sealing key; the old one still opens what was sealed to it until --grace from now, " +
				"then it is destroyed; prints the new public key",
			UsageText:    "fleet-gw seal rotate [--grace 72h] [--json]",
			OnUsageError: app.OnUsageError,
			Flags: append(flags(), &ucli.DurationFlag{Name: "grace", Value: defaultGrace,
				Usage: "how long the old key still opens messages sealed to it (0: not at all; they are refused as unknown_seal_key)"}),
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				grace := c.Duration("grace")
				if grace < 0 {
					return cli.Usage("--grace %v is negative", grace).
						WithHint("give how long the old key still opens messages, e.g. --grace 72h (0: not at all)")
				}
				host, dir, priv, kr, err := keyring(c)
				if err != nil {
					return err
				}
				old := kr.Public()
				pub, err := kr.Rotate(grace)
				if err != nil {
					return keyringError(err, dir)
				}
				until := time.Now().Add(grace).UTC().Truncate(time.Second)
				for _, k := range kr.Keys() {
					if k.ID == old.ID().String() {
						until = k.Until.UTC()
					}
				}
				v := rotatedView{ID: pub.ID().String(), Public: pub.String(), Previous: old.ID().String(), Until: until,
					TrustLine: trust.SealedLine(host, priv.Public().(ed25519.PublicKey), pub.String())}
				cert, cerr := trust.ReadHostCert(dir)
				v.CertStale = cerr == nil && cert != nil && cert.SealKey != pub.String()
				if c.Bool("json") {
					return cli.PrintJSON(c.App.Writer, v)
				}
				if _, err := fmt.Fprintln(c.App.Writer, pub.String()); err != nil {
					return err
				}
				w := c.App.ErrWriter
				fmt.Fprintf(w, "fleet-gw: sealing key %s is current; the old one, %s, opens what was sealed to it until %s, then it is destroyed\n",
					v.ID, v.Previous, until.Format(time.RFC3339))
				fmt.Fprintf(w, "fleet-gw: a running gateway announces the new key within a second (a stopped one at its start): the other hosts seal to it once they hear it\n")
				fmt.Fprintf(w, "fleet-gw: on each host that trusts this one by its line, run: fleet-gw trust add '%s'\n", v.TrustLine)
				if v.CertStale {
					fmt.Fprintf(w, "fleet-gw: this host's certificate names the old key: ask the operator for a new one: fleet-gw cert request\n")
				}
				return nil
			},
		}, {
			Name:         "destroy",
			Usage:        "remove the retired sealing keys whose grace has ended (a running gateway does this itself every minute)",
			UsageText:    "fleet-gw seal destroy [--json]",
			OnUsageError: app.OnUsageError,
			Flags:        flags(),
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				_, dir, _, kr, err := keyring(c)
				if err != nil {
					return err
				}
				gone, err := kr.Destroy()
				ids := make([]string, len(gone))
				for i, id := range gone {
					ids[i] = id.String()
				}
				if err != nil {
					return keyringError(err, dir)
				}
				line := fmt.Sprintf("destroyed %d retired sealing keys", len(ids))
				switch len(ids) {
				case 0:
					line = "no retired sealing key is past its grace: nothing destroyed"
				case 1:
					line = "destroyed retired sealing key " + ids[0]
				}
				return report(c, map[string]any{"destroyed": ids}, line)
			},
		}},
	}
}

// keyLine is one key as text: ID PUBLIC STATE.
func keyLine(v sealKeyView, now time.Time) string {
	state := "current"
	switch {
	case v.Current:
	case v.Expired:
		state = "retired, grace ended " + v.Until.Format(time.RFC3339) + " (opens nothing; destroyed at the next round)"
	default:
		state = "retired, opens until " + v.Until.Format(time.RFC3339) + " (" + v.Until.Sub(now).Round(time.Minute).String() + ")"
	}
	return v.ID + " " + v.Public + " " + state
}

// keyringError is a keyring that could not be written.
func keyringError(err error, dir string) error {
	if fe := fault.NotPrivate(err); fe != nil {
		return fe
	}
	return fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot write the sealing keys in %s", dir)
}
