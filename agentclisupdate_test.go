package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scripts/agent-clis-update (issue 40.5) against a registry stand-in: an
// npm on PATH that answers `npm view NAME version` from a table. What is
// checked is the script's own work — which pins it bumps, the lines it
// rewrites, that it installs, its refusals — never the registry.
func TestAgentCLIsUpdate(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	npm := `#!/bin/sh
[ "$1 $3" = "view version" ] || { echo "unexpected: npm $*" >&2; exit 2; }
case $2 in
@anthropic-ai/claude-code) echo 2.2.0 ;;
@openai/codex) echo 0.169.0 ;;
opencode-ai) echo 1.19.0 ;;
*) exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte(npm), 0o755); err != nil {
		t.Fatal(err)
	}
	deps := filepath.Join(dir, "test-deps.sh")
	depsText := "#!/bin/bash\n# a stand-in installer: says it ran\nnpm_pins=(\n\t@anthropic-ai/claude-code@2.1.332\n\t@openai/codex@0.169.0\n\topencode-ai@1.18.33\n)\necho installed >> " + filepath.Join(dir, "ran") + "\n"
	docs := filepath.Join(dir, "README.md")
	docsText := "What Claude Code 2.1.332, Codex CLI 0.169.0 and\nOpenCode 1.18.33 do in a tmux pane; 2.1.3320 is not a pin.\n"
	write := func() {
		if err := os.WriteFile(deps, []byte(depsText), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(docs, []byte(docsText), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command("scripts/agent-clis-update", args...)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "FLEET_DEPS="+deps, "FLEET_AGENT_DOCS="+docs)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return string(b)
	}

	// -n: what would be bumped, nothing changed, nothing installed
	write()
	out, _, code := run("-n")
	if code != 0 || out != "@anthropic-ai/claude-code 2.1.332 -> 2.2.0\n@openai/codex 0.169.0: the newest\nopencode-ai 1.18.33 -> 1.19.0\n" {
		t.Fatalf("-n: exit %d, printed %q", code, out)
	}
	if read(deps) != depsText || read(docs) != docsText || read(filepath.Join(dir, "ran")) != "" {
		t.Fatal("-n changed a file or installed")
	}

	// bump and install, no test: the pins and the docs' versions
	// rewritten, the unchanged one left, then the installer run once
	if _, errOut, code := run("--no-test"); code != 0 {
		t.Fatalf("--no-test: exit %d: %s", code, errOut)
	}
	if got := read(deps); !strings.Contains(got, "\t@anthropic-ai/claude-code@2.2.0\n\t@openai/codex@0.169.0\n\topencode-ai@1.19.0\n") {
		t.Errorf("the pins after the bump:\n%s", got)
	}
	if got, want := read(docs), "What Claude Code 2.2.0, Codex CLI 0.169.0 and\nOpenCode 1.19.0 do in a tmux pane; 2.1.3320 is not a pin.\n"; got != want {
		t.Errorf("the docs after the bump:\n%s\nwant\n%s", got, want)
	}
	if got := read(filepath.Join(dir, "ran")); got != "installed\n" {
		t.Errorf("the installer ran %q", got)
	}

	// a package the registry does not answer for: 69, nothing rewritten
	depsText = strings.Replace(depsText, "opencode-ai@1.18.33", "no-such-cli@1.0.0", 1)
	write()
	_, errOut, code := run("-n")
	if code != 69 || !strings.Contains(errOut, "agent-clis-update: error: the registry did not answer for no-such-cli\n") ||
		!strings.Contains(errOut, "agent-clis-update: hint: ") {
		t.Errorf("an unknown package: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run("--bogus"); code != 64 || !strings.HasPrefix(errOut, "agent-clis-update: error: unknown option --bogus\nagent-clis-update: hint: ") {
		t.Errorf("a bad option: exit %d, %q", code, errOut)
	}
}
