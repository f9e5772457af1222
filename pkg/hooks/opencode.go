package hooks

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// OpenCode has no hook commands in a settings file: it loads every
// JavaScript file in its plugin folders (~/.config/opencode/plugins, a
// project's .opencode/plugins) as a plugin, and fleet's recipe is one such
// file, fleet.js (scripts/hooks/opencode-plugin.js), which runs fleet-turn
// and fleet-recv --hook opencode from OpenCode's plugin events. Install
// writes it, Remove deletes it when it is fleet's (it carries
// openCodeMark), Check compares it with the shipped one. fleet-mcp goes
// into opencode.json's "mcp" object (mcp.go).

// openCodePlugin is the plugin's file name in a plugin folder.
const openCodePlugin = "fleet.js"

// openCodeMark is the line that says a plugin file is fleet's.
var openCodeMark = []byte("// fleet-opencode-plugin ")

// openCodeEvents are the plugin events the recipe hooks, as the status
// lists them: all of them or none, the plugin being one file.
var openCodeEvents = []string{"chat.message", "event:session.status", "tool.execute.after", "tool.execute.before"}

// openCodeConfig is OpenCode's folder of the user's settings:
// $XDG_CONFIG_HOME/opencode, ~/.config/opencode.
func openCodeConfig(home string) string {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "opencode")
	}
	return filepath.Join(home, ".config", "opencode")
}

// ownFile is a CLI whose fleet hooks are a whole file of fleet's own
// (OpenCode's plugin, Copilot's hook file), not entries merged into the
// user's settings: ours tells fleet's file from another, what names it.
type ownFile struct {
	ours func([]byte) bool
	what string
}

// ownFiles are the CLIs installed as a file of their own.
var ownFiles = map[string]ownFile{
	"opencode": {func(b []byte) bool { return bytes.Contains(b, openCodeMark) }, "plugin"},
	"copilot":  {copilotOurs, "hook file"},
}

// install writes recipe at path (the same again changes nothing); a file
// of that name that is not fleet's stays, refused.
func (o ownFile) install(path string, recipe []byte) error {
	if have, err := os.ReadFile(path); err == nil && !o.ours(have) {
		return fmt.Errorf("%s is there and is not fleet's %s: move it away first", path, o.what)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return writeKeeping(path, recipe)
}

// remove deletes the file at path when it is fleet's; it says how many it
// removed (0 or 1).
func (o ownFile) remove(path string) (int, error) {
	have, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !o.ours(have) {
		return 0, nil
	}
	if err := os.Remove(path); err != nil {
		return 0, err
	}
	return 1, nil
}

// openCodeCheck fills st: the plugin installed as shipped (every event),
// or missing (no file, or an older one), and what blocks it.
func (c *CLI) openCodeCheck(st *Status, home, project string) (*Status, error) {
	have, err := os.ReadFile(st.File)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if bytes.Equal(have, c.recipe) {
		st.Installed = append(st.Installed, openCodeEvents...)
	} else {
		st.Missing = append(st.Missing, openCodeEvents...)
	}
	var usage *UsageError
	if m, err := c.CheckMCP(home, project, ""); err == nil {
		st.MCP = m
	} else if !errors.As(err, &usage) {
		st.MCP = &MCPStatus{State: "unreadable", Notes: []string{err.Error()}}
	}
	switch {
	case len(have) > 0 && !bytes.Contains(have, openCodeMark):
		st.Blockers = append(st.Blockers, st.File+" is not fleet's plugin: move it away, then fleet-roster hooks install opencode")
	case len(st.Missing) > 0 && len(have) > 0:
		st.Blockers = append(st.Blockers, "an older fleet plugin: fleet-roster hooks install opencode")
	case len(st.Missing) > 0:
		st.Blockers = append(st.Blockers, "not installed: fleet-roster hooks install opencode")
	}
	if _, err := exec.LookPath(c.Program); err != nil {
		st.Blockers = append(st.Blockers, c.Program+" is not on PATH")
	}
	for _, p := range []string{"fleet-turn", "fleet-recv"} {
		if _, err := exec.LookPath(p); err != nil {
			st.Blockers = append(st.Blockers, p+" is not on PATH: make install puts it beside the fleet commands")
		}
	}
	return st, nil
}
