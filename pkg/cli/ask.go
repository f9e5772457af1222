package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/urfave/cli/v2"
)

// NewAskApp is fleet-ask.
func NewAskApp() *cli.App {
	app := newApp("fleet-ask", "ask an entity a question and wait for its answer (live only, with a TTL)")
	takesText(app, func(map[string]bool) int { return 1 }) // the askee, then the text
	app.UsageText = "fleet-ask [options] NAME|NAME@HOST|GID [TEXT...|-]"
	app.Description = "Asks are live-only: the question lives in memory and on the wire with an expiry, " +
		"never in a durable store. fleet-ask blocks until the askee answers (fleet-send --answer ASK_ID) " +
		"and prints the answer, or exits 75 when the TTL passes. An ask to an entity whose host reads stale or gone " +
		"(fleet-gw status lists the peers) fails at once with exit 69, kind host_gone, unless --wait-for-host; " +
		"one the askee's host refuses (it does not admit this host, a bad signature, ...) fails as soon as that host says so, " +
		"exit 77, kind refused_by_host, with its reason. If this process is gone when the " +
		"answer comes, the answer is never delivered anywhere and the answerer is told TOO_LATE. " +
		"The asking turn is FLEET_TURN_ID (or --turn), else a fresh id."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.DurationFlag{Name: "ttl", Usage: "how long to wait for the answer (default: the gateway's ask-ttl, 10m)"},
		&cli.StringFlag{Name: "turn", Usage: "the asking turn's id (default: env FLEET_TURN_ID, else a fresh one)"},
		&cli.StringFlag{Name: "about", Usage: "the ask belongs to the flow of message MSG_ID (one you sent or received): it carries its trace id"},
		&cli.BoolFlag{Name: "wait-for-host", Usage: "ask even if the askee's host reads stale or gone, and wait the TTL for it (without: exit 69 at once, kind host_gone)"},
		waitForBrokerFlag(),
		urgentFlag("the question"),
	)
	app.Action = func(c *cli.Context) error {
		args := c.Args().Slice()
		if len(args) == 0 {
			return usage("no askee").WithHint("fleet-ask NAME QUESTION")
		}
		if c.IsSet("ttl") && c.Duration("ttl") <= 0 {
			return usage("--ttl must be positive, not %v", c.Duration("ttl")).WithHint("fleet-ask --ttl 2m NAME QUESTION")
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
		if err := s.needs(c, "urgent", api.FeatureUrgent); err != nil {
			return err
		}
		body, err := readBody(args[1:], s.client.Hello.MaxBody)
		if err != nil {
			return err
		}
		turn := c.String("turn")
		if turn == "" {
			turn = os.Getenv("FLEET_TURN_ID")
		}
		ttl := c.Duration("ttl")
		// asked while a message is delivered to an exec worker: a hop of
		// it (gateway/hops.go), as fleet-send's send is; --about names one
		cause := ""
		if c.String("about") == "" && s.client.Hello.Has(api.FeatureCause) {
			cause = os.Getenv("FLEET_MSG_ID")
		}
		resp, err := s.client.Call(&api.AskRequest{To: args[0], Body: body, TurnID: turn, TimeoutMS: ttl.Milliseconds(),
			ReplyTo: c.String("about"), WaitHost: c.Bool("wait-for-host"),
			WaitBrokerMS: c.Duration("wait-for-broker").Milliseconds(), Urgent: c.Bool("urgent"), Cause: cause})
		if err != nil {
			return err
		}
		if hs := resp.Sent.ClearHosts; len(hs) > 0 && !c.Bool("json") {
			// said at once: the answer may never come (--json names them in it)
			fmt.Fprintf(c.App.ErrWriter, "fleet-ask: warning: asked in the clear on %s (no sealing key): the broker can read it\n", strings.Join(hs, ", "))
		}
		if isTerminal(os.Stderr) {
			wait := "the gateway's ask-ttl"
			if ttl > 0 {
				wait = ttl.String()
			}
			fmt.Fprintf(c.App.ErrWriter, "fleet-ask: asked %s (ask %s); waiting up to %s for the answer\n", named(resp.Sent.Recipient), resp.Sent.MsgID, wait)
		}
		_, err = awaitEnvelope(c, s, "answer", resp.Sent.ClearHosts,
			fault.New(fault.TempFail, fault.KindTimeout, "interrupted: the answer to %s will be refused as TOO_LATE", resp.Sent.MsgID))
		return err
	}
	return app
}
