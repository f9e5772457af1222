// Package hooks installs fleet's turn-hook recipes into the agent CLIs'
// own settings — Claude Code, Codex CLI, Gemini CLI; OpenCode's is a
// plugin file in its plugin folder (opencode.go), Copilot CLI's a hook
// file of its own in its hook folder (copilot.go) — and reports what
// still keeps them from running (the CLI not found, fleet-turn not on
// PATH, Codex's hook trust, Gemini's environment redaction). It merges:
// what a user wrote in those files stays, an install twice changes
// nothing, and Remove takes out only the hooks whose command is
// fleet-turn's.
package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/fleetd/fleet/pkg/private"
	recipes "github.com/fleetd/fleet/scripts/hooks"
)

// A CLI is one agent CLI fleet has a recipe for.
type CLI struct {
	Name    string // claude, codex, gemini, opencode, copilot
	Program string // its executable
	recipe  []byte
	// file is the settings file the recipe goes into: the user's, or with
	// project set that folder's
	file func(home, project string) string
}

// CLIs are the CLIs with a recipe.
var CLIs = []*CLI{
	{Name: "claude", Program: "claude", recipe: recipes.Claude, file: func(home, project string) string {
		if project != "" {
			return filepath.Join(project, ".claude", "settings.json")
		}
		return filepath.Join(home, ".claude", "settings.json")
	}},
	{Name: "codex", Program: "codex", recipe: recipes.Codex, file: func(home, project string) string {
		if project != "" {
			return filepath.Join(project, ".codex", "hooks.json")
		}
		return filepath.Join(codexHome(home), "hooks.json")
	}},
	{Name: "gemini", Program: "gemini", recipe: recipes.Gemini, file: func(home, project string) string {
		if project != "" {
			return filepath.Join(project, ".gemini", "settings.json")
		}
		return filepath.Join(home, ".gemini", "settings.json")
	}},
	{Name: "opencode", Program: "opencode", recipe: recipes.OpenCode, file: func(home, project string) string {
		if project != "" {
			return filepath.Join(project, ".opencode", "plugins", openCodePlugin)
		}
		return filepath.Join(openCodeConfig(home), "plugins", openCodePlugin)
	}},
	{Name: "copilot", Program: "copilot", recipe: recipes.Copilot, file: func(home, project string) string {
		if project != "" {
			return filepath.Join(project, ".github", "hooks", copilotHooksFile)
		}
		return filepath.Join(copilotHome(home), "hooks", copilotHooksFile)
	}},
}

// Find returns the CLI called name.
func Find(name string) (*CLI, error) {
	for _, c := range CLIs {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("no recipe for %q: the CLIs are claude, codex, gemini, opencode and copilot", name)
}

func codexHome(home string) string {
	if h := os.Getenv("CODEX_HOME"); h != "" {
		return h
	}
	return filepath.Join(home, ".codex")
}

// File is the settings file the recipe goes into.
func (c *CLI) File(home, project string) string { return c.file(home, project) }

// ours says whether a hook command is fleet's: fleet-turn, or fleet-recv
// as a hook (hook delivery mode).
func ours(command string) bool {
	f := strings.Fields(command)
	if len(f) == 0 {
		return false
	}
	switch filepath.Base(f[0]) {
	case "fleet-turn":
		return true
	case "fleet-recv":
		return slices.Contains(f[1:], "--hook")
	}
	return false
}

// The redaction allow-list entries the Gemini recipe adds that only fleet
// uses (Remove takes these out; TMUX and XDG_* may be the user's).
var fleetOnlyAllowed = []string{"FLEET_TOKEN", "FLEET_SOCKET", "FLEET_HOST", "FLEET_STATE_DIR", "TMUX_PANE"}

// settings is a settings file as JSON objects (the keys fleet does not
// know are kept as they were).
type settings map[string]any

// load reads a settings file: numbers kept as written (json.Number), an
// absent or empty file an empty object.
func load(path string) (settings, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || err == nil && len(bytes.TrimSpace(b)) == 0 {
		return settings{}, nil
	}
	if err != nil {
		return nil, err
	}
	var s settings
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%s is not a JSON object: %v", path, err)
	}
	if s == nil {
		s = settings{}
	}
	return s, nil
}

// encode is s as the file holds it: indented, & < > as written.
func (s settings) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(s)
	return b.Bytes(), err
}

// save writes s to path when it differs from what is there: through a
// symlink to the file it names (a dotfile manager's link stays a link),
// with the file's own mode (0600 for a new one), by a temporary file of
// its own renamed into place.
func (s settings) save(path string) error {
	b, err := s.encode()
	if err != nil {
		return err
	}
	return writeKeeping(path, b)
}

// writeKeeping writes b to path as save does: only when it differs, through
// a symlink, with the file's own mode (0600 for a new one).
func writeKeeping(path string, b []byte) error {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	mode := os.FileMode(0o600)
	if old, err := os.ReadFile(path); err == nil {
		if bytes.Equal(old, b) {
			return nil
		}
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return private.WriteFile(path, b, mode)
}

// object returns s[key] as an object, made if missing.
func (s settings) object(key string) (map[string]any, error) {
	v, ok := s[key]
	if !ok || v == nil {
		m := map[string]any{}
		s[key] = m
		return m, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%q is not an object", key)
	}
	return m, nil
}

// strip takes fleet-turn's hooks out of a hooks object; it returns how
// many groups it removed.
func strip(hooks map[string]any) int {
	n := 0
	for event, v := range hooks {
		groups, ok := v.([]any)
		if !ok {
			continue
		}
		kept := groups[:0:0]
		for _, g := range groups {
			if isOurs(g) {
				n++
				continue
			}
			kept = append(kept, g)
		}
		if len(kept) == 0 {
			delete(hooks, event)
		} else {
			hooks[event] = kept
		}
	}
	return n
}

// isOurs: a matcher group whose every hook runs fleet-turn.
func isOurs(g any) bool {
	m, ok := g.(map[string]any)
	if !ok {
		return false
	}
	hs, ok := m["hooks"].([]any)
	if !ok || len(hs) == 0 {
		return false
	}
	for _, h := range hs {
		hm, ok := h.(map[string]any)
		if !ok {
			return false
		}
		cmd, _ := hm["command"].(string)
		if !ours(cmd) {
			return false
		}
	}
	return true
}

// commands are the commands of the hooks in groups.
func commands(groups []any) []string {
	var out []string
	for _, g := range groups {
		m, _ := g.(map[string]any)
		hs, _ := m["hooks"].([]any)
		for _, h := range hs {
			hm, _ := h.(map[string]any)
			if cmd, ok := hm["command"].(string); ok {
				out = append(out, cmd)
			}
		}
	}
	return out
}

// Install merges c's recipe into its settings file (the user's, or the
// project's) and returns the file's path. Installing twice changes
// nothing; a user's own hooks and settings stay.
func (c *CLI) Install(home, project string) (string, error) {
	path := c.File(home, project)
	if o, ok := ownFiles[c.Name]; ok {
		return path, o.install(path, c.recipe)
	}
	s, err := load(path)
	if err != nil {
		return path, err
	}
	var recipe settings
	if err := json.Unmarshal(c.recipe, &recipe); err != nil {
		return path, err
	}
	hooks, err := s.object("hooks")
	if err != nil {
		return path, fmt.Errorf("%s: %v", path, err)
	}
	strip(hooks)
	for event, groups := range recipe["hooks"].(map[string]any) {
		have, _ := hooks[event].([]any)
		hooks[event] = append(have, groups.([]any)...)
	}
	if sec, ok := recipe["security"].(map[string]any); ok {
		// Gemini: the variables fleet-turn needs, through its redaction
		want := sec["environmentVariableRedaction"].(map[string]any)["allowed"].([]any)
		mySec, err := s.object("security")
		if err != nil {
			return path, fmt.Errorf("%s: %v", path, err)
		}
		red, err := settings(mySec).object("environmentVariableRedaction")
		if err != nil {
			return path, fmt.Errorf("%s: security: %v", path, err)
		}
		allowed, _ := red["allowed"].([]any)
		for _, v := range want {
			if !slices.Contains(allowed, v) {
				allowed = append(allowed, v)
			}
		}
		red["allowed"] = allowed
	}
	return path, s.save(path)
}

// Remove takes fleet-turn's hooks (and, for Gemini, the allow-list entries
// only fleet uses) out of c's settings file; it says how many hook groups
// it removed.
func (c *CLI) Remove(home, project string) (string, int, error) {
	path := c.File(home, project)
	if o, ok := ownFiles[c.Name]; ok {
		n, err := o.remove(path)
		return path, n, err
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return path, 0, nil
	}
	s, err := load(path)
	if err != nil {
		return path, 0, err
	}
	n := 0
	if hooks, ok := s["hooks"].(map[string]any); ok {
		n = strip(hooks)
		if len(hooks) == 0 {
			delete(s, "hooks")
		}
	}
	if c.Name == "gemini" {
		if sec, ok := s["security"].(map[string]any); ok {
			if red, ok := sec["environmentVariableRedaction"].(map[string]any); ok {
				if allowed, ok := red["allowed"].([]any); ok {
					red["allowed"] = slices.DeleteFunc(allowed, func(v any) bool {
						str, _ := v.(string)
						return slices.Contains(fleetOnlyAllowed, str)
					})
				}
			}
		}
	}
	if n == 0 && c.Name != "gemini" {
		return path, 0, nil
	}
	return path, n, s.save(path)
}

// Status is what keeps c's recipe from running, or nothing.
type Status struct {
	CLI       string   `json:"cli"`
	File      string   `json:"file"`
	Installed []string `json:"installed"` // the events that have every command of the recipe's
	Missing   []string `json:"missing"`   // the recipe's events that lack one (an older install)
	Blockers  []string `json:"blockers"`  // what else stops them, each with what to do
	// MCP is fleet-mcp's entry in the CLI's MCP configuration (not part
	// of the hooks: missing is no blocker); nil where the CLI has none to
	// check (Codex with a project folder).
	MCP *MCPStatus `json:"mcp,omitempty"`
}

// OK says whether nothing is missing and nothing blocks.
func (s *Status) OK() bool { return len(s.Missing) == 0 && len(s.Blockers) == 0 }

// Check reads c's settings file and the machine: which of the recipe's
// events are installed, and what stops them.
func (c *CLI) Check(home, project string) (*Status, error) {
	st := &Status{CLI: c.Name, File: c.File(home, project), Installed: []string{}, Missing: []string{}, Blockers: []string{}}
	if c.Name == "opencode" {
		return c.openCodeCheck(st, home, project)
	}
	if c.Name == "copilot" {
		return c.copilotCheck(st, home, project)
	}
	s, err := load(st.File)
	if err != nil {
		return nil, err
	}
	var recipe settings
	json.Unmarshal(c.recipe, &recipe)
	hooks, _ := s["hooks"].(map[string]any)
	events := make([]string, 0)
	for event := range recipe["hooks"].(map[string]any) {
		events = append(events, event)
	}
	sort.Strings(events)
	for _, event := range events {
		groups, _ := hooks[event].([]any)
		have := commands(groups)
		want := commands(recipe["hooks"].(map[string]any)[event].([]any))
		if len(want) > 0 && !slices.ContainsFunc(want, func(c string) bool { return !slices.Contains(have, c) }) {
			st.Installed = append(st.Installed, event)
		} else {
			st.Missing = append(st.Missing, event)
		}
	}
	var usage *UsageError
	if m, err := c.CheckMCP(home, project, ""); err == nil {
		st.MCP = m
	} else if !errors.As(err, &usage) {
		st.MCP = &MCPStatus{State: "unreadable", Notes: []string{err.Error()}}
	}
	if len(st.Missing) > 0 {
		st.Blockers = append(st.Blockers, "not installed: fleet-roster hooks install "+c.Name)
	}
	if _, err := exec.LookPath(c.Program); err != nil {
		st.Blockers = append(st.Blockers, c.Program+" is not on PATH")
	}
	if _, err := exec.LookPath("fleet-turn"); err != nil {
		st.Blockers = append(st.Blockers, "fleet-turn is not on PATH: make install puts it beside the fleet commands")
	}
	switch c.Name {
	case "codex":
		if len(st.Installed) > 0 {
			if untrusted, err := codexUntrusted(home, st.File); err != nil {
				st.Blockers = append(st.Blockers, "cannot read Codex's hook trust: "+err.Error())
			} else if untrusted > 0 {
				st.Blockers = append(st.Blockers, fmt.Sprintf("Codex runs no hook it has not trusted (%d not trusted): trust them under /hooks in Codex, or: fleet-roster hooks install codex --trust", untrusted))
			}
		}
	case "gemini":
		sec, _ := s["security"].(map[string]any)
		red, _ := sec["environmentVariableRedaction"].(map[string]any)
		allowed, _ := red["allowed"].([]any)
		for _, v := range []string{"FLEET_TOKEN", "TMUX_PANE"} {
			if !slices.Contains(allowed, any(v)) {
				st.Blockers = append(st.Blockers, "Gemini redacts "+v+" from hooks when its environment redaction is on: fleet-roster hooks install gemini")
			}
		}
	}
	return st, nil
}
