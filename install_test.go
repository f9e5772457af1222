package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make install puts the commands, their man pages (and the config file's
// and concept pages, sections 5 and 7) and completions, the
// gateway's systemd user units (with the prefix's paths) and the example
// config in place, and systemd itself accepts the units.
func TestMakeInstall(t *testing.T) {
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
		"share/fleet/hooks/gemini-settings.json",
	} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Errorf("not installed: %v", err)
		}
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
