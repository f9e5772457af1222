package fleet_test

// Script commands that replace shell loops and shell plumbing: every wait
// has a bound that fails the script (showing the last output), and values
// taken from output go into the script's environment instead of files
// read back with $(cat ...).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// runOnce runs CMD ARGS once, in the script's folder, with the environment
// a gateway started by the script gets (scriptEnv) plus FLEET_TOKEN; CMD
// is looked up in the script's PATH. It returns stdout, stderr and the
// exit code; a command that cannot start fails the script.
func runOnce(ts *testscript.TestScript, args []string) (string, string, int) {
	path := args[0]
	if !strings.Contains(path, "/") {
		for _, dir := range filepath.SplitList(ts.Getenv("PATH")) {
			if p := filepath.Join(dir, path); isExecutable(p) {
				path = p
				break
			}
		}
	}
	cmd := exec.Command(path, args[1:]...)
	cmd.Dir = ts.MkAbs(".")
	cmd.Env = scriptEnv(ts)
	if tok := ts.Getenv("FLEET_TOKEN"); tok != "" {
		cmd.Env = append(cmd.Env, "FLEET_TOKEN="+tok)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee) && ee.Exited():
		return stdout.String(), stderr.String(), ee.ExitCode()
	default:
		ts.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		return "", "", -1
	}
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// waitFlags parses the leading flags of eventually and recv.
type waitFlags struct {
	limit   time.Duration
	exit    int
	n       int
	match   []*regexp.Regexp // every one must match (-match, -until: repeatable)
	nomatch []*regexp.Regexp // none may match (-nomatch: repeatable)
}

// matches says whether s matches every -match and no -nomatch.
func (f waitFlags) matches(s string) bool {
	for _, re := range f.match {
		if !re.MatchString(s) {
			return false
		}
	}
	for _, re := range f.nomatch {
		if re.MatchString(s) {
			return false
		}
	}
	return true
}

func parseWaitFlags(ts *testscript.TestScript, args []string, allowed string) (waitFlags, []string) {
	f := waitFlags{limit: 15 * time.Second}
	for len(args) > 1 && strings.HasPrefix(args[0], "-") {
		name, val := args[0], args[1]
		if !strings.Contains(allowed, " "+name+" ") {
			break
		}
		var err error
		switch name {
		case "-t":
			f.limit, err = time.ParseDuration(val)
		case "-exit":
			f.exit, err = strconv.Atoi(val)
		case "-n":
			f.n, err = strconv.Atoi(val)
		case "-match", "-until":
			var re *regexp.Regexp
			if re, err = regexp.Compile(val); err == nil {
				f.match = append(f.match, re)
			}
		case "-nomatch":
			var re *regexp.Regexp
			if re, err = regexp.Compile(val); err == nil {
				f.nomatch = append(f.nomatch, re)
			}
		}
		if err != nil {
			ts.Fatalf("%s: %v", name, err)
		}
		args = args[2:]
	}
	return f, args
}

// eventually [-t DUR] [-exit N] [-match REGEXP]... [-nomatch REGEXP]... CMD ARGS...
// — run CMD (see runOnce) again and again, every 50ms, until it exits N
// (default 0) and its stdout matches every -match and none of the
// -nomatch ones (each repeatable). Name in them the whole state the lines
// after it rely on: a match that a partial state also satisfies (one
// host's presence heard, another's not yet) passes too early. Fails the script after DUR (default
// 15s), showing the last run's exit code and output. Its stdout and
// stderr are those of the last run, for stdout/stderr checks after it.
// For a state that has to be reached (a roster converging, a name
// resolving); never for proving that something does not happen. A
// -match is not multi-line as a stdout check is: (?m) for a ^ or $ per
// line. No stdout check may follow it directly (what it would ask
// belongs in the wait): TestScriptWaitsHoldTheirChecks.
func cmdEventually(ts *testscript.TestScript, neg bool, args []string) {
	f, args := parseWaitFlags(ts, args, " -t -exit -match -nomatch ")
	if neg || len(args) == 0 {
		ts.Fatalf("usage: eventually [-t DUR] [-exit N] [-match REGEXP]... [-nomatch REGEXP]... CMD ARGS...")
	}
	deadline := time.Now().Add(f.limit)
	for {
		stdout, stderr, code := runOnce(ts, args)
		if code == f.exit && f.matches(stdout) {
			fmt.Fprint(ts.Stdout(), stdout)
			fmt.Fprint(ts.Stderr(), stderr)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("eventually: %s: not there within %v (want exit %d, match %v, no match %v); last run: exit %d\nstdout:\n%s\nstderr:\n%s",
				strings.Join(args, " "), f.limit, f.exit, f.match, f.nomatch, code, stdout, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// recv [-t DUR] [-n N] [-until REGEXP] ENTITY [ARGS...] — drain ENTITY's
// inbox with `fleet-recv --as ENTITY --json ARGS...`, again every 50ms,
// keeping everything it printed, until that holds at least N lines
// (default 1) and matches REGEXP (when given). Each run must exit 0. Prints
// all it kept on stdout (then check with stdout, or cp stdout FILE).
// Fails after DUR (default 15s), showing what it got. Mail is FIFO per
// recipient, so waiting for a sentinel sent after an unwanted message
// proves that message is not coming: recv -until sentinel, then ! stdout.
func cmdRecv(ts *testscript.TestScript, neg bool, args []string) {
	f, args := parseWaitFlags(ts, args, " -t -n -until ")
	if neg || len(args) == 0 {
		ts.Fatalf("usage: recv [-t DUR] [-n N] [-until REGEXP] ENTITY [ARGS...]")
	}
	if f.n == 0 {
		f.n = 1
	}
	argv := append([]string{"fleet-recv", "--as", args[0], "--json"}, args[1:]...)
	var got strings.Builder
	deadline := time.Now().Add(f.limit)
	for {
		stdout, stderr, code := runOnce(ts, argv)
		got.WriteString(stdout)
		if code != 0 {
			ts.Fatalf("recv: %s: exit %d\nstderr:\n%s\nreceived so far:\n%s", strings.Join(argv, " "), code, stderr, got.String())
		}
		all := got.String()
		if strings.Count(all, "\n") >= f.n && f.matches(all) {
			fmt.Fprint(ts.Stdout(), all)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("recv: %s: want %d line(s) matching %v within %v; got:\n%s", args[0], f.n, f.match, f.limit, all)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exitcode N CMD ARGS... — run CMD once, as exec would, and require exit
// status N; its stdout and stderr stay for the checks after it. (Checks
// the code where `! exec` only knows "not 0".)
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N CMD ARGS...")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	code := 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		code = ee.ExitCode()
	default:
		ts.Fatalf("%s: %v", args[1], err)
	}
	if code != want {
		ts.Fatalf("%s exited %d, want %d", args[1], code, want)
	}
}

// extract SRC REGEXP VAR — set $VAR, for the lines after it, to the first
// group of REGEXP's first match in SRC (a file, or stdout or stderr of the
// last command, which stay as they were). Fails when nothing matches.
// extract -o FILE SRC REGEXP — write that group to FILE instead.
// E.g. extract stdout '"msg_id":"([^"]+)"' ID, or a gid from roster
// lines: extract stdout '"name":"bob".*"gid":"([^"]+)"' BOB ('.' stops at
// a newline, so the match stays on bob's line).
func cmdExtract(ts *testscript.TestScript, neg bool, args []string) {
	out := ""
	if len(args) == 4 && args[0] == "-o" {
		out, args = args[1], append(args[2:], "")
	}
	if neg || len(args) != 3 {
		ts.Fatalf("usage: extract SRC REGEXP VAR | extract -o FILE SRC REGEXP")
	}
	re, err := regexp.Compile(args[1])
	ts.Check(err)
	if re.NumSubexp() < 1 {
		ts.Fatalf("extract: %q has no group", args[1])
	}
	data := ts.ReadFile(args[0])
	m := re.FindStringSubmatch(data)
	if m == nil {
		ts.Fatalf("extract: no match for %q in %s:\n%s", args[1], args[0], data)
	}
	if out != "" {
		ts.Check(os.WriteFile(ts.MkAbs(out), []byte(m[1]), 0o644))
		return
	}
	ts.Setenv(args[2], m[1])
	ts.Logf("%s=%s", args[2], m[1])
}

// expand IN OUT — write IN to OUT with $VAR and ${VAR} replaced by the
// script's variables (as on a script line); a variable that is not set or
// empty fails the script.
func cmdExpand(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: expand IN OUT")
	}
	text := os.Expand(ts.ReadFile(args[0]), func(k string) string {
		v := ts.Getenv(k)
		if v == "" {
			ts.Fatalf("expand: %s: $%s is not set", args[0], k)
		}
		return v
	})
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(text), 0o644))
}

// jsonlines FILE KEY... — FILE is non-empty and every line of it is a JSON
// object with each KEY (at its top level). With !, some line is not.
func cmdJSONLines(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: jsonlines FILE KEY...")
	}
	data := ts.ReadFile(args[0])
	bad := ""
	if data == "" {
		bad = "it is empty"
	}
	for i, line := range strings.Split(strings.TrimSuffix(data, "\n"), "\n") {
		if bad != "" {
			break
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			bad = fmt.Sprintf("line %d is not a JSON object: %v: %s", i+1, err, line)
			break
		}
		for _, k := range args[1:] {
			if _, ok := obj[k]; !ok {
				bad = fmt.Sprintf("line %d has no %q: %s", i+1, k, line)
				break
			}
		}
	}
	if (bad == "") == neg {
		if neg {
			ts.Fatalf("%s: every line is a JSON object with %v", args[0], args[1:])
		}
		ts.Fatalf("%s: %s", args[0], bad)
	}
}
