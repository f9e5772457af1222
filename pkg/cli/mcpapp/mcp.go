// Package mcpapp is fleet-mcp: an MCP server over stdio for one entity,
// the chapter's "MCP pull" for mains and orchestrators. Each tool is one
// of the socket ops the short commands use (send, reply, ask, answer,
// receive, roster, status, broadcast, whoami, spawn, stop, trace), with a
// title, annotations, a schema with its bounds, and a
// description an LLM can follow; new mail is surfaced as a resource the
// server marks updated. It lives apart from pkg/cli so that fleet-send and
// the other short commands do not link the MCP SDK.
package mcpapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/version"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	ucli "github.com/urfave/cli/v2"
)

// NewMCPApp is fleet-mcp.
func NewMCPApp() *ucli.App {
	app := fleetcli.NewApp("fleet-mcp", "an MCP server over stdio for one entity: send, reply, ask, answer, receive, roster, status, broadcast, whoami, spawn, stop, trace as tools")
	app.UsageText = "fleet-mcp [--as NAME] [options]"
	app.Description = "Serves the Model Context Protocol on stdin and stdout for one entity, whose credential " +
		"comes from FLEET_TOKEN or --as NAME; an MCP client (an agent such as Claude Code) starts it. " +
		"Every tool is a request to the local gateway, as the short commands make: send (optionally waiting " +
		"for the reply), wait_reply, reply, ask, answer, receive, roster, status, broadcast, whoami, spawn, stop, trace. " +
		"Each tool has a title and annotations (roster, status, whoami and trace are read-only; stop is destructive), " +
		"and its input schema carries the bounds and defaults the gateway holds it to (a name's pattern, the body " +
		"limit, the waits); an argument out of bounds is a usage (64) tool error. A blocking call (send with " +
		"wait_for_reply, wait_reply, ask) waits 45 seconds by default, which ends before the shortest default client " +
		"tool timeout (Codex's tool_timeout_sec, 60 seconds), with a result or an error that says what to call next. Tool " +
		"errors carry the kind and exit code the commands would exit with. Output is bounded: receive takes " +
		"whole messages up to max_messages and max_bytes and acknowledges only what it returns; replies and " +
		"answers are cut at max_bytes. New mail is surfaced by the resource fleet://inbox, which the server " +
		"marks updated (to subscribed clients) when mail comes or is taken, checked every --poll; every tool result " +
		"also says how much mail waits. The credential and the gateway are checked before serving: no " +
		"credential or a refused one exits 77, no gateway 69, and the error names the variables looked for and how " +
		"each MCP client passes them (Gemini CLI passes FLEET_TOKEN only when its entry's env names it). " +
		"fleet-roster hooks install claude|codex|gemini|opencode --mcp NAME writes the entry fleet-mcp --as NAME into Claude Code's, " +
		"Codex's, Gemini CLI's or OpenCode's own configuration, with the tool timeouts and approval settings that fit (fleet-roster(1))."
	app.Flags = append(fleetcli.ConnFlags(), fleetcli.AsFlag(),
		&ucli.DurationFlag{Name: "poll", Value: 2 * time.Second, Usage: "how often to check the inbox for new mail (the fleet://inbox resource)"},
	)
	app.Action = run
	return app
}

func run(c *ucli.Context) error {
	if c.NArg() > 0 {
		return fleetcli.Usage("fleet-mcp takes no arguments, got %q", c.Args().First()).
			WithHint("the MCP client starts it: fleet-mcp --as NAME")
	}
	if p := c.Duration("poll"); p < 100*time.Millisecond {
		return fleetcli.Usage("--poll must be at least 100ms, got %v", p)
	}
	cfg, token, err := fleetcli.Credential(c)
	if err != nil {
		return noCredentialFile(err, c.String("as"), c.IsSet("state-dir"))
	}
	if token == "" {
		return noCredential()
	}
	s := &server{cfg: cfg, token: token}
	// Checked before serving: an MCP client shows a server that failed to
	// start, with its stderr, while a server that starts with a bad
	// credential would only fail each tool call.
	if err := s.hello(); err != nil {
		return err
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "fleet", Title: "fleet messaging", Version: version.Version},
		&mcp.ServerOptions{
			Instructions: s.instructions(),
			Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
			// subscriptions are the SDK's to keep; nothing to set up here
			SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
			UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		})
	s.inbox = newWatcher(s)
	// what waits at the start is the baseline: mail that comes before the
	// first poll is a change too
	s.inbox.last, s.inbox.known = seenOf(&s.me), true
	defer s.inbox.close()
	s.addTools()
	s.addResources()

	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	go s.inbox.run(ctx, c.Duration("poll"))
	err = s.mcp.Run(ctx, &mcp.StdioTransport{})
	if err == nil || c.Context.Err() != nil || errors.Is(err, context.Canceled) {
		return nil // the client closed stdin, or a signal: a clean end
	}
	return fault.Wrap(fault.Unavailable, fault.KindProtocol, err, "the MCP session ended")
}

// server is one entity's MCP server.
type server struct {
	cfg   *config.Config
	token string
	me    api.EntityRow // who the credential names, as of the start
	gw    api.Hello     // the gateway's greeting: its host and body limit
	mcp   *mcp.Server
	inbox *watcher
}

// hello checks the gateway and the credential, and learns who this is.
func (s *server) hello() error {
	cl, err := s.dial()
	if err != nil {
		return noGateway(err)
	}
	defer cl.Close()
	resp, err := cl.Call(&api.WhoamiRequest{})
	if err != nil {
		return err
	}
	s.me = *resp.Entity
	s.gw = cl.Hello
	return nil
}

// dial opens a connection to the gateway for one tool call. One per call:
// the ops that hold a connection open (a wait, an ask, a receive) use it
// whole, tool calls may run at once, and a gateway restarted between calls
// is simply dialed again.
func (s *server) dial() (*api.Client, error) {
	cl, err := fleetcli.DialGateway(s.cfg) // the socket the gateway recorded, when the guessed one has none
	if err != nil {
		return nil, err
	}
	cl.Token = s.token
	return cl, nil
}

func (s *server) instructions() string {
	return fmt.Sprintf("You are the entity %s@%s on fleet, a messaging fabric between AI agents, scripts and people "+
		"on one or many hosts. Address others by NAME, NAME@HOST or gid (the roster tool lists them). "+
		"Mail to you waits in your inbox until you take it with receive; every tool result says how much waits "+
		"(inbox), and the resource %s changes when new mail comes. An ASK is a live question with a deadline: "+
		"answer it with answer before it expires. To delegate and wait, use send with wait_for_reply; if it "+
		"returns outcome ask_arrived, answer that ask, then call wait_reply with the same msg_id. "+
		"To start or stop other entities use spawn and stop; to see where a flow went, trace with its trace_id. "+
		"Failed calls say the error kind and exit code, e.g. unknown_recipient (67).",
		s.me.Name, s.me.Host, inboxURI)
}

// toolError is a fault as a tool error's text: "KIND (EXIT): message —
// hint: next step", the kind and code the short commands would exit with.
// hint, when given, replaces the gateway's, which may name a command where
// a tool fits better.
func toolError(err error, hint string) error {
	if hint == "" {
		hint = mcpHint(err)
	}
	text := fmt.Sprintf("%s (%d): %s", fault.KindOf(err), fault.CodeOf(err), err.Error())
	if hint != "" {
		text += " — hint: " + hint
	}
	return errors.New(text)
}

// mcpHint is the gateway's hint, with the commands that have a tool here
// named as that tool (a "did you mean" in it kept).
func mcpHint(err error) string {
	h := fault.HintOf(err)
	if h == "" && !cliHint[fault.KindOf(err)] {
		// the kind's own next step
		h = fault.HintFor(err, "fleet-mcp")
	}
	switch {
	case fault.KindOf(err) == fault.KindInboxBusy:
		return "another fleet-recv or receive is draining this inbox; try again when it is done"
	case strings.Contains(h, "fleet-send --wait-reply"):
		return "" // said by the tool itself, with wait_reply
	}
	h = toolHints.Replace(h)
	for _, r := range toolHintRes {
		h = r.re.ReplaceAllString(h, r.to)
	}
	return h
}

// cliHint are the kinds whose default hint speaks of a command line (its
// --help, its arguments, stdin, its version): a tool's schema and its
// error say it here.
var cliHint = map[fault.Kind]bool{
	fault.KindUsage: true, fault.KindEmptyBody: true, fault.KindBadUTF8: true, fault.KindBodyTooLarge: true,
	fault.KindBadFrame: true, fault.KindProtocol: true,
}

// toolHintRes name the control commands' tools in a gateway's hint.
var toolHintRes = []struct {
	re *regexp.Regexp
	to string
}{
	{regexp.MustCompile(`fleet-roster --host ([^\s;,)]+)`), "the roster tool (host $1)"},
	{regexp.MustCompile(`fleet-stop ([^\s;,)]+)`), "the stop tool (target $1)"},
	{regexp.MustCompile(`fleet-spawn --request-id ([^)\s]+)`), "spawn with request_id $1"},
}

var toolHints = strings.NewReplacer(
	"list entities with: fleet-roster", "list entities with the roster tool",
	"fleet-roster lists the groups", "the roster tool lists the groups",
	"fleet-roster lists each entity's groups", "the roster tool lists each entity's groups",
	"did you mean --group ", "did you mean group ",
)
