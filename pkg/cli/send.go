package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/urfave/cli/v2"
)

// NewSendApp is fleet-send.
func NewSendApp() *cli.App {
	app := newApp("fleet-send", "send a message to an entity, or reply to one")
	// the recipient, then the text; a reply or an answer has no recipient
	takesText(app, func(seen map[string]bool) int {
		if seen["reply-to"] || seen["answer"] {
			return 0
		}
		return 1
	})
	app.UsageText = "fleet-send [options] NAME|NAME@HOST|GID [TEXT...|-]\n" +
		"fleet-send [options] --reply-to MSGID [TEXT...|-]\n" +
		"fleet-send [options] --answer ASK_ID [TEXT...|-]\n" +
		"fleet-send [options] --status MSGID\n" +
		"fleet-send [options] --wait-reply MSGID"
	app.Description = "Sends TEXT (the arguments joined by spaces; stdin when there are none or TEXT is -) " +
		"as the caller's entity, whose credential comes from FLEET_TOKEN or --as NAME. " +
		"Prints the msg id and the trace id once the message is stored durably at its recipient's gateway. " +
		"Run by an exec worker's command while a message is delivered to it (FLEET_MSG_ID set), a send is a hop of that message's trace, " +
		"as a reply is: past max-hops it is refused as a loop, and pair-rate bounds the sends to one recipient a minute (fleet(7), LOOPS AND RATES)."
	until := Choice("until", "after sending (or with --status), wait until the message is STATE (delivered); exit 75 if not within --timeout", "", "delivered")
	until.Hint = "fleet-send --until delivered NAME TEXT (or --status MSGID --until delivered)"
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.StringFlag{Name: "reply-to", Usage: "send a REPLY to the sender of message MSGID, in its trace"},
		&cli.StringFlag{Name: "id", Usage: "send as message MSGID instead of a fresh id: a retry of a send whose outcome was unknown (exit 74) is then sent at most once"},
		&cli.StringFlag{Name: "status", Usage: "print the delivery state of message MSGID instead of sending"},
		until,
		&cli.StringFlag{Name: "answer", Usage: "answer the ask ASK_ID (exit 11 TOO_LATE if its turn is gone: answering again is refused the same way)"},
		&cli.BoolFlag{Name: "wait", Usage: "hold the send open and print the recipient's reply (exit 75 if none within --timeout); an ask to you arriving first is printed instead (exit 10): answer it, then --wait-reply"},
		&cli.StringFlag{Name: "wait-reply", Usage: "wait again for the reply to your message MSGID (after --wait ended with an ask, exit 10, or timed out)"},
		&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "how long --wait or --until waits"},
		waitForBrokerFlag(),
		urgentFlag("the message"),
	)
	app.Action = runSend
	return app
}

func runSend(c *cli.Context) error {
	if err := checkSend(c); err != nil {
		return err
	}
	if id := c.String("status"); id != "" {
		return runStatus(c, id)
	}
	if id := c.String("wait-reply"); id != "" {
		return runWaitReply(c, id)
	}
	args := c.Args().Slice()
	to := ""
	if c.String("reply-to") == "" && c.String("answer") == "" {
		if len(args) == 0 {
			return usage("no recipient").WithHint("fleet-send NAME TEXT, or echo TEXT | fleet-send NAME")
		}
		to, args = args[0], args[1:]
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
	body, err := readBody(args, s.client.Hello.MaxBody)
	if err != nil {
		return err
	}
	wait := c.Bool("wait")
	timeout := c.Duration("timeout")
	// the id is minted here, not by the gateway: should the gateway be
	// lost before it answers, the caller still knows which message to ask
	// about (--status) or to retry (--id), and a retry is that message
	id := c.String("id")
	if id == "" && c.String("answer") == "" {
		id = envelope.NewID()
	}
	// a send made while a message is delivered to an exec worker names
	// it (FLEET_MSG_ID): the gateway makes the send a hop of its trace
	// if that message was delivered to the caller, and ignores it if not
	// (an earlier gateway would drop it: the send is then not counted)
	cause := ""
	if c.String("reply-to") == "" && c.String("answer") == "" && s.client.Hello.Has(api.FeatureCause) {
		cause = os.Getenv("FLEET_MSG_ID")
	}
	// a send's answer is the sent message or an error
	resp, err := s.client.Call(&api.SendRequest{To: to, Body: body, ReplyTo: c.String("reply-to"),
		AnswerTo: c.String("answer"), Wait: wait, TimeoutMS: timeout.Milliseconds(), MsgID: id,
		WaitBrokerMS: c.Duration("wait-for-broker").Milliseconds(), Cause: cause, Urgent: c.Bool("urgent")})
	if fault.KindOf(err) == fault.KindNoGateway && id != "" {
		return fault.Wrap(fault.OutcomeUnknown, fault.KindOutcomeUnknown, err, "message %s: outcome unknown", id).
			WithHint("once the gateway is back, fleet-send --status %s tells; a retry with --id %s is sent at most once", id, id)
	}
	if err != nil {
		return err
	}
	if w := resp.Sent.Warning; w != "" && (wait || c.String("until") != "" || c.IsSet("id")) {
		fmt.Fprintf(c.App.ErrWriter, "fleet-send: warning: %s\n", w)
	}
	if hs := resp.Sent.ClearHosts; len(hs) > 0 && !c.Bool("json") {
		fmt.Fprintf(c.App.ErrWriter, "fleet-send: warning: sent in the clear to %s (no sealing key): the broker can read it\n", strings.Join(hs, ", "))
	}
	if wait {
		return readReply(c, s, resp.Sent, timeout)
	}
	if until := c.String("until"); until != "" {
		fmt.Fprintf(c.App.ErrWriter, "fleet-send: sent %s (trace %s)\n", resp.Sent.MsgID, resp.Sent.TraceID)
		return waitUntil(c, s, resp.Sent.MsgID, until, resp.Sent.Warning)
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, sentOut(resp.Sent))
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s %s\n", resp.Sent.MsgID, resp.Sent.TraceID)
	return err
}

// checkSend refuses, before anything is sent, an option whose value the
// command could not carry out and options that contradict each other: a
// script that retries on an error must never send twice.
func checkSend(c *cli.Context) error {
	if c.IsSet("timeout") && c.Duration("timeout") <= 0 {
		return usage("--timeout must be positive, not %v", c.Duration("timeout"))
	}
	if err := checkWaitForBroker(c); err != nil {
		return err
	}
	if id := c.String("id"); c.IsSet("id") && !envelope.ValidID(id) {
		return usage("--id takes a message id (a UUID such as fleet-send prints), not %q", id).
			WithHint("leave --id out and fleet-send mints one")
	}
	for _, name := range []string{"status", "wait-reply", "reply-to", "answer"} {
		if c.IsSet(name) && c.String(name) == "" {
			return usage("--%s needs a message id", name)
		}
	}
	// what each way of calling fleet-send cannot be given
	for _, r := range []struct {
		opt  string
		with []string
	}{
		{"status", []string{"reply-to", "answer", "wait", "wait-reply", "id", "wait-for-broker", "urgent"}},
		{"wait-reply", []string{"reply-to", "answer", "wait", "until", "id", "wait-for-broker", "urgent"}},
		{"answer", []string{"id", "wait-for-broker", "urgent"}},
		{"reply-to", []string{"answer"}},
		{"wait", []string{"until"}},
	} {
		if !c.IsSet(r.opt) {
			continue
		}
		for _, w := range r.with {
			if c.IsSet(w) {
				return usage("--%s and --%s do not go together", r.opt, w).WithHint("see: fleet-send --help")
			}
		}
	}
	return nil
}

// readReply waits on the open send for the reply and prints it: the body
// (--json: the reply envelope as {"type":"reply",...}).
func readReply(c *cli.Context, s *session, sent *api.Sent, timeout time.Duration) error {
	if isTerminal(os.Stderr) && timeout > time.Second {
		fmt.Fprintf(c.App.ErrWriter, "fleet-send: sent %s; waiting up to %v for %s to reply\n", sent.MsgID, timeout, named(sent.Recipient))
	}
	return awaitReply(c, s, sent.MsgID)
}

// runWaitReply is --wait-reply MSGID: the wait of a send, resumed.
func runWaitReply(c *cli.Context, id string) error {
	if c.NArg() > 0 {
		return usage("--wait-reply takes no text, got %q", c.Args().First())
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	defer s.client.Close()
	if err := s.client.Send(&api.WaitReplyRequest{MsgID: id, TimeoutMS: c.Duration("timeout").Milliseconds()}); err != nil {
		return err
	}
	return awaitReply(c, s, id)
}

// awaitReply prints what ended a wait for the reply to msgID: the reply
// (exit 0), or an ask to the caller that came first (exit 10, the ask
// printed as a message of kind ASK: answer it with --answer, then
// --wait-reply msgID; the reply is not lost meanwhile).
func awaitReply(c *cli.Context, s *session, msgID string) error {
	resp, err := awaitEnvelope(c, s, "reply", nil,
		fault.New(fault.TempFail, fault.KindTimeout, "interrupted while waiting for the reply to %s", msgID).
			WithHint("wait again with: fleet-send --wait-reply %s", msgID))
	if err != nil || resp.WaitingFor == "" {
		return err
	}
	a := resp.Batch[0].Envelope
	from := a.Sender.Name + "@" + a.Sender.Host
	return fault.New(fault.AskArrived, fault.KindAskArrived, "an ask from %s (%s) came while waiting for the reply to %s; it is printed above", from, a.MsgID, msgID).
		WithHint("answer it: fleet-send --answer %s TEXT; then wait on: fleet-send --wait-reply %s", a.MsgID, msgID)
}

// awaitEnvelope reads the second frame of a held-open request (--wait,
// fleet-ask) and prints the envelope it carries: the body, or with --json
// {"type":kind,...} ({"type":"ask","waiting_for":...} for an ask that
// ended a wait). Ctrl-C closes the connection and returns interrupted.
func awaitEnvelope(c *cli.Context, s *session, kind string, clearHosts []string, interrupted error) (*api.Response, error) {
	go func() {
		<-c.Context.Done()
		s.client.Close()
	}()
	resp, err := s.client.Read()
	if err != nil {
		if c.Context.Err() != nil {
			return nil, interrupted
		}
		return nil, err
	}
	if len(resp.Batch) == 0 {
		return nil, fault.New(fault.Software, fault.KindProtocol, "the gateway ended the wait without the %s", kind)
	}
	env := resp.Batch[0].Envelope
	if c.Bool("json") {
		if resp.WaitingFor != "" {
			return resp, printJSON(c.App.Writer, surfacedAsk{Type: "ask", WaitingFor: resp.WaitingFor, Envelope: env})
		}
		return resp, printJSON(c.App.Writer, message{Type: kind, ClearHosts: clearHosts, Envelope: env})
	}
	body := strings.TrimRight(env.Body, "\n")
	if f, ok := c.App.Writer.(*os.File); ok && isTerminal(f) {
		// another entity's text on a person's terminal: no byte of it may
		// act as an escape sequence (a pipe gets the text as sent)
		body = deliver.Inert(body, true)
	}
	_, err = fmt.Fprintln(c.App.Writer, body)
	return resp, err
}

// surfacedAsk is an ask that ended a wait, in --json.
type surfacedAsk struct {
	Type       string `json:"type"`
	WaitingFor string `json:"waiting_for"`
	*envelope.Envelope
}

// readBody takes the text from the arguments, or from stdin when there are
// none or the only one is "-". It refuses to wait on a terminal, and checks
// the raw bytes (JSON would silently mend invalid UTF-8).
func readBody(args []string, max int) (string, error) {
	var raw []byte
	if len(args) == 0 || (len(args) == 1 && args[0] == "-") {
		if len(args) == 0 && isTerminal(os.Stdin) {
			return "", usage("no message text").WithHint("give the text as arguments, or pipe it: echo TEXT | fleet-send NAME -")
		}
		var err error
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, int64(max)+1))
		if err != nil {
			return "", fault.Wrap(fault.Data, fault.KindBadEnvelope, err, "reading the message from stdin")
		}
	} else {
		raw = []byte(strings.Join(args, " "))
	}
	if err := envelope.CheckBody(raw, max); err != nil {
		return "", err
	}
	return string(raw), nil
}

func runStatus(c *cli.Context, id string) error {
	if c.NArg() > 0 {
		return usage("--status takes no other arguments")
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	defer s.client.Close()
	if until := c.String("until"); until != "" {
		return waitUntil(c, s, id, until, "")
	}
	resp, err := s.client.Call(&api.LookupRequest{MsgID: id})
	if err != nil {
		return err
	}
	return printRecord(c, resp.Record)
}

// waitUntil blocks until message id reaches state, showing on a terminal
// what it waits for; warning (the send's) goes into --json.
func waitUntil(c *cli.Context, s *session, id, state, warning string) error {
	if state != "delivered" {
		return usage("--until takes delivered, not %q", state)
	}
	timeout := c.Duration("timeout")
	if isTerminal(os.Stderr) && timeout > time.Second {
		fmt.Fprintf(c.App.ErrWriter, "fleet-send: waiting up to %v for %s to be %s\n", timeout, id, state)
	}
	resp, err := s.client.Call(&api.WaitRequest{MsgID: id, Until: state, TimeoutMS: timeout.Milliseconds()})
	if err != nil {
		return err
	}
	return printRecord(c, resp.Record, warning)
}

func printRecord(c *cli.Context, r *api.Record, warning ...string) error {
	if c.Bool("json") {
		out := recordOut(r)
		if len(warning) > 0 {
			out.Warning = warning[0]
		}
		return printJSON(c.App.Writer, out)
	}
	line := fmt.Sprintf("%s %s to %s, %d attempt(s)", r.MsgID, r.State, named(r.Recipient), r.Attempts)
	if r.Reason != "" {
		line += ": " + r.Reason
	}
	_, err := fmt.Fprintln(c.App.Writer, line)
	return err
}

// waitForBrokerFlag is --wait-for-broker, for the commands that send.
func waitForBrokerFlag() cli.Flag {
	return &cli.DurationFlag{Name: "wait-for-broker", Usage: "while the broker is down or blocks publishers, " +
		"the gateway holds the send for up to DURATION and sends it again, as the same message, once the broker is back: " +
		"exit 0 sent, 69 never sent, 74 outcome unknown (nothing is held if the gateway stops)"}
}

// checkWaitForBroker refuses a --wait-for-broker that is not a positive
// duration, before anything is sent.
func checkWaitForBroker(c *cli.Context) error {
	if c.IsSet("wait-for-broker") && c.Duration("wait-for-broker") <= 0 {
		args := map[string]string{"fleet-ask": "NAME QUESTION", "fleet-bcast": "TEXT"}[c.App.Name]
		if args == "" {
			args = "NAME TEXT"
		}
		return usage("--wait-for-broker must be positive, not %v", c.Duration("wait-for-broker")).
			WithHint("%s --wait-for-broker 1m %s", c.App.Name, args)
	}
	return nil
}

// needs refuses an option set on the command line that the gateway does
// not announce: a gateway of an earlier build would ignore it silently.
// urgentFlag is --urgent of fleet-send and fleet-ask (what: what goes
// ahead).
func urgentFlag(what string) *cli.BoolFlag {
	return &cli.BoolFlag{Name: "urgent", Usage: "put " + what + " ahead of normal mail in the recipient's inbox " +
		"(FIFO among urgent ones, across hosts too); still never pasted into a busy agent: first at its next boundary. " +
		"Bounded by the gateway's urgent-rate per sender (exit 75, rate_limited, when over it)"}
}

func (s *session) needs(c *cli.Context, opt, feature string) error {
	if !c.IsSet(opt) || s.client.Hello.Has(feature) {
		return nil
	}
	return fault.New(fault.Data, fault.KindProtocol, "--%s: the gateway (fleet-gw %s) does not know it", opt, s.client.Hello.Version).
		WithHint("restart fleet-gw with the release of these commands, or leave --%s out", opt)
}
