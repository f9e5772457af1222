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
		"terminal (an ASK's header says by when, in local time with its zone, and the command that answers it), " +
		"JSON Lines otherwise — and acknowledges them once they are written. A message leaves " +
		"the inbox only when acknowledged: if fleet-recv dies first, the next fleet-recv gets it again.\n\n" +
		"With --hook CLI --event EVENT it is an agent CLI's hook for an entity in hook mode (fleet-roster join NAME " +
		"--mode hook; fleet-roster hooks install CLI wires it): it reads the hook's JSON on stdin, takes the waiting " +
		"messages and prints them as the JSON that CLI reads for that event — context at a turn's start (prompt) and " +
		"after a tool call (tool), a block of the turn's end while mail waits (stop) — under 9,000 bytes in all; a " +
		"message is acknowledged only after that was written, and one handed into a conversation (the CLI's " +
		"session_id) is never handed into it again. It always exits 0, saying a failure on stderr — but for " +
		"--event wake, Claude Code's asyncRewake hook, which waits in the background while the agent is idle and " +
		"exits 2 with the framed mail on stderr, waking the agent; it ends with exit 0 when a turn starts.\n\n" +
		"Codex CLI (--hook codex; its recipe runs prompt on UserPromptSubmit, tool on PostToolUse, stop on Stop): " +
		"the prompt and tool hooks' text reaches the model as a developer message, after the prompt or between the " +
		"tool call and its output, unseen by the user; the stop hook's block goes on with the turn, its text the " +
		"model's next user message (wrapped in a hook_prompt tag), and Codex shows it to the user under \"Blocked by hook\". " +
		"No Codex hook runs while it waits at its prompt: mail waits for the next turn. " +
		"The hooks run in every Codex of the user: where FLEET_TOKEN is unset or names a pull or inject entity " +
		"they take nothing and say why on stderr, which Codex does not show.\n\n" +
		"Where the text lands depends on the CLI (measured with the real CLIs, docs/agent-clis/). Gemini CLI " +
		"(--hook gemini, the BeforeAgent, AfterTool and AfterAgent hooks) adds prompt's text as a hook_context " +
		"part (in tags of that name) after the user's prompt and tool's inside the tool's result; stop denies the turn's end, and Gemini " +
		"sends the reason — the frames — to the model as the next prompt, in the USER's role, and shows it to its " +
		"user as \"Agent execution blocked: ...\". That is why every delivery opens with a line saying the frames " +
		"are fleet messages from other entities, not the user's words. Gemini reads a hook's stdout as JSON only " +
		"(plain text it shows its user): under --hook gemini every path prints JSON, {} when nothing is handed " +
		"over for whatever reason (no gateway, no credential, not a hook entity: said on stderr, which Gemini " +
		"does not show; a usage error too, with exit 64: Gemini would take plain text with that exit for a deny).\n\n" +
		"Each message is framed, the same in every CLI, as another entity's words, never the user's or the system's:\n\n" +
		"   [fleet message from NAME@HOST · msg ID · KIND]\n" +
		"   │ the body, each line behind a bar (no control character; U+2028, U+2029 as ⟨U+2028⟩)\n" +
		"   [end of fleet message ID · reply: fleet-send --reply-to ID TEXT]\n\n" +
		"An ASK's header adds \"answer by\" and its deadline (RFC 3339, UTC), its end line the command " +
		"fleet-send --answer ID TEXT; a REPLY's header adds \"re\" and the message it answers. No line of a body " +
		"can open or close a frame: only the frame's own lines start with \"[\". A body over 2,000 bytes is not " +
		"in the frame: one line gives its size and the command that shows it: (a body of N bytes, too long for this hook: " +
		"read it with fleet-recv --id MSGID).\n\n" +
		"With --id MSGID it prints such a message, framed the same way with its body whole and inert (--json: the " +
		"message's JSON object, the body byte for byte), from the caller's own copy: the hook kept it in hook-bodies/ under the state folder, in a 0600 file " +
		"named by an HMAC of the msg id keyed with the entity's credential, so it is read with that credential " +
		"(FLEET_TOKEN, as the hooks run, or --as NAME) and no other entity's. A copy is kept 7 days; each turn's end " +
		"(--event stop) removes older ones, and the hooks' per-session records (hook-seen/, hook-turn/, hook-wake/) " +
		"older than 30 days. No gateway is asked. A msg id out of its grammar is exit 64; no copy, exit 67.\n\n" +
		"A hook killed after writing its output, before the acknowledgement, leaves the message in the inbox, " +
		"recorded as handed into its conversation: the next hook of that conversation acknowledges it without " +
		"showing it again. Its CLI may have dropped what the killed hook wrote (Claude Code reads a hook's JSON " +
		"only when it exits 0), so a hook of another conversation that comes first is handed it too: at least once " +
		"into some conversation, never twice into one."
	app.Flags = append(connFlags(), jsonFlag(), asFlag(),
		&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep streaming messages as they arrive"},
		&cli.IntFlag{Name: "max", Aliases: []string{"n"}, Usage: "stop after N messages (0: all)"},
		&cli.StringFlag{Name: "hook", Usage: "run as agent CLI `CLI`'s hook (claude, codex or gemini): hand the waiting messages to its model, framed, in the JSON the CLI reads (hook delivery mode)"},
		&cli.StringFlag{Name: "id", Usage: "print message `MSGID` whole, from the copy a hook kept of a body too long for it (the pointer line's command)"},
		&cli.StringFlag{Name: "event", Usage: "with --hook: the hook's `EVENT`: prompt (turn start), tool (after a tool call), stop (turn end: keep the agent going while mail waits) or, for claude, wake (an asyncRewake hook: waits while the agent is idle, and exits 2 with the mail on stderr, which wakes it)"},
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
	if c.IsSet("hook") {
		return runHook(c)
	}
	if c.NArg() > 0 {
		return usage("fleet-recv takes no arguments, got %q", c.Args().First())
	}
	if c.IsSet("event") {
		return usage("--event is for --hook")
	}
	if c.IsSet("id") {
		return runShow(c)
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
	if e.Kind == envelope.Ask {
		// as the frame: by when, and how
		if !e.Expires.IsZero() {
			fmt.Fprintf(w, " · answer by %s", e.Expires.Local().Format("2006-01-02 15:04:05 Z07:00"))
		}
		fmt.Fprintf(w, " · answer: fleet-send --answer %s TEXT", e.MsgID)
	}
	// only on a terminal: no byte of another entity's text may act as an
	// escape sequence there
	_, err := fmt.Fprintf(w, "\n%s\n\n", deliver.Inert(e.Body, true))
	return err
}
