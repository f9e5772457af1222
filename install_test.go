package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/testsched"
)

// make install puts the commands, their man pages (and the config file's
// and concept pages, sections 5 and 7) and bash, zsh and fish completions,
// the agent CLIs' turn hook fleet-turn and its settings snippets, the
// gateway's systemd user units (with the prefix's paths) and the example
// config in place; systemd itself accepts the units, and each shell reads
// its installed completions from where it looks.
func TestMakeInstall(t *testing.T) {
	testsched.Take(t, testsched.Need{})
	prefix := t.TempDir()
	if out, err := exec.Command("make", "install", "PREFIX="+prefix).CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, f := range []string{
		"bin/fleet-gw", "bin/fleet-send", "share/man/man1/fleet-gw.1",
		"share/man/man5/fleet-config.5", "share/man/man7/fleet.7", "share/man/man7/fleet-broker.7",
		"share/man/man7/fleet-security.7", "share/man/man7/fleet-agents.7", "share/man/man7/fleet-metrics.7",
		"share/man/man7/fleet-json.7",
		"share/bash-completion/completions/fleet-gw", "share/zsh/site-functions/_fleet-gw",
		"lib/systemd/user/fleet-gw.service", "lib/systemd/user/fleet-gw-health.service",
		"lib/systemd/user/fleet-gw-health.timer", "share/doc/fleet/fleet.conf.example",
		"bin/fleet-turn", "share/fleet/hooks/claude-code-settings.json", "share/fleet/hooks/codex-hooks.json",
		"share/fleet/hooks/gemini-settings.json", "share/fleet/hooks/codex-notify.toml", "share/fleet/hooks/opencode-plugin.js", "share/fleet/hooks/copilot-hooks.json",
		"share/fish/vendor_completions.d/fleet-gw.fish", "share/fish/vendor_completions.d/fleet-send.fish",
	} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
	}
	// every command has its completion for each shell, and its man page
	cmds, _ := filepath.Glob("cmd/fleet-*")
	if len(cmds) < 10 {
		t.Fatalf("cmd/fleet-*: %d commands", len(cmds))
	}
	for _, c := range cmds {
		name := filepath.Base(c)
		for _, f := range []string{"bin/" + name, "share/man/man1/" + name + ".1",
			"share/bash-completion/completions/" + name, "share/zsh/site-functions/_" + name,
			"share/fish/vendor_completions.d/" + name + ".fish"} {
			if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
				t.Errorf("not installed: %v", err)
			}
		}
	}
	// fleet-turn and the snippets are the ones in scripts/hooks, executable
	for _, f := range []string{"fleet-turn", "claude-code-settings.json", "codex-hooks.json", "codex-notify.toml", "gemini-settings.json", "opencode-plugin.js", "copilot-hooks.json"} {
		want, err := os.ReadFile(filepath.Join("scripts/hooks", f))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(prefix, "share/fleet/hooks", f)
		if f == "fleet-turn" {
			path = filepath.Join(prefix, "bin", f)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: not scripts/hooks/%s (%v)", path, f, err)
		}
		if fi, err := os.Stat(path); err == nil && f == "fleet-turn" && fi.Mode()&0o111 == 0 {
			t.Errorf("%s is not executable", path)
		}
	}
	// fish finds the installed completions where it looks (its vendor
	// folder on XDG_DATA_DIRS, for a command on PATH), nothing sourced by
	// hand; so does bash-completion's loader
	shellEnv := append(os.Environ(), "PATH="+filepath.Join(prefix, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"XDG_DATA_DIRS="+filepath.Join(prefix, "share"), "HOME="+t.TempDir())
	fish := exec.Command("fish", "-c", "complete -C 'fleet-gw tru'")
	fish.Env = shellEnv
	if out, err := fish.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "trust\t") {
		t.Errorf("fish with the installed completions: complete -C 'fleet-gw tru' = %q, %v; want trust", out, err)
	}
	bash := exec.Command("bash", "-c", `source /usr/share/bash-completion/bash_completion && __load_completion fleet-gw && complete -p fleet-gw`)
	bash.Env = shellEnv
	if out, err := bash.CombinedOutput(); err != nil || !strings.Contains(string(out), "complete -F _fleet_gw fleet-gw") {
		t.Errorf("bash-completion with the installed completions: %q, %v", out, err)
	}
	// zsh reads every installed one
	zshFiles, _ := filepath.Glob(filepath.Join(prefix, "share/zsh/site-functions/_fleet-*"))
	if out, err := exec.Command("zsh", append([]string{"-n"}, zshFiles...)...).CombinedOutput(); err != nil || len(zshFiles) != len(cmds) {
		t.Errorf("zsh -n on %d installed completions: %v\n%s", len(zshFiles), err, out)
	}

	unit, err := os.ReadFile(filepath.Join(prefix, "lib/systemd/user/fleet-gw.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+prefix+"/bin/fleet-gw run\n") || strings.Contains(string(unit), "@BINDIR@") {
		t.Errorf("the unit does not run the installed fleet-gw:\n%s", unit)
	}
	units, _ := filepath.Glob(filepath.Join(prefix, "lib/systemd/user/*"))
	cmd := exec.Command("systemd-analyze", append([]string{"verify", "--user"}, units...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// the example config, as it ships, is a valid config
	cfg := exec.Command(filepath.Join(prefix, "bin/fleet-gw"), "status", "--config", filepath.Join(prefix, "share/doc/fleet/fleet.conf.example"),
		"--socket", filepath.Join(t.TempDir(), "none.sock"))
	if out, err := cfg.CombinedOutput(); err == nil || !strings.Contains(string(out), "no gateway running") {
		t.Errorf("fleet-gw status with the example config: %v\n%s (want: no gateway running)", err, out)
	}
}
