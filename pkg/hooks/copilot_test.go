package hooks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Copilot CLI's recipe is a hook file of its own: installed into the
// user's hook folder (or the project's .github/hooks), twice is once, one
// with an event missing reads missing, a file of the name that is not
// fleet's is neither overwritten nor removed, Remove deletes only fleet's,
// and fleet-mcp goes into ~/.copilot/mcp-config.json.
func TestCopilotHookFile(t *testing.T) {
	home := t.TempDir()
	t.Setenv("COPILOT_HOME", "")
	cl, err := Find("copilot")
	if err != nil {
		t.Fatal(err)
	}
	path := cl.File(home, "")
	if want := filepath.Join(home, ".copilot", "hooks", "fleet.json"); path != want {
		t.Fatalf("hook file %s, want %s", path, want)
	}
	if p := cl.File(home, "/p"); p != "/p/.github/hooks/fleet.json" {
		t.Errorf("the project's hook file %s", p)
	}
	if st, _ := cl.Check(home, ""); len(st.Installed) != 0 || len(st.Missing) != 5 || !strings.Contains(strings.Join(st.Blockers, "\n"), "not installed") {
		t.Errorf("before install: %+v", st)
	}
	for range 2 {
		if _, err := cl.Install(home, ""); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	if string(b) != string(cl.recipe) {
		t.Fatalf("the hook file is not the shipped one")
	}
	st, _ := cl.Check(home, "")
	if strings.Join(st.Installed, ",") != "agentStop,errorOccurred,postToolUse,sessionStart,userPromptSubmitted" || len(st.Missing) != 0 {
		t.Errorf("after install: %+v", st)
	}
	// an older file of fleet's, without errorOccurred and the hook-mode
	// commands: those events missing until installed again
	os.WriteFile(path, []byte(`{"version":1,"hooks":{"sessionStart":[{"type":"command","bash":"fleet-turn idle"}],`+
		`"userPromptSubmitted":[{"type":"command","bash":"fleet-turn busy"}],"agentStop":[{"type":"command","bash":"fleet-turn idle"}]}}`), 0o600)
	if st, _ := cl.Check(home, ""); strings.Join(st.Missing, ",") != "agentStop,errorOccurred,postToolUse,userPromptSubmitted" || !strings.Contains(strings.Join(st.Blockers, "\n"), "older") {
		t.Errorf("an older hook file: %+v", st)
	}
	if _, n, err := cl.Remove(home, ""); err != nil || n != 1 {
		t.Fatalf("Remove: %d, %v", n, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the hook file is still there: %v", err)
	}
	// the user's own fleet.json stays, untouched
	mine := `{"version":1,"hooks":{"sessionStart":[{"type":"command","bash":"echo hi"}]}}`
	os.WriteFile(path, []byte(mine), 0o600)
	if _, err := cl.Install(home, ""); err == nil {
		t.Error("install over the user's fleet.json succeeded")
	}
	if _, n, _ := cl.Remove(home, ""); n != 0 {
		t.Error("remove took the user's fleet.json")
	}
	if b, _ := os.ReadFile(path); string(b) != mine {
		t.Errorf("the user's file changed: %s", b)
	}
	if st, _ := cl.Check(home, ""); !strings.Contains(strings.Join(st.Blockers, "\n"), "not fleet's hook file") {
		t.Errorf("the user's file: %+v", st)
	}
	// fleet-mcp: the user's mcp-config.json, no project file
	if p, err := cl.MCPFile(home, ""); err != nil || p != filepath.Join(home, ".copilot", "mcp-config.json") {
		t.Errorf("MCP file %s, %v", p, err)
	}
	if _, err := cl.MCPFile(home, "/p"); err == nil {
		t.Error("a project MCP file for copilot")
	}
}
