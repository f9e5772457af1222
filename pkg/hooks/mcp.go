package hooks

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetd/fleet/pkg/ident"
)

// fleet-mcp in the agent CLIs' own MCP configuration: one entry named
// "fleet" that starts fleet-mcp acting as one entity. The entity's
// credential is never written into a client's file (a project's .mcp.json
// is committed and shared): the entry says --as NAME, and fleet-mcp reads
// NAME's owner-only credential file from the state folder, as every short
// command does with --as. Only the variables that say where the state
// folder and the socket are must reach it, which Claude Code and Gemini
// CLI pass as they are and Codex passes when its entry names them.

// MCPServer is the entry's name in every client.
const MCPServer = "fleet"

// MCPTools are fleet-mcp's tools, by the names a client's per-tool
// settings take (pkg/cli/mcpapp defines them; its test checks this list).
var MCPTools = []string{"send", "wait_reply", "reply", "ask", "answer", "receive", "roster", "status", "broadcast", "whoami", "spawn", "stop", "trace"}

// MCPToolTimeout is the tool-call limit, in seconds, the installer sets in
// the clients whose default is shorter than fleet-mcp's longest wait (900 s,
// any tool's timeout_seconds or wait_seconds): Codex (tool_timeout_sec, 60 s
// by default) and Gemini CLI (timeout, 10 minutes). A minute above it, so
// fleet-mcp's own timeout, which says what to call next, comes first.
const MCPToolTimeout = 960

// codexEnvVars are the variables Codex passes on to fleet-mcp besides its
// own few (HOME, PATH, USER, ...): those that choose the state folder (and
// so the credential file), the socket and the config file. FLEET_TOKEN is
// not among them: the entry names the entity with --as.
var codexEnvVars = []string{"FLEET_SOCKET", "FLEET_STATE_DIR", "FLEET_CONFIG", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME"}

// MCPOptions is what an install writes beyond the entity.
type MCPOptions struct {
	Entity string
	// Approve names the tools Codex runs without asking ("all" for every
	// one); by default it asks before each use of a tool that is not
	// read-only (default_tools_approval_mode = "writes").
	Approve []string
	// Force replaces an entry named fleet that differs from fleet's.
	Force bool
}

// check refuses what cannot go into a client's file.
func (o MCPOptions) check(cli string) error {
	if !ident.ValidName(o.Entity) {
		return &UsageError{fmt.Sprintf("--mcp %q is not an entity name (a letter, then up to 63 letters, digits, '-' or '_')", o.Entity)}
	}
	if len(o.Approve) > 0 && cli != "codex" {
		return &UsageError{"--approve is for codex (Claude Code and Gemini CLI ask for approval in their own ways: their permission settings)"}
	}
	for _, t := range o.Approve {
		if t != "all" && !slices.Contains(MCPTools, t) {
			return &UsageError{fmt.Sprintf("--approve %q is not a fleet-mcp tool: all, or %s", t, strings.Join(MCPTools, ", "))}
		}
	}
	return nil
}

// A UsageError is a request the installer refuses before reading a file.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// A DiffersError is an entry named fleet that is not what fleet would
// write: the user's, kept unless they say --force.
type DiffersError struct {
	File string
	Have string // the entry as it is, in the file's own syntax (one line for JSON)
}

func (e *DiffersError) Error() string {
	return fmt.Sprintf("%s already has an MCP server named %s that differs from the one asked for: %s", e.File, MCPServer, e.Have)
}

// An UneditableError is a fleet entry written in a form the installer does
// not edit (Codex: dotted keys or an inline table instead of a table).
type UneditableError struct{ File, Why string }

func (e *UneditableError) Error() string { return e.File + ": " + e.Why }

// MCPStatus is the state of the fleet entry in a client's file.
type MCPStatus struct {
	File   string   `json:"file"`
	State  string   `json:"state"`            // present, missing, or differs
	Entity string   `json:"entity,omitempty"` // the entity it acts as (--as), when it names one
	Notes  []string `json:"notes"`            // advice, for an entry that is there: what the installer does not set
}

// MCPFile is the file the client reads its MCP servers from: the user's,
// or with project set that folder's.
func (c *CLI) MCPFile(home, project string) (string, error) {
	switch c.Name {
	case "claude":
		if project != "" {
			return filepath.Join(project, ".mcp.json"), nil
		}
		if d := os.Getenv("CLAUDE_CONFIG_DIR"); d != "" {
			return filepath.Join(d, ".claude.json"), nil
		}
		return filepath.Join(home, ".claude.json"), nil
	case "codex":
		if project != "" {
			return "", &UsageError{"Codex reads its MCP servers from the user's config.toml ($CODEX_HOME, ~/.codex): install without --project"}
		}
		return filepath.Join(codexHome(home), "config.toml"), nil
	case "opencode":
		if project != "" {
			return filepath.Join(project, "opencode.json"), nil
		}
		return filepath.Join(openCodeConfig(home), "opencode.json"), nil
	case "copilot":
		if project != "" {
			return "", &UsageError{"Copilot CLI's MCP servers are the user's (~/.copilot/mcp-config.json): install without --project"}
		}
		return filepath.Join(copilotHome(home), "mcp-config.json"), nil
	default:
		return c.File(home, project), nil
	}
}

// mcpEntry is the JSON entry fleet writes for a JSON client.
func (c *CLI) mcpEntry(entity string) map[string]any {
	if c.Name == "opencode" {
		// OpenCode's local server: the command and its arguments in one
		// list, enabled (its default) said outright
		return map[string]any{"type": "local", "command": []any{"fleet-mcp", "--as", entity}, "enabled": true}
	}
	e := map[string]any{"command": "fleet-mcp", "args": []any{"--as", entity}}
	switch c.Name {
	case "claude":
		e["type"] = "stdio" // as claude mcp add writes it
	case "gemini":
		e["timeout"] = MCPToolTimeout * 1000 // milliseconds
	case "copilot":
		// a local (stdio) server, every one of its tools offered
		e["type"], e["tools"] = "local", []any{"*"}
	}
	return e
}

// canonical is v as sorted, compact JSON: two entries are the same when
// their canonical forms are.
func canonical(v any) string {
	b, _ := json.Marshal(v)
	var x any
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	dec.Decode(&x)
	b, _ = json.Marshal(x)
	return string(b)
}

// entityOf is the NAME of an entry's --as NAME (or --as=NAME), if any.
func entityOf(args []any) string {
	for i, a := range args {
		s, _ := a.(string)
		if v, ok := strings.CutPrefix(s, "--as="); ok {
			return v
		}
		if s == "--as" && i+1 < len(args) {
			v, _ := args[i+1].(string)
			return v
		}
	}
	return ""
}

// isFleetMCP says whether an entry's command is fleet-mcp (OpenCode's: a
// list, fleet-mcp first).
func isFleetMCP(command any) bool {
	if l, ok := command.([]any); ok && len(l) > 0 {
		command = l[0]
	}
	s, _ := command.(string)
	return filepath.Base(s) == "fleet-mcp"
}

// serversKey is the key of the MCP servers' object in a JSON client's
// file: OpenCode's "mcp", the others' "mcpServers".
func (c *CLI) serversKey() string {
	if c.Name == "opencode" {
		return "mcp"
	}
	return "mcpServers"
}

// entryArgs are an entry's arguments: its args, or (OpenCode) its
// command list after the program.
func entryArgs(m map[string]any) []any {
	if l, ok := m["command"].([]any); ok && len(l) > 0 {
		return l[1:]
	}
	args, _ := m["args"].([]any)
	return args
}

// InstallMCP writes the fleet entry into the client's MCP configuration
// and says whether the file changed. The user's other servers and
// settings stay; an entry named fleet that differs is refused
// (*DiffersError) unless o.Force.
func (c *CLI) InstallMCP(home, project string, o MCPOptions) (string, bool, error) {
	if err := o.check(c.Name); err != nil {
		return "", false, err
	}
	path, err := c.MCPFile(home, project)
	if err != nil {
		return "", false, err
	}
	if c.Name == "codex" {
		changed, err := codexInstallMCP(path, o)
		return path, changed, err
	}
	s, err := load(path)
	if err != nil {
		return path, false, err
	}
	servers, err := s.object(c.serversKey())
	if err != nil {
		return path, false, fmt.Errorf("%s: %v", path, err)
	}
	want := c.mcpEntry(o.Entity)
	if have, ok := servers[MCPServer]; ok {
		if canonical(have) == canonical(want) {
			return path, false, nil
		}
		if !o.Force {
			return path, false, &DiffersError{File: path, Have: canonical(have)}
		}
	}
	servers[MCPServer] = want
	return path, true, s.save(path)
}

// RemoveMCP takes the fleet entry out of the client's MCP configuration
// when it runs fleet-mcp (an entry named fleet that runs anything else is
// the user's, and stays); it says whether it removed one.
func (c *CLI) RemoveMCP(home, project string) (string, bool, error) {
	path, err := c.MCPFile(home, project)
	if err != nil {
		return "", false, err
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return path, false, nil
	}
	if c.Name == "codex" {
		removed, err := codexRemoveMCP(path)
		return path, removed, err
	}
	s, err := load(path)
	if err != nil {
		return path, false, err
	}
	servers, _ := s[c.serversKey()].(map[string]any)
	have, _ := servers[MCPServer].(map[string]any)
	if have == nil || !isFleetMCP(have["command"]) {
		return path, false, nil
	}
	delete(servers, MCPServer)
	return path, true, s.save(path)
}

// CheckMCP reads the client's MCP configuration: whether the fleet entry
// is there as fleet writes it (for entity, or when entity is "" for the
// entity it names), and what the installer cannot set for the user.
func (c *CLI) CheckMCP(home, project, entity string) (*MCPStatus, error) {
	path, err := c.MCPFile(home, project)
	if err != nil {
		return nil, err
	}
	st := &MCPStatus{File: path, State: "missing", Notes: []string{}}
	if c.Name == "codex" {
		have, err := codexFleetEntry(path)
		if err != nil {
			return nil, err
		}
		if have != nil {
			args, _ := have["args"].([]any)
			st.Entity = entityOf(args)
			name := entity
			if name == "" {
				name = st.Entity
			}
			st.State = "differs"
			if name != "" && ident.ValidName(name) && codexMatches(have, name) {
				st.State = "present"
			}
		}
		if st.State == "missing" {
			return st, nil // no advice for an entry not wanted
		}
		st.Notes = append(st.Notes, "Codex asks before each use of a tool that is not read-only (default_tools_approval_mode = \"writes\") unless you approve tools: fleet-roster hooks install codex --mcp NAME --approve TOOL,... (or all)")
		return st, nil
	}
	s, err := load(path)
	if err != nil {
		return nil, err
	}
	servers, _ := s[c.serversKey()].(map[string]any)
	if have, ok := servers[MCPServer]; ok {
		m, _ := have.(map[string]any)
		st.Entity = entityOf(entryArgs(m))
		name := entity
		if name == "" {
			name = st.Entity
		}
		st.State = "differs"
		if name != "" && canonical(have) == canonical(c.mcpEntry(name)) {
			st.State = "present"
		}
	}
	switch {
	case st.State == "missing": // no advice for an entry not wanted
	case c.Name == "claude":
		if !claudeToolSearchOff(home) {
			st.Notes = append(st.Notes, "Claude Code's tool search (on by default) lists fleet's tools by name only until the model searches for them; "+
				"to offer them whole, set ENABLE_TOOL_SEARCH=false in the environment or in the \"env\" of ~/.claude/settings.json")
		}
	case c.Name == "gemini":
		st.Notes = append(st.Notes, "Gemini CLI asks before each MCP tool call unless the server is trusted (\"trust\": true in its entry) or you allow it when asked")
	case c.Name == "opencode":
		if _, err := os.Stat(strings.TrimSuffix(path, ".json") + ".jsonc"); err == nil {
			st.Notes = append(st.Notes, "OpenCode reads opencode.jsonc as well as opencode.json: a \"fleet\" entry in the .jsonc file is not the installer's to edit")
		}
	}
	return st, nil
}

// claudeToolSearchOff says whether Claude Code's tool search is off for
// this user: ENABLE_TOOL_SEARCH=false in the environment or in the env of
// the user's settings.json.
func claudeToolSearchOff(home string) bool {
	if v, ok := os.LookupEnv("ENABLE_TOOL_SEARCH"); ok {
		return strings.EqualFold(v, "false") || v == "0"
	}
	dir := filepath.Join(home, ".claude")
	if d := os.Getenv("CLAUDE_CONFIG_DIR"); d != "" {
		dir = d
	}
	s, err := load(filepath.Join(dir, "settings.json"))
	if err != nil {
		return false
	}
	env, _ := s["env"].(map[string]any)
	v, _ := env["ENABLE_TOOL_SEARCH"].(string)
	return strings.EqualFold(v, "false") || v == "0"
}
