package fleet_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"
)

// TestScriptWaitsHoldTheirChecks fails, naming file:line, where a script
// has an eventually directly followed (comments and blank lines aside) by
// a stdout or ! stdout check of its output. Such a check reads a state the
// wait did not wait for: a match that a partial state also satisfies (one
// host's presence heard, another's not yet) passes the wait, and then the
// check fails (issue 36). What the check asks belongs in the wait, as
// -match or -nomatch.
func TestScriptWaitsHoldTheirChecks(t *testing.T) {
	files, err := filepath.Glob("testdata/script/*.txtar")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scripts in testdata/script")
	}
	for _, file := range files {
		a, err := txtar.ParseFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, msg := range lintWaits(file, string(a.Comment)) {
			t.Error(msg)
		}
	}
}

// TestLintWaits: the lint finds what it is there for, and only that.
func TestLintWaits(t *testing.T) {
	bad := `host h1
eventually -match '"name":"a"' fleet-roster --json

# a comment, then a blank line, change nothing

! stdout '"name":"b"'
[short] eventually -match x fleet-roster --json
[!windows] stdout y
eventually -match x fleet-roster --json
stdout z
`
	got := lintWaits("bad.txtar", bad)
	want := []string{
		`bad.txtar:6: ! stdout '"name":"b"' checks the output of the eventually at line 2: fold it into the wait (-match/-nomatch)`,
		`bad.txtar:8: [!windows] stdout y checks the output of the eventually at line 7: fold it into the wait (-match/-nomatch)`,
		`bad.txtar:10: stdout z checks the output of the eventually at line 9: fold it into the wait (-match/-nomatch)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lintWaits found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	good := `eventually -match a -nomatch b fleet-roster --json
exec fleet-send --as alice bob hi
stdout '"state":"accepted"'
eventually -match a fleet-roster --json
stderr 'hint'
recv -until x bob
stdout x
`
	if got := lintWaits("good.txtar", good); len(got) != 0 {
		t.Errorf("lintWaits found in a script that keeps the rule:\n%s", strings.Join(got, "\n"))
	}
}

// lintWaits returns a message for each stdout check that directly follows
// an eventually in script (a txtar's comment: the script's lines, from
// line 1).
func lintWaits(file, script string) []string {
	var msgs []string
	wait := 0 // the line of the eventually just before, if any
	for i, line := range strings.Split(script, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd := scriptCommand(line)
		if wait > 0 && cmd == "stdout" {
			msgs = append(msgs, fmt.Sprintf("%s:%d: %s checks the output of the eventually at line %d: fold it into the wait (-match/-nomatch)", file, i+1, line, wait))
		}
		wait = 0
		if cmd == "eventually" {
			wait = i + 1
		}
	}
	return msgs
}

// scriptCommand is the command word of a script line: past its [cond]
// prefixes and its ! or ? prefix.
func scriptCommand(line string) string {
	for strings.HasPrefix(line, "[") {
		end := strings.Index(line, "]")
		if end < 0 {
			return ""
		}
		line = strings.TrimSpace(line[end+1:])
	}
	if strings.HasPrefix(line, "!") || strings.HasPrefix(line, "?") {
		line = strings.TrimSpace(line[1:])
	}
	if f := strings.Fields(line); len(f) > 0 {
		return f[0]
	}
	return ""
}
