package hooks

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func read(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// mergesSettings says whether cl's recipe is merged into the CLI's own
// settings file. OpenCode's is a plugin file (TestOpenCodePlugin), Copilot
// CLI's a hook file of fleet's own (TestCopilotHookFile): nothing of the
// user's to keep.
func mergesSettings(cl *CLI) bool { return cl.Name != "opencode" && cl.Name != "copilot" }

// Install merges: the user's settings and hooks stay, installing twice is
// installing once, Remove takes out fleet-turn's hooks and nothing else.
func TestInstallMergesAndRemoves(t *testing.T) {
	for _, cl := range CLIs {
		if !mergesSettings(cl) {
			continue
		}
		t.Run(cl.Name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("CODEX_HOME", "")
			path := cl.File(home, "")
			os.MkdirAll(filepath.Dir(path), 0o700)
			mine := `{"theme":"dark","hooks":{"Stop":[{"hooks":[{"type":"command","command":"my-own stop"}]}]},
				"security":{"environmentVariableRedaction":{"allowed":["MY_VAR","TMUX"]}}}`
			if err := os.WriteFile(path, []byte(mine), 0o600); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if _, err := cl.Install(home, ""); err != nil {
					t.Fatal(err)
				}
			}
			st, err := cl.Check(home, "")
			if err != nil || len(st.Missing) != 0 || len(st.Installed) == 0 {
				t.Fatalf("after install: %+v, %v", st, err)
			}
			m := read(t, path)
			hooks := m["hooks"].(map[string]any)
			n := 0
			for _, groups := range hooks {
				for _, g := range groups.([]any) {
					if isOurs(g) {
						n++
					}
				}
			}
			var recipe map[string]any
			json.Unmarshal(cl.recipe, &recipe)
			if n != len(recipe["hooks"].(map[string]any)) {
				t.Errorf("%d fleet-turn groups after two installs, want one per event (%d)", n, len(recipe["hooks"].(map[string]any)))
			}
			if m["theme"] != "dark" || !strings.Contains(mustJSON(hooks["Stop"]), "my-own stop") {
				t.Errorf("the user's settings were not kept: %s", mustJSON(m))
			}
			allowed := m["security"].(map[string]any)["environmentVariableRedaction"].(map[string]any)["allowed"].([]any)
			if cl.Name == "gemini" && (!slices.Contains(allowed, any("FLEET_TOKEN")) || !slices.Contains(allowed, any("MY_VAR"))) {
				t.Errorf("gemini allow-list: %v", allowed)
			}
			if _, removed, err := cl.Remove(home, ""); err != nil || removed != n {
				t.Fatalf("Remove: %d, %v; want %d", removed, err, n)
			}
			m = read(t, path)
			if got := mustJSON(m["hooks"]); strings.Contains(got, "fleet-turn") || !strings.Contains(got, "my-own stop") {
				t.Errorf("after remove, hooks %s", got)
			}
			allowed = m["security"].(map[string]any)["environmentVariableRedaction"].(map[string]any)["allowed"].([]any)
			if !slices.Contains(allowed, any("MY_VAR")) || !slices.Contains(allowed, any("TMUX")) || slices.Contains(allowed, any("FLEET_TOKEN")) {
				t.Errorf("after remove, allow-list %v", allowed)
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Codex's hook trust: untrusted after install, trusted after CodexTrust
// (which keeps the rest of config.toml and replaces its own entries), and
// untrusted again once a hook changes.
func TestCodexTrust(t *testing.T) {
	home := t.TempDir()
	t.Setenv("CODEX_HOME", filepath.Join(home, "cx"))
	cl, _ := Find("codex")
	path, err := cl.Install(home, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(home, "cx", "config.toml")
	os.WriteFile(cfg, []byte("model = \"m\"\n\n[projects.\"/p\"]\ntrust_level = \"trusted\"\n"), 0o600)
	// fleet-turn's four and fleet-recv's three (hook delivery mode)
	if n, err := codexUntrusted(home, path); err != nil || n != 7 {
		t.Fatalf("untrusted after install: %d, %v; want 7", n, err)
	}
	for range 2 {
		if err := CodexTrust(home, path); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := codexUntrusted(home, path); err != nil || n != 0 {
		t.Fatalf("untrusted after CodexTrust: %d, %v", n, err)
	}
	b, _ := os.ReadFile(cfg)
	if strings.Count(string(b), "[hooks.state.") != 7 || !strings.Contains(string(b), "[projects.\"/p\"]\ntrust_level = \"trusted\"") {
		t.Fatalf("config.toml:\n%s", b)
	}
	// the identity Codex hashes, for one handler (as docs/agent-clis/codex.md)
	es, _ := codexEntries(path)
	if !strings.HasSuffix(es[0].key, ":interrupt:0:0") || !strings.HasPrefix(es[0].hash, "sha256:") {
		t.Errorf("entry %+v", es[0])
	}
	raw, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(raw), `"timeout": 10`, `"timeout": 11`, 1)), 0o600)
	if n, _ := codexUntrusted(home, path); n != 1 {
		t.Errorf("a changed hook: %d untrusted, want 1", n)
	}
}

// The installer keeps what it does not own as it was: numbers beyond
// float64, & < > in commands, a settings file that is a symlink (it stays
// one), the file's mode; and writes nothing when nothing changes.
func TestInstallKeepsTheFile(t *testing.T) {
	home := t.TempDir()
	cl, _ := Find("claude")
	real := filepath.Join(home, "dotfiles", "settings.json")
	os.MkdirAll(filepath.Dir(real), 0o700)
	mine := `{"big": 12345678901234567890, "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "a && b < c > d"}]}]}}`
	if err := os.WriteFile(real, []byte(mine), 0o640); err != nil {
		t.Fatal(err)
	}
	link := cl.File(home, "")
	os.MkdirAll(filepath.Dir(link), 0o700)
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Install(home, ""); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link is no longer a link: %v", err)
	}
	b, _ := os.ReadFile(real)
	if !strings.Contains(string(b), "12345678901234567890") || !strings.Contains(string(b), "a && b < c > d") || !strings.Contains(string(b), "fleet-turn busy") {
		t.Fatalf("the file after install:\n%s", b)
	}
	if fi, _ := os.Stat(real); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 as it was", fi.Mode().Perm())
	}
	before, _ := os.Stat(real)
	if _, err := cl.Install(home, ""); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(real); !after.ModTime().Equal(before.ModTime()) {
		t.Error("a second install rewrote the file")
	}
}

// An event counts as installed only when every command of the recipe's is
// there: an install from before hook delivery mode (fleet-turn alone)
// reads missing where the recipe now also runs fleet-recv, until an
// install brings the file up to date.
func TestStatusOlderInstall(t *testing.T) {
	home := t.TempDir()
	t.Setenv("CODEX_HOME", "")
	for _, cl := range CLIs {
		if !mergesSettings(cl) {
			continue
		}
		t.Run(cl.Name, func(t *testing.T) {
			var recipe map[string]any
			json.Unmarshal(cl.recipe, &recipe)
			old := map[string]any{}
			withRecv := []string{}
			for event, groups := range recipe["hooks"].(map[string]any) {
				var kept []any
				for _, g := range groups.([]any) {
					var hs []any
					for _, h := range g.(map[string]any)["hooks"].([]any) {
						if strings.HasPrefix(h.(map[string]any)["command"].(string), "fleet-recv") {
							continue
						}
						hs = append(hs, h)
					}
					if len(hs) < len(g.(map[string]any)["hooks"].([]any)) {
						withRecv = append(withRecv, event)
					}
					if len(hs) > 0 {
						kept = append(kept, map[string]any{"hooks": hs})
					}
				}
				if len(kept) > 0 {
					old[event] = kept
				}
			}
			if len(withRecv) == 0 {
				t.Skip("the recipe runs no fleet-recv")
			}
			path := cl.File(home, "")
			os.MkdirAll(filepath.Dir(path), 0o700)
			b, _ := json.Marshal(map[string]any{"hooks": old})
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := cl.Check(home, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, event := range withRecv {
				if !slices.Contains(st.Missing, event) || slices.Contains(st.Installed, event) {
					t.Errorf("%s lacks fleet-recv, yet reads installed: %+v", event, st)
				}
			}
			if _, err := cl.Install(home, ""); err != nil {
				t.Fatal(err)
			}
			if st, _ := cl.Check(home, ""); len(st.Missing) != 0 {
				t.Errorf("after install: missing %v", st.Missing)
			}
			if _, n, err := cl.Remove(home, ""); err != nil || n == 0 {
				t.Fatalf("Remove: %d, %v", n, err)
			}
			if b, _ := os.ReadFile(path); strings.Contains(string(b), "fleet-") {
				t.Errorf("after remove:\n%s", b)
			}
		})
	}
}
