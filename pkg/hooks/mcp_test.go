package hooks

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// mcpHome is a home folder for one test, with CODEX_HOME under it and
// Claude's config dir and tool search left to the files.
func mcpHome(t *testing.T) string {
	home := t.TempDir()
	t.Setenv("CODEX_HOME", filepath.Join(home, ".codex"))
	t.Setenv("CLAUDE_CONFIG_DIR", "")
	os.Unsetenv("CLAUDE_CONFIG_DIR")
	t.Setenv("ENABLE_TOOL_SEARCH", "")
	os.Unsetenv("ENABLE_TOOL_SEARCH")
	return home
}

// pyTOML is config.toml as python3's tomllib reads it, as JSON: a parser
// nobody on this project wrote.
func pyTOML(t *testing.T, path string) map[string]any {
	t.Helper()
	out, err := exec.Command("python3", "-c", "import json,sys,tomllib; print(json.dumps(tomllib.load(open(sys.argv[1],'rb'))))", path).CombinedOutput()
	if err != nil {
		t.Fatalf("tomllib cannot read %s: %v\n%s", path, err, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The user's own file, per CLI: other servers, other settings, comments
// and a layout (Codex) that must survive every edit byte for byte.
var mcpUserFiles = map[string]string{
	"claude":   `{"theme": "dark", "projects": {"/p": {"hasTrustDialogAccepted": true}}, "mcpServers": {"other": {"command": "other-mcp", "args": ["-x"]}}}`,
	"gemini":   `{"general": {"vimMode": true}, "mcpServers": {"other": {"command": "other-mcp"}}}`,
	"opencode": `{"model": "x/y", "mcp": {"other": {"type": "local", "command": ["other-mcp"]}}}`,
	"copilot":  `{"mcpServers": {"other": {"type": "local", "command": "other-mcp", "tools": ["*"]}}}`,
	"codex": `# my Codex settings
model = "gpt-x"   # the one I like
approval_policy = "on-request"

[mcp_servers.other]
command = "other-mcp"
args = [
  "[not a table]",
  "x",
]

# the last one
[projects."/p"]
trust_level = "trusted"
`,
}

// mcpServers reads the servers table of the CLI's file (Codex's through
// tomllib).
func mcpServers(t *testing.T, cl *CLI, path string) map[string]any {
	t.Helper()
	if cl.Name == "codex" {
		m, _ := pyTOML(t, path)["mcp_servers"].(map[string]any)
		return m
	}
	m, _ := read(t, path)[cl.serversKey()].(map[string]any)
	if cl.Name == "opencode" {
		// as the others': command and args apart
		for k, v := range m {
			e, _ := v.(map[string]any)
			if l, ok := e["command"].([]any); ok && len(l) > 0 {
				c := map[string]any{}
				for ek, ev := range e {
					c[ek] = ev
				}
				c["command"], c["args"] = l[0], l[1:]
				m[k] = c
			}
		}
	}
	return m
}

func TestMCPInstall(t *testing.T) {
	for _, cl := range CLIs {
		t.Run(cl.Name, func(t *testing.T) {
			// fresh: no file at all
			home := mcpHome(t)
			path, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"})
			if err != nil || !changed {
				t.Fatalf("fresh install: %v, changed %v", err, changed)
			}
			fleet, _ := mcpServers(t, cl, path)["fleet"].(map[string]any)
			if fleet["command"] != "fleet-mcp" || !reflect.DeepEqual(fleet["args"], []any{"--as", "main"}) {
				t.Fatalf("fleet's entry: %v", fleet)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Errorf("a new file's mode %v, want 0600", fi.Mode().Perm())
			}
			st, err := cl.CheckMCP(home, "", "")
			if err != nil || st.State != "present" || st.Entity != "main" || st.File != path {
				t.Fatalf("status after install: %+v, %v", st, err)
			}
			switch cl.Name {
			case "codex":
				if fleet["tool_timeout_sec"] != float64(960) || fleet["default_tools_approval_mode"] != "writes" ||
					!reflect.DeepEqual(fleet["env_vars"], []any{"FLEET_SOCKET", "FLEET_STATE_DIR", "FLEET_CONFIG", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME"}) {
					t.Errorf("codex entry: %v", fleet)
				}
			case "gemini":
				if fleet["timeout"] != float64(960000) {
					t.Errorf("gemini entry: %v", fleet)
				}
			case "claude":
				if path != filepath.Join(home, ".claude.json") || fleet["type"] != "stdio" {
					t.Errorf("claude entry in %s: %v", path, fleet)
				}
				if !strings.Contains(strings.Join(st.Notes, " "), "ENABLE_TOOL_SEARCH=false") {
					t.Errorf("no advice on tool search: %v", st.Notes)
				}
			}
			if strings.Contains(mustJSON(fleet), "TOKEN") {
				t.Errorf("the entry carries a token or its variable: %v", fleet)
			}
		})
	}
}

// The user's file: kept (other servers, settings; Codex's bytes outside
// fleet's table exactly), twice is once, a differing entry refused unless
// Force, Remove takes out fleet's entry alone.
func TestMCPInstallMerges(t *testing.T) {
	for _, cl := range CLIs {
		t.Run(cl.Name, func(t *testing.T) {
			home := mcpHome(t)
			path, _ := cl.MCPFile(home, "")
			os.MkdirAll(filepath.Dir(path), 0o700)
			mine := mcpUserFiles[cl.Name]
			if err := os.WriteFile(path, []byte(mine), 0o640); err != nil {
				t.Fatal(err)
			}
			if st, _ := cl.CheckMCP(home, "", ""); st.State != "missing" {
				t.Errorf("status before install: %+v", st)
			}
			if _, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"}); err != nil || !changed {
				t.Fatalf("install: %v, %v", err, changed)
			}
			once, _ := os.ReadFile(path)
			before, _ := os.Stat(path)
			if _, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"}); err != nil || changed {
				t.Fatalf("a second install: %v, changed %v", err, changed)
			}
			if after, _ := os.Stat(path); !after.ModTime().Equal(before.ModTime()) || after.Mode().Perm() != 0o640 {
				t.Errorf("a second install rewrote the file, or its mode is %v", after.Mode().Perm())
			}
			servers := mcpServers(t, cl, path)
			if _, ok := servers["other"]; !ok || servers["fleet"] == nil {
				t.Fatalf("servers after install: %v", servers)
			}
			if cl.Name == "codex" {
				if !strings.HasPrefix(string(once), mine) {
					t.Fatalf("the user's bytes changed:\n%s", once)
				}
				if m := pyTOML(t, path); m["model"] != "gpt-x" || m["projects"] == nil {
					t.Errorf("the user's settings: %v", m)
				}
			} else {
				m := read(t, path)
				if cl.Name == "claude" && (m["theme"] != "dark" || m["projects"] == nil) || cl.Name == "gemini" && m["general"] == nil {
					t.Errorf("the user's settings were not kept: %v", m)
				}
			}

			// another entity: the entry differs, refused; the file stays
			_, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "other"})
			var differs *DiffersError
			if !errors.As(err, &differs) || differs.File != path {
				t.Fatalf("install over a differing entry: %v", err)
			}
			if b, _ := os.ReadFile(path); string(b) != string(once) {
				t.Errorf("a refused install changed the file")
			}
			if st, _ := cl.CheckMCP(home, "", "other"); st.State != "differs" {
				t.Errorf("status for another entity: %+v", st)
			}
			if _, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "other", Force: true}); err != nil || !changed {
				t.Fatalf("--force: %v, %v", err, changed)
			}
			if st, _ := cl.CheckMCP(home, "", ""); st.State != "present" || st.Entity != "other" {
				t.Errorf("status after --force: %+v", st)
			}
			if _, ok := mcpServers(t, cl, path)["other"]; !ok {
				t.Errorf("--force took the user's other server")
			}

			if _, removed, err := cl.RemoveMCP(home, ""); err != nil || !removed {
				t.Fatalf("remove: %v, %v", err, removed)
			}
			if cl.Name == "codex" {
				if b, _ := os.ReadFile(path); string(b) != mine {
					t.Errorf("after remove, the file is not the user's as it was:\n%s", b)
				}
			}
			servers = mcpServers(t, cl, path)
			if _, ok := servers["fleet"]; ok {
				t.Errorf("fleet's entry stayed: %v", servers)
			}
			if _, ok := servers["other"]; !ok {
				t.Errorf("remove took the user's other server: %v", servers)
			}
			if st, _ := cl.CheckMCP(home, "", ""); st.State != "missing" {
				t.Errorf("status after remove: %+v", st)
			}
			if _, removed, err := cl.RemoveMCP(home, ""); err != nil || removed {
				t.Errorf("a second remove: %v, %v", err, removed)
			}
		})
	}
}

// An entry named fleet that runs something else is the user's: install
// refuses it, remove leaves it.
func TestMCPUserEntryNamedFleet(t *testing.T) {
	for _, cl := range CLIs {
		t.Run(cl.Name, func(t *testing.T) {
			home := mcpHome(t)
			path, _ := cl.MCPFile(home, "")
			os.MkdirAll(filepath.Dir(path), 0o700)
			text := `{"mcpServers": {"fleet": {"command": "my-fleet-tool"}}}`
			if cl.Name == "opencode" {
				text = `{"mcp": {"fleet": {"type": "local", "command": ["my-fleet-tool"]}}}`
			}
			if cl.Name == "codex" {
				text = "[mcp_servers.fleet]\ncommand = \"my-fleet-tool\"\n\n[mcp_servers.fleet.env]\nX = \"1\"\n"
			}
			os.WriteFile(path, []byte(text), 0o600)
			var differs *DiffersError
			if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"}); !errors.As(err, &differs) {
				t.Fatalf("install over the user's fleet: %v", err)
			}
			if _, removed, err := cl.RemoveMCP(home, ""); err != nil || removed {
				t.Fatalf("remove of the user's fleet: %v, %v", err, removed)
			}
			if b, _ := os.ReadFile(path); string(b) != text {
				t.Fatalf("the user's entry changed:\n%s", b)
			}
			// with --force it is replaced whole (Codex: its sub-table too)
			if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Force: true}); err != nil {
				t.Fatal(err)
			}
			fleet, _ := mcpServers(t, cl, path)["fleet"].(map[string]any)
			if fleet["command"] != "fleet-mcp" || fleet["env"] != nil {
				t.Errorf("after --force: %v", fleet)
			}
		})
	}
}

// Codex: --approve writes per-tool approval_mode, all the server's
// default; a change of approval is fleet's own entry, replaced without
// --force; a fleet entry in dotted keys is refused, not rewritten.
func TestMCPCodexApprove(t *testing.T) {
	home := mcpHome(t)
	cl, _ := Find("codex")
	path, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Approve: []string{"receive", "send", "receive"}})
	if err != nil {
		t.Fatal(err)
	}
	fleet := mcpServers(t, cl, path)["fleet"].(map[string]any)
	want := map[string]any{"receive": map[string]any{"approval_mode": "approve"}, "send": map[string]any{"approval_mode": "approve"}}
	if fleet["default_tools_approval_mode"] != "writes" || !reflect.DeepEqual(fleet["tools"], want) {
		t.Fatalf("--approve receive,send: %v", fleet)
	}
	if st, _ := cl.CheckMCP(home, "", "main"); st.State != "present" {
		t.Errorf("status: %+v", st)
	}
	if _, changed, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Approve: []string{"all"}}); err != nil || !changed {
		t.Fatalf("--approve all over fleet's entry: %v, %v", err, changed)
	}
	fleet = mcpServers(t, cl, path)["fleet"].(map[string]any)
	if fleet["default_tools_approval_mode"] != "approve" || fleet["tools"] != nil {
		t.Fatalf("--approve all: %v", fleet)
	}
	for _, bad := range [][]string{{"nope"}} {
		var u *UsageError
		if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Approve: bad}); !errors.As(err, &u) {
			t.Errorf("--approve %v: %v", bad, err)
		}
	}
	var u *UsageError
	if _, _, err := cl.InstallMCP(home, t.TempDir(), MCPOptions{Entity: "main"}); !errors.As(err, &u) {
		t.Errorf("codex --project: %v", err)
	}
	claude, _ := Find("claude")
	if _, _, err := claude.InstallMCP(home, "", MCPOptions{Entity: "main", Approve: []string{"all"}}); !errors.As(err, &u) {
		t.Errorf("claude --approve: %v", err)
	}
	if _, _, err := claude.InstallMCP(home, "", MCPOptions{Entity: "../x"}); !errors.As(err, &u) {
		t.Errorf("an entity outside the grammar: %v", err)
	}

	for _, text := range []string{
		"[mcp_servers]\nfleet = { command = \"fleet-mcp\" }\n",
		"mcp_servers.fleet.command = \"fleet-mcp\"\n",
	} {
		os.WriteFile(path, []byte(text), 0o600)
		var un *UneditableError
		if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Force: true}); !errors.As(err, &un) {
			t.Errorf("%q: %v", text, err)
		}
		if b, _ := os.ReadFile(path); string(b) != text {
			t.Errorf("changed:\n%s", b)
		}
	}
	os.WriteFile(path, []byte("model = [\n"), 0o600)
	if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"}); err == nil || !strings.Contains(err.Error(), "not valid TOML") {
		t.Errorf("a broken config.toml: %v", err)
	}
}

// Codex: fleet's tables between the user's, a comment of the user's
// before the next table, a file without a final newline.
func TestMCPCodexLayout(t *testing.T) {
	home := mcpHome(t)
	cl, _ := Find("codex")
	path, _ := cl.MCPFile(home, "")
	os.MkdirAll(filepath.Dir(path), 0o700)
	head := "model = \"m\"\n\n"
	fleet := "[mcp_servers.fleet]\ncommand = \"fleet-mcp\"\nargs = [\"--as\", \"old\"]\n\n[mcp_servers.fleet.tools.send]\napproval_mode = \"prompt\"\n"
	tail := "\n# about the next one\n[tui]\nanimations = false"
	os.WriteFile(path, []byte(head+fleet+tail), 0o600)
	if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main", Force: true}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := head + codexTable(MCPOptions{Entity: "main"}) + tail; string(b) != want {
		t.Fatalf("after --force:\n%s\nwant:\n%s", b, want)
	}
	pyTOML(t, path)
	if _, _, err := cl.RemoveMCP(home, ""); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if want := head + "# about the next one\n[tui]\nanimations = false"; string(b) != want {
		t.Fatalf("after remove:\n%q\nwant:\n%q", b, want)
	}
	if _, _, err := cl.InstallMCP(home, "", MCPOptions{Entity: "main"}); err != nil {
		t.Fatal(err)
	}
	m := pyTOML(t, path)
	if m["tui"] == nil || m["mcp_servers"] == nil {
		t.Fatalf("after install on a file without a final newline: %v", m)
	}
}

// Claude Code: --project writes the folder's .mcp.json (what a team
// commits), CLAUDE_CONFIG_DIR moves the user's file; the advice on tool
// search goes once it is off in the user's settings.
func TestMCPClaudeFiles(t *testing.T) {
	home := mcpHome(t)
	cl, _ := Find("claude")
	proj := t.TempDir()
	path, _, err := cl.InstallMCP(home, proj, MCPOptions{Entity: "main"})
	if err != nil || path != filepath.Join(proj, ".mcp.json") {
		t.Fatalf("--project: %s, %v", path, err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "TOKEN") || !strings.Contains(string(b), `"--as"`) {
		t.Errorf(".mcp.json:\n%s", b)
	}
	os.MkdirAll(filepath.Join(home, ".claude"), 0o700)
	os.WriteFile(filepath.Join(home, ".claude", "settings.json"), []byte(`{"env": {"ENABLE_TOOL_SEARCH": "false"}}`), 0o600)
	if st, _ := cl.CheckMCP(home, proj, ""); st.State != "present" || len(st.Notes) != 0 {
		t.Errorf("status with tool search off: %+v", st)
	}
	dir := t.TempDir()
	t.Setenv("CLAUDE_CONFIG_DIR", dir)
	if path, _ := cl.MCPFile(home, ""); path != filepath.Join(dir, ".claude.json") {
		t.Errorf("CLAUDE_CONFIG_DIR: %s", path)
	}
}
