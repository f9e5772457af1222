// Package traceapp is fleet-trace's command definition. It lives apart
// from pkg/cli because it renders tables (pkg/cli/table), which the other
// short commands should not link.
package traceapp

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/table"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// NewTraceApp is fleet-trace.
func NewTraceApp() *ucli.App {
	app := fleetcli.NewApp("fleet-trace", "every hop of one flow, from every gateway that saw it, as one timeline")
	app.UsageText = "fleet-trace [options] TRACE_ID"
	app.Description = "Prints what every gateway's audit log holds of one trace: each hop's time, host, entity, " +
		"kind, msg id, event (accepted, published, confirmed, taken, injected, drained, asked, replied, answered, " +
		"too_late, expired (an ask its askee never took), receipt, dead, bounced, ...) and the gap since the hop before. The local gateway searches its " +
		"own audit log (the rotated files too) and, with a broker, asks every host in its trust file over the " +
		"control plane, waiting at most --timeout for their answers; hosts that did not answer in time are named " +
		"on stderr and the command exits 75 after printing what came; hosts it could not ask at all (the broker down) are named " +
		"with the reason, and then, if every other host answered, it exits 69; a host that refused the query (this host " +
		"not admitted there, say) answers at once, is named with its reason, and the command exits 77. Hops are ordered by time (each host's own " +
		"clock), ties in the order a flow takes. Audit lines hold no message text. " +
		"The caller is an entity (FLEET_TOKEN or --as NAME): any entity of a trusted host may trace any trace id it knows. " +
		"Output: a table on a terminal; JSON Lines otherwise or with --json: one {\"type\":\"hop\",...} object per hop, " +
		"then one {\"type\":\"host\",...} object per host asked (state answered, no_answer, unreachable or refused)."
	app.Flags = append(fleetcli.ConnFlags(), fleetcli.JSONFlag(), fleetcli.AsFlag(),
		&ucli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "wait at most this long for the other hosts' answers (exit 75 if one is missing)"},
	)
	app.Action = run
	return app
}

// hopLine is one hop as a JSON line.
type hopLine struct {
	Type string `json:"type"` // "hop"
	api.Hop
	Sender    *fleetcli.Party `json:"sender,omitempty"`    // as every JSON output gives an entity
	Recipient *fleetcli.Party `json:"recipient,omitempty"` // (the hop's gid, and the name if known here)
	GapMS     *int64          `json:"gap_ms"`              // since the hop before; null for the first
}

// party is a hop's sender or recipient gid as an entity reference.
func party(gid string, names map[string]string) *fleetcli.Party {
	if gid == "" {
		return nil
	}
	p := fleetcli.PartyOf(gid, "")
	p.Name = names[gid]
	return p
}

// hostLine is how one host answered, as a JSON line.
type hostLine struct {
	Type    string `json:"type"` // "host"
	TraceID string `json:"trace_id"`
	api.TraceHost
}

func run(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fleetcli.Usage("want exactly one trace id, got %d arguments", c.NArg()).WithHint("fleet-trace TRACE_ID (fleet-send prints MSG_ID TRACE_ID)")
	}
	timeout := c.Duration("timeout")
	if timeout <= 0 {
		return fleetcli.Usage("--timeout must be positive")
	}
	id := c.Args().First()
	s, err := fleetcli.Connect(c)
	if err != nil {
		return err
	}
	defer s.Client.Close()
	done := fleetcli.WaitNotice(c, fmt.Sprintf("gathering trace %s from every host (at most %v)", id, timeout))
	resp, err := s.Client.Call(&api.TraceRequest{TraceID: id, TimeoutMS: timeout.Milliseconds()})
	done()
	if err != nil {
		return err
	}
	tr := resp.Trace
	if tr == nil {
		return fault.New(fault.Software, fault.KindProtocol, "the gateway sent no trace")
	}
	asJSON := c.Bool("json") || !fleetcli.IsTerminal(os.Stdout)
	if err := printTrace(c, tr, asJSON); err != nil {
		return err
	}
	var silent, unasked, refused, truncated []string
	for _, h := range tr.Hosts {
		switch {
		case h.State == api.TraceNoAnswer:
			silent = append(silent, h.Host)
		case h.State == api.TraceUnreachable:
			unasked = append(unasked, h.Host)
			fmt.Fprintf(c.App.ErrWriter, "fleet-trace: host %s could not be asked: %s\n", h.Host, h.Detail)
		case h.State == api.TraceRefused:
			refused = append(refused, h.Host)
			fmt.Fprintf(c.App.ErrWriter, "fleet-trace: host %s refused the query: %s\n", h.Host, h.Detail)
		case h.Truncated:
			truncated = append(truncated, h.Host)
		}
	}
	if len(truncated) > 0 {
		fmt.Fprintf(c.App.ErrWriter, "fleet-trace: only the first hops of %s: a host gives at most 1000 hops (512 KiB) per trace\n", strings.Join(truncated, ", "))
	}
	// a host that could not be asked is not said to be silent "within"
	// the timeout: no time was waited for it (the broker down, say)
	if len(silent) > 0 {
		msg := fmt.Sprintf("no answer from %s within %v", strings.Join(silent, ", "), timeout)
		if len(unasked) > 0 {
			msg += fmt.Sprintf(", and %s could not be asked", strings.Join(unasked, ", "))
		}
		if len(refused) > 0 {
			msg += fmt.Sprintf(", and %s refused the query", strings.Join(refused, ", "))
		}
		return fault.New(fault.TempFail, fault.KindTimeout, "%s: their hops are missing", msg).
			WithHint("those gateways may be down (fleet-roster shows who is heard); try again, or with a longer --timeout")
	}
	if len(refused) > 0 {
		msg := fmt.Sprintf("%s refused the query (why is said above)", strings.Join(refused, ", "))
		if len(unasked) > 0 {
			msg += fmt.Sprintf(", and %s could not be asked", strings.Join(unasked, ", "))
		}
		return fault.New(fault.Refused, fault.KindRefusedByHost, "%s: their hops are missing", msg).
			WithHint("fix the cause on %s (fleet-gw trust list there; its log names the refusal), then trace again", refused[0])
	}
	if len(unasked) > 0 {
		return fault.New(fault.Unavailable, fault.KindBrokerDown, "%s could not be asked (why is said above): their hops are missing", strings.Join(unasked, ", ")).
			WithHint("fleet-gw status shows the broker's state; trace again once it is connected")
	}
	if len(tr.Hops) == 0 {
		return fault.New(fault.NoRecipient, fault.KindUnknownTrace, "no host saw trace %s", id).
			WithHint("a trace id is printed by fleet-send (MSG_ID TRACE_ID); audit logs keep what their rotation keeps")
	}
	return nil
}

func printTrace(c *ucli.Context, tr *api.Trace, asJSON bool) error {
	w := c.App.Writer
	if asJSON {
		for i, h := range tr.Hops {
			line := hopLine{Type: "hop", Hop: h, Sender: party(h.Sender, tr.Names), Recipient: party(h.Recipient, tr.Names)}
			if i > 0 {
				gap := h.Time.Sub(tr.Hops[i-1].Time).Milliseconds()
				line.GapMS = &gap
			}
			if err := fleetcli.PrintJSON(w, line); err != nil {
				return err
			}
		}
		for _, h := range tr.Hosts {
			if err := fleetcli.PrintJSON(w, hostLine{Type: "host", TraceID: tr.TraceID, TraceHost: h}); err != nil {
				return err
			}
		}
		return nil
	}
	if len(tr.Hops) == 0 {
		return nil
	}
	rows := make([][]string, 0, len(tr.Hops))
	for i, h := range tr.Hops {
		gap := ""
		if i > 0 {
			gap = gapText(h.Time.Sub(tr.Hops[i-1].Time))
		}
		event := h.Event
		if h.Reason != "" {
			event += " (" + h.Reason + ")"
		}
		rows = append(rows, []string{h.Time.Local().Format("15:04:05.000"), h.Host, h.Entity, h.Kind, h.MsgID, event, gap})
	}
	return table.Render(w, []string{"TIME", "HOST", "ENTITY", "KIND", "MSG ID", "EVENT", "GAP"}, rows)
}

// gapText is a gap for people: milliseconds below a second, else
// seconds; negative when two hosts' clocks disagree.
func gapText(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	if d < time.Second {
		return fmt.Sprintf("%s%.1fms", sign, float64(d)/float64(time.Millisecond))
	}
	return sign + d.Round(time.Millisecond).String()
}
