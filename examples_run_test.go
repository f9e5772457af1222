package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/cli/examples"
)

// TestExamplesRun runs for real, as written, the EXAMPLES (of --help and
// the man pages alike) that need nothing but this host's gateway: no
// tmux, broker, other host or third-party tool. Each runs in bash, in the
// order below, against a live gateway, and must exit 0. Every other
// example is held to the real parser (pkg/docs TestExamplesParse).
func TestExamplesRun(t *testing.T) {
	dir := t.TempDir()
	g := newTestGW(t, dir, "h1")
	env := append(append([]string(nil), g.env...),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+dir)
	run := func(what, script string) {
		t.Helper()
		cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", script)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s:\n%s\n%v\n%s", what, script, err, out)
		}
	}
	// the entities and the file the examples name
	run("setup", "fleet-roster join main --mode pull >/dev/null; fleet-roster join bob --mode pull >/dev/null")
	if err := os.WriteFile(filepath.Join(dir, "report.txt"), []byte("all green\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ page, has string }{
		{"fleet-roster", "export FLEET_TOKEN=$(fleet-roster join alice --mode pull)"},
		{"fleet-roster", "fleet-roster join carol --mode pull --nudge"},
		{"fleet-roster", "fleet-roster whoami --as alice"},
		{"fleet-send", "fleet-send --as alice bob - < report.txt"},
		{"fleet-send", `fleet-send --as alice --status "$id"`},
		{"fleet-recv", "fleet-recv --as bob -n 1"},
		{"fleet-bcast", "fleet-bcast --as main 'everyone: stop and report status'"},
		{"fleet-bcast", "fleet-roster group bob --add reviewers"},
		{"fleet-roster", "fleet-roster dead bob"},
		{"fleet-roster", "fleet-roster leave bob"},
		{"fleet-dlq", "fleet-dlq list --reason expired --since 1h --json"},
		{"fleet-gw", "fleet-gw trust remove build2"},
		{"fleet-gw", "fleet-gw status --json"},
	} {
		var found []string
		for _, ex := range examples.For(c.page) {
			if strings.Contains(ex.Cmd, c.has) {
				found = append(found, ex.Cmd)
			}
		}
		if len(found) != 1 {
			t.Errorf("%s: %d examples with %q, want 1 (changed? update this list)", c.page, len(found), c.has)
			continue
		}
		run(c.page+" example", found[0])
	}
	// the list example: bob has gone, alice and carol are there
	cmd := exec.Command("bash", "-c", "fleet-roster")
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), `"name":"carol"`) || strings.Contains(string(out), `"name":"bob"`) {
		t.Errorf("fleet-roster after the examples: %v\n%s", err, out)
	}
}
