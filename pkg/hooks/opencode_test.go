package hooks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// OpenCode's recipe is a plugin file: installed into the user's plugin
// folder (or the project's), twice is once, an older one reads missing, a
// file of the name that is not fleet's is neither overwritten nor removed,
// and Remove deletes only fleet's.
func TestOpenCodePlugin(t *testing.T) {
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", "")
	cl, err := Find("opencode")
	if err != nil {
		t.Fatal(err)
	}
	path := cl.File(home, "")
	if want := filepath.Join(home, ".config", "opencode", "plugins", "fleet.js"); path != want {
		t.Fatalf("plugin file %s, want %s", path, want)
	}
	if st, _ := cl.Check(home, ""); len(st.Installed) != 0 || len(st.Missing) == 0 || !strings.Contains(strings.Join(st.Blockers, "\n"), "not installed") {
		t.Errorf("before install: %+v", st)
	}
	for range 2 {
		if _, err := cl.Install(home, ""); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	if string(b) != string(cl.recipe) {
		t.Fatalf("the plugin file is not the shipped one")
	}
	if st, _ := cl.Check(home, ""); len(st.Missing) != 0 || len(st.Installed) != len(openCodeEvents) {
		t.Errorf("after install: %+v", st)
	}
	// an older plugin of fleet's: missing until installed again
	os.WriteFile(path, append([]byte(nil), openCodeMark...), 0o600)
	if st, _ := cl.Check(home, ""); len(st.Missing) == 0 || !strings.Contains(strings.Join(st.Blockers, "\n"), "older") {
		t.Errorf("an older plugin: %+v", st)
	}
	if _, n, err := cl.Remove(home, ""); err != nil || n != 1 {
		t.Fatalf("Remove: %d, %v", n, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the plugin is still there: %v", err)
	}
	// the user's own fleet.js stays, untouched
	mine := "export const Mine = async () => ({})\n"
	os.WriteFile(path, []byte(mine), 0o600)
	if _, err := cl.Install(home, ""); err == nil {
		t.Error("install over the user's fleet.js succeeded")
	}
	if _, n, _ := cl.Remove(home, ""); n != 0 {
		t.Error("remove took the user's fleet.js")
	}
	if b, _ := os.ReadFile(path); string(b) != mine {
		t.Errorf("the user's file changed: %q", b)
	}
	if st, _ := cl.Check(home, ""); !strings.Contains(strings.Join(st.Blockers, "\n"), "not fleet's plugin") {
		t.Errorf("the user's fleet.js: %+v", st)
	}
	// a project's plugin folder
	proj := t.TempDir()
	if p, err := cl.Install(home, proj); err != nil || p != filepath.Join(proj, ".opencode", "plugins", "fleet.js") {
		t.Errorf("project install: %s, %v", p, err)
	}
}

// fleet-mcp in OpenCode's opencode.json: a local server under "mcp", the
// user's settings kept; removed again by Remove.
func TestOpenCodeMCP(t *testing.T) {
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", "")
	cl, _ := Find("opencode")
	path, _ := cl.MCPFile(home, "")
	os.MkdirAll(filepath.Dir(path), 0o700)
	os.WriteFile(path, []byte(`{"model": "x/y", "mcp": {"other": {"type": "remote", "url": "https://example.invalid"}}}`), 0o600)
	if _, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "bob"}); err != nil || !changed {
		t.Fatalf("InstallMCP: %v %v", changed, err)
	}
	m := read(t, path)
	fleet := m["mcp"].(map[string]any)["fleet"].(map[string]any)
	if canonical(fleet) != `{"command":["fleet-mcp","--as","bob"],"enabled":true,"type":"local"}` || m["model"] != "x/y" || m["mcp"].(map[string]any)["other"] == nil {
		t.Errorf("opencode.json after install: %v", m)
	}
	if st, err := cl.CheckMCP(home, "", ""); err != nil || st.State != "present" || st.Entity != "bob" {
		t.Errorf("CheckMCP: %+v %v", st, err)
	}
	if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "carol"}); err == nil {
		t.Error("a differing entry was replaced without --force")
	}
	if _, removed, err := cl.RemoveMCP(home, ""); err != nil || !removed {
		t.Fatalf("RemoveMCP: %v %v", removed, err)
	}
	if m := read(t, path); m["mcp"].(map[string]any)["fleet"] != nil || m["mcp"].(map[string]any)["other"] == nil {
		t.Errorf("after remove: %v", m)
	}
}
