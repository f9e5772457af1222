package docs

import (
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// A section is a page's reference text beyond its commands and flags:
// paragraphs (separated by a blank line); a paragraph whose lines all
// start with two spaces is shown as code.
type section struct {
	Title string
	Text  string
}

// sections are the extra sections of each page, before ENVIRONMENT.
var sections = map[string][]section{
	"fleet-roster": {{"MCP CLIENTS", mcpClients}},
	"fleet-mcp":    {{"MCP CLIENTS", mcpClients}},
	"fleet-top":    {{"ASKS, INBOX AND TEXT", topText}, {"THE LIBRARY", topLibrary}},
}

// topText is what of a message's text fleet-top may show, and where.
const topText = `The open asks are the gateway's own list (socket op asks): the asks an entity of this host put and still waits on, and the asks put to an entity of this host from another host that were delivered and neither answered nor expired; an ask between two entities of this host is listed once. Each shows its ids, asker, askee, size, when it was opened and its deadline. Like the watch stream, the list never carries text, but for the asks put to the --as entity: their question shows in the pane, and a answers it.

The INBOX pane (with --as only) shows the text of the messages stored in that entity's own inbox while fleet-top runs, as the watch stream gives it to the entity's own credential (fleet-roster --watch --text); no other entity's text is ever sent to fleet-top. s there replies to the selected message; the message stays in the inbox for fleet-recv.

How long an entity has had its status is the gateway's status_since (fleet-json(7)). Another host's row has it when that host's signed presence carries it, for idle and busy; a row read stale or unknown shows -.`

// topLibrary is why fleet-top is built on Bubble Tea.
const topLibrary = `fleet-top is built on Bubble Tea v2 (charm.land/bubbletea/v2 v2.1.1) with Lip Gloss v2 and Bubbles v2 (v2.1.1), rather than tview v0.42.0 or Bubble Tea's v1 line. Bubble Tea is one loop over one model: every input (a key, a resize, a watch event, a gateway's answer) is a message to one Update, and one View returns the whole screen as a string, so the screen is a function of the model, its formatting is tested without a terminal, and a stream of events fits in as just more messages. tview keeps its widgets' state and draws from its own goroutine, which suits forms more than a view fed by a stream. v2 is the line that is maintained; its renderer writes only the cells that changed, follows every resize and lowers colour to what the terminal has. Its cost: the three modules and their dependencies are linked into fleet-top alone (pkg/cli/topapp), never into the short commands.`

// mcpClients is the reference of fleet-roster hooks install --mcp: what
// it writes into each agent CLI, and what it cannot do.
const mcpClients = `fleet-roster hooks install claude|codex|gemini|opencode|copilot --mcp NAME writes, instead of the turn hooks, the CLI's own MCP server entry named fleet, which starts fleet-mcp --as NAME. The entity is registered first (fleet-roster join NAME --mode pull).

Claude Code: the user's ~/.claude.json ($CLAUDE_CONFIG_DIR/.claude.json when that is set), or with --project DIR the folder's .mcp.json, gets mcpServers.fleet:

  {"type": "stdio", "command": "fleet-mcp", "args": ["--as", "NAME"]}

Gemini CLI: settings.json (~/.gemini, or DIR/.gemini) gets mcpServers.fleet with "timeout": 960000 (milliseconds) beside command and args.

OpenCode: opencode.json ($XDG_CONFIG_HOME/opencode, ~/.config/opencode, or with --project DIR the folder's own) gets mcp.fleet, a local server:

  {"type": "local", "command": ["fleet-mcp", "--as", "NAME"], "enabled": true}

GitHub Copilot CLI: ~/.copilot/mcp-config.json ($COPILOT_HOME when that is set) gets mcpServers.fleet, a local server offering all its tools; Copilot reads the user's file only, so --project is refused for copilot --mcp:

  {"type": "local", "command": "fleet-mcp", "args": ["--as", "NAME"], "tools": ["*"]}

Codex: $CODEX_HOME/config.toml (~/.codex) gets a table of its own:

  [mcp_servers.fleet]
  command = "fleet-mcp"
  args = ["--as", "NAME"]
  env_vars = ["FLEET_SOCKET", "FLEET_STATE_DIR", "FLEET_CONFIG", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME"]
  tool_timeout_sec = 960
  default_tools_approval_mode = "writes"

Codex reads MCP servers from the user's config.toml only: --project is refused for codex --mcp.

The credential. No token is written into any client's file, so a project's .mcp.json can be committed and shared. The entry names the entity with --as, and fleet-mcp reads the entity's owner-only (0600) credential file from the state folder, where fleet-roster join saved it, as every short command does with --as. What must reach fleet-mcp is only where the state folder, the socket and the config file are: Claude Code and Gemini CLI pass their environment (Gemini less the variables named *TOKEN*, *KEY*, *SECRET*, ..., which --as does not need); Codex passes a server only HOME, PATH, USER and a few more, so its entry names the others in env_vars (each is passed when it is set).

Timeouts. 960 seconds is a minute above fleet-mcp's longest wait (900 s, any tool's timeout_seconds or wait_seconds), so fleet-mcp's own timeout, whose error says what to call next, ends a long wait before the client gives up: Codex's default tool_timeout_sec is 60 s, Gemini CLI's 10 minutes. Claude Code's (MCP_TOOL_TIMEOUT, about 28 hours) is left alone.

Approval. Codex 0.169 with default_tools_approval_mode = "writes" runs the read-only tools (roster, status, whoami, trace: readOnlyHint) without asking; the others (send, wait_reply, reply, ask, answer, receive, broadcast, spawn, stop) need approval: the TUI asks before each use; codex exec, which cannot ask, runs with approval never and refuses those calls ("MCP tool call requires approval, but approval policy is never") unless the sandbox is danger-full-access, where nothing needs approval. --approve TOOLS (comma-separated) adds, for each, [mcp_servers.fleet.tools.TOOL] with approval_mode = "approve"; --approve all sets default_tools_approval_mode = "approve". Claude Code and Gemini CLI ask through their own permission settings (Claude's allowedTools, e.g. mcp__fleet; Gemini's "trust" on the entry, or --yolo), which the installer leaves to the user.

Merging. The user's other servers and settings stay. config.toml is edited as text: fleet's tables ([mcp_servers.fleet] and those below it) are cut out or put in whole, every byte outside them stays as it was, and the result is parsed back and compared before it is written. Installing twice changes nothing. An entry named fleet that differs from the one asked for (another command, another entity, settings of the user's) is refused (exit 77) unless --force replaces it; a new --approve replaces fleet's own Codex entry. A Codex entry written as dotted keys or an inline table is refused (77): rewrite it as a table. A file that does not parse exits 65. hooks remove CLI --mcp takes out the entry named fleet when its command is fleet-mcp, and nothing else.

Status. hooks status reads the entry: present (as NAME), missing or differs, and for an entry that is there notes what the installer does not set. Claude Code's tool search, on by default, shows the model fleet's tools by name only until the model searches for them; ENABLE_TOOL_SEARCH=false in the environment or in the "env" of ~/.claude/settings.json offers them whole. status says so while it is not set; nothing writes it.

What reaches the model is the tool results (each says how much mail waits). The fleet://inbox resource's updates reach no model in the three CLIs today: to have a waiting agent notice mail, use hook delivery (fleet-roster join --mode hook, fleet-recv --hook) or let it call receive with wait_seconds.`

func writeSections(b *strings.Builder, app *ucli.App) {
	for _, s := range sections[app.Name] {
		fmt.Fprintf(b, ".SH %s\n", s.Title)
		for _, para := range strings.Split(s.Text, "\n\n") {
			lines := strings.Split(para, "\n")
			code := true
			for _, l := range lines {
				code = code && strings.HasPrefix(l, "  ")
			}
			if code {
				b.WriteString(".PP\n.RS 4\n.EX\n")
				for _, l := range lines {
					b.WriteString(roffCode(strings.TrimPrefix(l, "  ")) + "\n")
				}
				b.WriteString(".EE\n.RE\n")
				continue
			}
			fmt.Fprintf(b, ".PP\n%s\n", roffText(strings.Join(lines, " ")))
		}
		b.WriteString("\n")
	}
}
