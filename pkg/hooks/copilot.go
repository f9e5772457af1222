package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
)

// GitHub Copilot CLI reads every *.json file in its hook folders
// (~/.copilot/hooks, $COPILOT_HOME/hooks; a project's .github/hooks) and
// runs all their hooks. Its entries are flat ({"type": "command", "bash":
// CMD}), not Claude's matcher groups, so fleet's recipe is a file of its
// own, fleet.json (scripts/hooks/copilot-hooks.json): Install writes it,
// Remove deletes it when it is fleet's (every hook in it runs fleet-turn
// or fleet-recv --hook), Check compares its events with the shipped one's.
// fleet-mcp goes into ~/.copilot/mcp-config.json (mcp.go).

// copilotHooksFile is the recipe's file name in a hook folder.
const copilotHooksFile = "fleet.json"

// copilotHome is Copilot CLI's folder of the user's settings:
// $COPILOT_HOME, ~/.copilot.
func copilotHome(home string) string {
	if h := os.Getenv("COPILOT_HOME"); h != "" && filepath.IsAbs(h) {
		return h
	}
	return filepath.Join(home, ".copilot")
}

// copilotCommands are a hook file's commands by event (its "bash"
// entries).
func copilotCommands(b []byte) (map[string][]string, error) {
	var f struct {
		Hooks map[string][]map[string]any `json:"hooks"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for ev, hs := range f.Hooks {
		for _, h := range hs {
			cmd, _ := h["bash"].(string)
			out[ev] = append(out[ev], cmd)
		}
	}
	return out, nil
}

// copilotOurs says whether a hook file is fleet's: JSON whose every hook
// is fleet's.
func copilotOurs(b []byte) bool {
	cmds, err := copilotCommands(b)
	if err != nil || len(cmds) == 0 {
		return false
	}
	for _, l := range cmds {
		for _, c := range l {
			if !ours(c) {
				return false
			}
		}
	}
	return true
}

// copilotCheck fills st: each of the recipe's events installed (every
// command of the recipe's there) or missing, and what blocks them.
func (c *CLI) copilotCheck(st *Status, home, project string) (*Status, error) {
	have, err := os.ReadFile(st.File)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	want, _ := copilotCommands(c.recipe)
	got := map[string][]string{}
	if len(have) > 0 {
		got, _ = copilotCommands(have)
	}
	events := make([]string, 0, len(want))
	for ev := range want {
		events = append(events, ev)
	}
	sort.Strings(events)
	for _, ev := range events {
		if !slices.ContainsFunc(want[ev], func(cmd string) bool { return !slices.Contains(got[ev], cmd) }) {
			st.Installed = append(st.Installed, ev)
		} else {
			st.Missing = append(st.Missing, ev)
		}
	}
	var usage *UsageError
	if m, err := c.CheckMCP(home, project, ""); err == nil {
		st.MCP = m
	} else if !errors.As(err, &usage) {
		st.MCP = &MCPStatus{State: "unreadable", Notes: []string{err.Error()}}
	}
	switch {
	case len(have) > 0 && !copilotOurs(have):
		st.Blockers = append(st.Blockers, st.File+" is not fleet's hook file: move it away, then fleet-roster hooks install copilot")
	case len(st.Missing) > 0 && len(have) > 0:
		st.Blockers = append(st.Blockers, "an older fleet hook file: fleet-roster hooks install copilot")
	case len(st.Missing) > 0:
		st.Blockers = append(st.Blockers, "not installed: fleet-roster hooks install copilot")
	case !bytes.Equal(have, c.recipe):
		// every command there, but not as shipped (a timeout changed):
		// the user's to keep
	}
	if _, err := exec.LookPath(c.Program); err != nil {
		st.Blockers = append(st.Blockers, c.Program+" is not on PATH")
	}
	if _, err := exec.LookPath("fleet-turn"); err != nil {
		st.Blockers = append(st.Blockers, "fleet-turn is not on PATH: make install puts it beside the fleet commands")
	}
	return st, nil
}
