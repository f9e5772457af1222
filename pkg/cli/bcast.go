package cli

import (
	"fmt"
	"strings"

	"github.com/fleetd/fleet/pkg/api"
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
		"theirs even with the broker down (the command then exits 69 and says which part failed). " +
		"The sender does not get its own broadcast. Prints the msg id and the trace id. " +
		"A group is named as an entity is (a letter, then up to 63 letters, digits, '-' or '_'): any other --group exits 64 before anything is sent."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.StringFlag{Name: "group", Usage: "only the members of group G (default: everyone)"},
	)
	app.Action = func(c *cli.Context) error {
		// the group becomes the routing key broadcast.<group>: checked
		// here, before the gateway is asked, and there again
		if err := ident.CheckGroup(c.String("group")); err != nil {
			return err
		}
		s, err := connect(c)
		if err != nil {
			return err
		}
		defer s.client.Close()
		body, err := readBody(c.Args().Slice(), s.client.Hello.MaxBody)
		if err != nil {
			return err
		}
		resp, err := s.client.Call(&api.Request{Op: api.OpBcast, Group: c.String("group"), Body: body})
		if err != nil {
			return err
		}
		if c.Bool("json") {
			return printJSON(c.App.Writer, map[string]any{
				"msg_id": resp.Sent.MsgID, "trace_id": resp.Sent.TraceID, "group": strings.TrimPrefix(resp.Sent.Recipient, "broadcast."),
				"local_members": resp.Count,
			})
		}
		_, err = fmt.Fprintf(c.App.Writer, "%s %s\n", resp.Sent.MsgID, resp.Sent.TraceID)
		return err
	}
	return app
}
