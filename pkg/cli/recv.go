package cli

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/config"
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
		"With --follow and no --max it is the entity's follower, a worker's loop, and it rides out a restart of the " +
		"gateway, a clean stop or a crash: it says on stderr, in one line, that the gateway went away and why, dials " +
		"it again every 2 seconds at most for as long as it takes, and says when it follows again. Nothing is lost " +
		"and nothing is shown twice: a message written out whose acknowledgement the gateway had not recorded when " +
		"it went away comes again, and is acknowledged again without being written out. What waiting will not mend " +
		"ends it as any failure does: a credential refused (77: the entity left), the inbox taken by another " +
		"fleet-recv (75), output that cannot be written (73). --no-reconnect exits 69 instead; so does --follow with " +
		"--max. The gateway remembers the follower: once it ends (or none comes back within 10 seconds of the " +
		"gateway's start), the entity reads detached in fleet-roster, and its nudge hook fires while mail waits, " +
		"until a follower or a plain fleet-recv reads it again.\n\n" +
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
		"GitHub Copilot CLI (--hook copilot; its hook file runs prompt on userPromptSubmitted, tool on postToolUse, " +
		"stop on agentStop) reads flat objects: {\"additionalContext\": TEXT}, which it adds to the turn's prompt " +
		"(in a system_reminder tag) or to the tool's result, and {\"decision\": \"block\", \"reason\": TEXT}, " +
		"whose reason it sends as the next prompt; the session is its sessionId.\n\n" +
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
		&cli.BoolFlag{Name: "no-reconnect", Usage: "with --follow: exit 69 when the gateway stops or is lost, instead of waiting for it and following again"},
		&cli.StringFlag{Name: "hook", Usage: "run as agent CLI `CLI`'s hook (claude, codex, gemini, opencode or copilot): hand the waiting messages to its model, framed, in the JSON the CLI reads (opencode: plain text, for fleet's plugin) (hook delivery mode)"},
		&cli.StringFlag{Name: "id", Usage: "print message `MSGID` whole, from the copy a hook kept of a body too long for it (the pointer line's command)"},
		&cli.StringFlag{Name: "event", Usage: "with --hook: the hook's `EVENT`: prompt (turn start), tool (after a tool call), stop (turn end: keep the agent going while mail waits) or, for claude, wake (an asyncRewake hook: waits while the agent is idle, and exits 2 with the mail on stderr, which wakes it)"},
	)
	app.Action = runRecv
	return app
}

// message is one received message as a JSON line.
type message struct {
	Type string `json:"type"`
	// ClearHosts: fleet-ask's answer, to an ask that went in the clear
	// to these hosts (no sealing key; sealing.go)
	ClearHosts []string `json:"clear_hosts,omitempty"`
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
	follow := c.Bool("follow")
	if c.Bool("no-reconnect") && !follow {
		return usage("--no-reconnect is for --follow")
	}
	s, err := connect(c)
	if err != nil {
		return err
	}
	r := &reader{
		c: c, out: bufio.NewWriterSize(c.App.Writer, 64<<10), asJSON: c.Bool("json") || !isTerminal(os.Stdout),
		shown: newRecent(shownKept), cl: s.client,
	}
	defer r.close()
	// Ctrl-C on --follow: close the connection; unacknowledged mail stays.
	go func() {
		<-c.Context.Done()
		r.close()
	}()
	req := &api.RecvRequest{Max: max, Follow: follow}
	// a follower (--follow, no --max) rides out the gateway's restarts
	rides := follow && max == 0 && !c.Bool("no-reconnect")
	for {
		err := r.stream(req)
		if c.Context.Err() != nil {
			return nil
		}
		if err == nil || !rides || !comesBack(err) {
			return err
		}
		if err := r.reconnect(s.cfg, s.client.Token, err); err != nil {
			if c.Context.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// shownKept is how many msg ids a follower remembers having written out:
// more than the two batches (of at most 256) whose acknowledgement a
// gateway that died may not have recorded.
const shownKept = 4096

// reader writes out one fleet-recv's messages and acknowledges them, on
// one connection at a time.
type reader struct {
	c      *cli.Context
	out    *bufio.Writer
	asJSON bool
	// shown: written out and acknowledged, maybe on a connection that was
	// then lost. The gateway may not have recorded the acknowledgement:
	// one handed again is acknowledged again, not shown twice.
	shown *recent

	mu     sync.Mutex
	cl     *api.Client
	closed bool
}

// client is the current connection.
func (r *reader) client() *api.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cl
}

// close closes the current connection, and any made after.
func (r *reader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.cl != nil {
		r.cl.Close()
	}
}

// use makes cl the current connection (false: closed meanwhile).
func (r *reader) use(cl *api.Client) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		cl.Close()
		return false
	}
	r.cl = cl
	return true
}

// stream runs one recv stream on the current connection: nil when the
// gateway ends it (--max reached, or the inbox drained).
func (r *reader) stream(req *api.RecvRequest) error {
	cl := r.client()
	if err := cl.Send(req); err != nil {
		return err
	}
	for {
		resp, err := cl.Read()
		if err != nil {
			return err
		}
		if resp.End {
			return nil
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			id := d.Envelope.MsgID
			acks = append(acks, id)
			if r.shown.has(id) {
				continue // shown before the gateway was lost: acknowledged again only
			}
			if r.asJSON {
				err = printJSON(r.out, message{Type: "message", Envelope: d.Envelope})
			} else {
				err = printHuman(r.out, d.Envelope)
			}
			if err != nil {
				return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "writing the message out")
			}
		}
		// Written out first, acknowledged after.
		if err := r.out.Flush(); err != nil {
			return fault.Wrap(fault.CantCreate, fault.KindOutput, err, "writing messages out (not acknowledged: they stay in the inbox)")
		}
		for _, id := range acks {
			r.shown.add(id)
		}
		if os.Getenv("FLEET_CRASHPOINT") == "recv-before-ack" {
			// test hook: die like kill -9 between writing and acknowledging
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if err := cl.Send(&api.AckRequest{Acks: acks}); err != nil {
			return err
		}
	}
}

// comesBack says whether err is the gateway going away (stopping, lost,
// not there), or cutting this connection for others: a follower waits
// for it and goes on. Anything else — a credential refused (77), the
// inbox taken by another fleet-recv (75), the output (73) — ends it.
func comesBack(err error) bool {
	switch fault.CodeOf(err) {
	case fault.Unavailable:
		return true
	case fault.TempFail:
		return fault.KindOf(err) == fault.KindTooManyConnections
	}
	return false
}

// reconnect says on stderr that the gateway went away (why), dials it
// again with backoff until it answers, and says so. An error that will
// not pass by waiting ends it.
func (r *reader) reconnect(cfg *config.Config, token string, why error) error {
	name := r.c.App.Name
	fmt.Fprintf(r.c.App.ErrWriter, "%s: the gateway went away (%s): following again once it is back (--no-reconnect exits instead)\n", name, why)
	r.client().Close()
	pol := backoff.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: true}
	for n := 1; ; n++ {
		backoff.Sleep(r.c.Context, pol.Delay(n))
		if err := r.c.Context.Err(); err != nil {
			return err
		}
		cl, err := DialGateway(cfg)
		if err == nil {
			cl.Token = token
			if !r.use(cl) {
				return r.c.Context.Err()
			}
			fmt.Fprintf(r.c.App.ErrWriter, "%s: the gateway is back (pid %d): following again\n", name, cl.Hello.Pid)
			return nil
		}
		if !comesBack(err) {
			return err
		}
	}
}

// recent is a bounded set of msg ids: the newest n added.
type recent struct {
	ids  map[string]bool
	ring []string
	next int
}

func newRecent(n int) *recent { return &recent{ids: make(map[string]bool, n), ring: make([]string, n)} }

func (s *recent) has(id string) bool { return s.ids[id] }

func (s *recent) add(id string) {
	if s.ids[id] {
		return
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.ids, old)
	}
	s.ring[s.next] = id
	s.ids[id] = true
	s.next = (s.next + 1) % len(s.ring)
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
