package cli

import (
	"bufio"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/urfave/cli/v2"
)

// NewRecvApp is fleet-recv.
func NewRecvApp() *cli.App {
	app := newApp("fleet-recv", "drain or follow the caller's inbox (pull delivery)")
	app.UsageText = "fleet-recv [options]"
	app.Description = "Writes the caller's waiting messages oldest first — a readable block each on a " +
		"terminal, JSON Lines otherwise — and acknowledges them once they are written. A message leaves " +
		"the inbox only when acknowledged: if fleet-recv dies first, the next fleet-recv gets it again."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep streaming messages as they arrive"},
		&cli.IntFlag{Name: "max", Aliases: []string{"n"}, Usage: "stop after N messages (0: all)"},
	)
	app.Action = runRecv
	return app
}

// message is one received message as a JSON line.
type message struct {
	Type string `json:"type"`
	*envelope.Envelope
}

func runRecv(c *cli.Context) error {
	if c.NArg() > 0 {
		return usage("fleet-recv takes no arguments, got %q", c.Args().First())
	}
	max := c.Int("max")
	if max < 0 {
		return usage("--max must be 0 or more")
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	defer s.client.Close()
	asJSON := c.Bool("json") || !isTerminal(os.Stdout)
	out := bufio.NewWriterSize(c.App.Writer, 64<<10)

	// Ctrl-C on --follow: close the connection; unacknowledged mail stays.
	go func() {
		<-c.Context.Done()
		s.client.Close()
	}()
	if err := s.client.Send(&api.Request{Op: api.OpRecv, Max: max, Follow: c.Bool("follow")}); err != nil {
		return err
	}
	for {
		resp, err := s.client.Read()
		if err != nil {
			if c.Context.Err() != nil {
				return nil
			}
			return err
		}
		if resp.End {
			return nil
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			if asJSON {
				err = printJSON(out, message{Type: "message", Envelope: d.Envelope})
			} else {
				err = printHuman(out, d.Envelope)
			}
			if err != nil {
				return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "writing the message out")
			}
			acks = append(acks, d.Envelope.MsgID)
		}
		// Written out first, acknowledged after.
		if err := out.Flush(); err != nil {
			return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "writing messages out (not acknowledged: they stay in the inbox)")
		}
		if os.Getenv("FLEET_CRASHPOINT") == "recv-before-ack" {
			// test hook: die like kill -9 between writing and acknowledging
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if err := s.client.Send(&api.Request{Op: api.OpAck, Acks: acks}); err != nil {
			return err
		}
	}
}

func printHuman(w *bufio.Writer, e *envelope.Envelope) error {
	fmt.Fprintf(w, "── %s from %s · %s · msg %s", e.Kind, e.Sender, e.Created.Local().Format(time.DateTime), e.MsgID)
	if e.InReplyTo != "" {
		fmt.Fprintf(w, " · re %s", e.InReplyTo)
	}
	// only on a terminal: no byte of another entity's text may act as an
	// escape sequence there
	_, err := fmt.Fprintf(w, "\n%s\n\n", deliver.Inert(e.Body, true))
	return err
}
