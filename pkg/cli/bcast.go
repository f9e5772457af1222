package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/urfave/cli/v2"
)

// NewBcastApp is fleet-bcast.
func NewBcastApp() *cli.App {
	app := newApp("fleet-bcast", "send one message to every entity, or to every member of a group, on every host")
	takesText(app, func(map[string]bool) int { return 0 }) // no recipient: all text
	app.UsageText = "fleet-bcast [options] [--group G] [TEXT...|-]"
	app.Description = "Publishes once with key broadcast.all or broadcast.<group>; the broker copies it into " +
		"every member's inbox and each copy is delivered like any message. Members on this host get " +
		"theirs even with the broker down: the command then still prints the msg id and trace id, says on stderr " +
		"that the other hosts were not reached, and exits 12 (local_only; with --json, \"other_hosts\":\"not_reached\"). " +
		"Do not run it again then: this host's members would get a second copy; reach the others with fleet-send NAME@HOST. " +
		"The sender does not get its own broadcast. Prints the msg id and the trace id. " +
		"A group is named as an entity is (a letter, then up to 63 letters, digits, '-' or '_'): any other --group exits 64 before anything is sent."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.StringFlag{Name: "group", Usage: "only the members of group G (default: everyone)"},
		waitForBrokerFlag(),
	)
	app.Action = func(c *cli.Context) error {
		// the group becomes the routing key broadcast.<group>: checked
		// here, before the gateway is asked, and there again
		if err := ident.CheckGroup(c.String("group")); err != nil {
			return err
		}
		if err := checkWaitForBroker(c); err != nil {
			return err
		}
		s, err := connect(c)
		if err != nil {
			return err
		}
		defer s.client.Close()
		if err := s.needs(c, "wait-for-broker", api.FeatureWaitForBroker); err != nil {
			return err
		}
		body, err := readBody(c.Args().Slice(), s.client.Hello.MaxBody)
		if err != nil {
			return err
		}
		// an exec worker's broadcast while a message is delivered to it
		// is a hop of that message (gateway/hops.go), as fleet-send's is
		cause := ""
		if s.client.Hello.Has(api.FeatureCause) {
			cause = os.Getenv("FLEET_MSG_ID")
		}
		resp, err := s.client.Call(&api.BcastRequest{Group: c.String("group"), Body: body,
			WaitBrokerMS: c.Duration("wait-for-broker").Milliseconds(), Cause: cause})
		if resp == nil || resp.Sent == nil {
			if err == nil {
				err = fault.New(fault.Unavailable, fault.KindProtocol, "the gateway's answer names no message")
			}
			return err
		}
		// err with resp: delivered on this host, the other hosts not
		// reached (12); what was sent is printed all the same, so a
		// retry can be scoped
		if c.Bool("json") {
			out := map[string]any{
				"msg_id": resp.Sent.MsgID, "trace_id": resp.Sent.TraceID, "group": strings.TrimPrefix(resp.Sent.Recipient, "broadcast."),
				"local_members": resp.Count,
			}
			if len(resp.Sent.ClearHosts) > 0 {
				out["clear_hosts"] = resp.Sent.ClearHosts // their members got it in the clear
			}
			switch fault.KindOf(err) {
			case fault.KindLocalOnly:
				out["other_hosts"] = "not_reached"
			case fault.KindInboxFull:
				out["other_hosts"] = "inbox_full"
			}
			if perr := printJSON(c.App.Writer, out); perr != nil {
				return perr
			}
			return err
		}
		if hs := resp.Sent.ClearHosts; len(hs) > 0 {
			fmt.Fprintf(c.App.ErrWriter, "fleet-bcast: warning: sent in the clear to the members on %s (no sealing key): the broker can read it\n", strings.Join(hs, ", "))
		}
		if _, perr := fmt.Fprintf(c.App.Writer, "%s %s\n", resp.Sent.MsgID, resp.Sent.TraceID); perr != nil {
			return perr
		}
		return err
	}
	return app
}
