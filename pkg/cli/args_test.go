package cli

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/urfave/cli/v2"
)

func TestInterspersedSend(t *testing.T) {
	cases := []struct {
		name     string
		in, want []string
	}{
		{"program only", []string{"fleet-send"}, []string{"fleet-send"}},
		{"no args at all", []string{}, []string{}},
		{"an option after the text is read",
			[]string{"fleet-send", "main2", "a markdown list:", "--json"},
			[]string{"fleet-send", "--json", "--", "main2", "a markdown list:"}},
		{"options after the text, in order",
			[]string{"fleet-send", "bob", "fix", "this", "--wait", "--as", "alice"},
			[]string{"fleet-send", "--wait", "--as", "alice", "--", "bob", "fix", "this"}},
		{"a quoted text is one word, whatever it contains",
			[]string{"fleet-send", "bob", "a --json in quotes"},
			[]string{"fleet-send", "--", "bob", "a --json in quotes"}},
		{"flag value stays with its flag",
			[]string{"fleet-send", "bob", "--as", "alice", "hi", "there"},
			[]string{"fleet-send", "--as", "alice", "--", "bob", "hi", "there"}},
		{"flag=value form",
			[]string{"fleet-send", "bob", "hi", "--as=alice"},
			[]string{"fleet-send", "--as=alice", "--", "bob", "hi"}},
		{"single dash flag with value",
			[]string{"fleet-send", "bob", "-as", "alice", "hi"},
			[]string{"fleet-send", "-as", "alice", "--", "bob", "hi"}},
		{"bool flag does not take the next word",
			[]string{"fleet-send", "bob", "--json", "hi"},
			[]string{"fleet-send", "--json", "--", "bob", "hi"}},
		{"flags already in front",
			[]string{"fleet-send", "--json", "--socket", "/s", "bob", "hi"},
			[]string{"fleet-send", "--json", "--socket", "/s", "--", "bob", "hi"}},
		{"everything after -- is text, in order",
			[]string{"fleet-send", "bob", "--json", "--", "--as", "x", "-", "--json", "y"},
			[]string{"fleet-send", "--json", "--", "bob", "--as", "x", "-", "--json", "y"}},
		{"arguments on both sides of --",
			[]string{"fleet-send", "bob", "list:", "--", "- item"},
			[]string{"fleet-send", "--", "bob", "list:", "- item"}},
		{"-- first",
			[]string{"fleet-send", "--", "bob", "--json"},
			[]string{"fleet-send", "--", "bob", "--json"}},
		{"-- last",
			[]string{"fleet-send", "--json", "--"},
			[]string{"fleet-send", "--json", "--"}},
		{"lone dash is an argument",
			[]string{"fleet-send", "bob", "-", "--json"},
			[]string{"fleet-send", "--json", "--", "bob", "-"}},
		{"a value that starts with a dash, not an option",
			[]string{"fleet-send", "bob", "--as", "-weird", "hi"},
			[]string{"fleet-send", "--as", "-weird", "--", "bob", "hi"}},
		{"a value option followed by an option takes the next argument",
			[]string{"fleet-send", "--status", "--json", "m-1"},
			[]string{"fleet-send", "--json", "--status", "m-1"}},
		{"--status ID --json",
			[]string{"fleet-send", "--status", "m-1", "--json"},
			[]string{"fleet-send", "--status", "m-1", "--json"}},
		{"the TTL after the question",
			[]string{"fleet-ask", "bob", "late question", "--ttl", "1s"},
			[]string{"fleet-ask", "--ttl", "1s", "--", "bob", "late question"}},
		{"--until after the text",
			[]string{"fleet-send", "wpy", "x", "--until", "read", "--timeout", "3s"},
			[]string{"fleet-send", "--until", "read", "--timeout", "3s", "--", "wpy", "x"}},
		{"--help anywhere",
			[]string{"fleet-send", "bob", "hi", "-h"},
			[]string{"fleet-send", "-h", "--", "bob", "hi"}},
		{"--version at the top",
			[]string{"fleet-send", "bob", "--version"},
			[]string{"fleet-send", "--version", "--", "bob"}},
		{"a completion request is left as typed",
			[]string{"fleet-send", "bob", "-x", "--generate-bash-completion"},
			[]string{"fleet-send", "bob", "-x", "--generate-bash-completion"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			app := NewSendApp()
			if len(in) > 0 && in[0] == "fleet-ask" {
				app = NewAskApp()
			}
			got, err := reorder(app, in)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("reorder(%q)\n got  %q, %v\n want %q", tc.in, got, err, tc.want)
			}
			if !slices.Equal(in, tc.in) {
				t.Errorf("the input was modified: %q", in)
			}
		})
	}
}

func TestInterspersedRecvAliases(t *testing.T) {
	got := interspersed(NewRecvApp(), []string{"fleet-recv", "extra", "-n", "3", "-f"})
	want := []string{"fleet-recv", "-n", "3", "-f", "--", "extra"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// a value that starts with a dash but is no option: -n's value
	got = interspersed(NewRecvApp(), []string{"fleet-recv", "-n", "-1"})
	want = []string{"fleet-recv", "-n", "-1"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A word that starts with "-" and is no option of the command is refused
// (64), never taken for text or guessed at; the hint gives the nearest
// option, and where the word stands in a text, the line that sends it:
// after --, or on stdin.
func TestStrayWordIsRefused(t *testing.T) {
	for _, tc := range []struct {
		app       func() *cli.App
		args      []string
		msg, hint string
	}{
		{NewSendApp, []string{"fleet-send", "bob", "- item"},
			`'- item' is not an option of fleet-send`,
			`a text that starts with "-" goes after --: fleet-send bob -- '- item' (or comes on stdin: fleet-send bob -)`},
		{NewSendApp, []string{"fleet-send", "bob", "a markdown list:", "- one", "--json"},
			`'- one' is not an option of fleet-send`,
			`a text that starts with "-" goes after --: fleet-send --json bob -- 'a markdown list:' '- one' (or comes on stdin: fleet-send --json bob -)`},
		{NewSendApp, []string{"fleet-send", "--reply-to", "m-1", "-v is broken"},
			`'-v is broken' is not an option of fleet-send`,
			`goes after --: fleet-send --reply-to m-1 -- '-v is broken' (or comes on stdin: fleet-send --reply-to m-1 -)`},
		{NewSendApp, []string{"fleet-send", "--jsn", "bob", "hi"},
			`--jsn is not an option of fleet-send`, `did you mean --json?`},
		{NewSendApp, []string{"fleet-send", "bob", "run", "it", "--no-verify"},
			`--no-verify is not an option of fleet-send`, `fleet-send bob -- run it --no-verify`},
		{NewSendApp, []string{"fleet-send", "-x", "bob", "hi"},
			`-x is not an option of fleet-send`, `see: fleet-send --help`},
		{NewBcastApp, []string{"fleet-bcast", "- item", "--group", "ops"},
			`'- item' is not an option of fleet-bcast`,
			`fleet-bcast --group ops -- '- item' (or comes on stdin: fleet-bcast --group ops -)`},
		{NewAskApp, []string{"fleet-ask", "bob", "why", "-ttl=1s", "-x"},
			`-x is not an option of fleet-ask`, `fleet-ask -ttl=1s bob -- why -x`},
		{NewSpawnApp, []string{"fleet-spawn", "w", "--verbose"},
			`--verbose is not an option of fleet-spawn`, `arguments that start with "-" go after --: fleet-spawn w -- --verbose`},
		{NewRecvApp, []string{"fleet-recv", "--folow"},
			`--folow is not an option of fleet-recv`, `did you mean --follow?`},
		{NewSendApp, []string{"fleet-send", "bob", "-\x1b[2J"},
			`"-\x1b[2J" is not an option of fleet-send`, `fleet-send bob -- TEXT...`},
	} {
		_, err := reorder(tc.app(), tc.args)
		if err == nil || fault.CodeOf(err) != 64 || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(fault.HintOf(err), tc.hint) {
			t.Errorf("reorder(%q):\n got  %v (hint %q)\n want %q, hint with %q", tc.args, err, fault.HintOf(err), tc.msg, tc.hint)
		}
	}
}

// sendCall is what fleet-send's action saw.
type sendCall struct {
	ran      bool
	json     bool
	as, to   string
	status   string
	args     []string
	parseErr error
}

// runSendParsed runs the real fleet-send app through Main with its action
// replaced, so the test sees exactly what was parsed from args.
func runSendParsed(t *testing.T, args []string) sendCall {
	t.Helper()
	app := NewSendApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	var got sendCall
	app.Action = func(c *cli.Context) error {
		got = sendCall{ran: true, json: c.Bool("json"), as: c.String("as"), to: c.String("reply-to"),
			status: c.String("status"), args: c.Args().Slice()}
		return nil
	}
	if code := Main(app, args); code != 0 {
		got.parseErr = fault.New(fault.Code(code), fault.KindUsage, "exit %d", code)
	}
	return got
}

// The forms of issue 25, parsed by the real app: options anywhere up to
// --; a quoted body is one argument; after -- everything is text.
func TestOptionsAnywhere(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		want   sendCall
		reason string
	}{
		{[]string{"fleet-send", "main2", "a markdown list:", "--json"},
			sendCall{json: true, args: []string{"main2", "a markdown list:"}}, "--json after the text"},
		{[]string{"fleet-send", "bob", "a --json in quotes"},
			sendCall{args: []string{"bob", "a --json in quotes"}}, "a quoted body"},
		{[]string{"fleet-send", "bob", "--json", "--as", "alice", "hi", "--", "--json", "there"},
			sendCall{json: true, as: "alice", args: []string{"bob", "hi", "--json", "there"}}, "after --"},
		{[]string{"fleet-send", "--status", "--json", "m-1"},
			sendCall{json: true, status: "m-1", args: []string{}}, "--status --json ID"},
		{[]string{"fleet-send", "--status", "m-1", "--json"},
			sendCall{json: true, status: "m-1", args: []string{}}, "--status ID --json"},
		{[]string{"fleet-send", "bob", "-"},
			sendCall{args: []string{"bob", "-"}}, "stdin"},
		{[]string{"fleet-send", "thanks", "--reply-to", "m-1", "a", "lot"},
			sendCall{to: "m-1", args: []string{"thanks", "a", "lot"}}, "--reply-to among the text"},
	} {
		got := runSendParsed(t, tc.args)
		tc.want.ran = true
		if got.parseErr != nil || !got.ran || got.json != tc.want.json || got.as != tc.want.as || got.to != tc.want.to ||
			got.status != tc.want.status || !slices.Equal(got.args, tc.want.args) {
			t.Errorf("%s: %q parsed %+v, want %+v", tc.reason, tc.args, got, tc.want)
		}
	}
	for _, args := range [][]string{
		{"fleet-send", "bob", "- item"},
		{"fleet-send", "bob", "-x", "hi"},
		{"fleet-send", "bob", "hi", "--bogus"},
	} {
		if got := runSendParsed(t, args); got.ran || got.parseErr == nil || fault.CodeOf(got.parseErr) != 64 {
			t.Errorf("%q: ran with %+v, want exit 64", args, got)
		}
	}
}

// A value option with no value is refused as a usage error, never handed
// the "--" that reorder adds, nor the next option.
func TestDanglingValueFlagIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"fleet-send", "bob", "--as"},
		{"fleet-send", "--reply-to"},
		{"fleet-send", "bob", "--status"},
		{"fleet-send", "--status", "--json"},
		{"fleet-send", "--as", "--", "bob", "hi"},
	} {
		got := runSendParsed(t, args)
		if got.parseErr == nil || got.ran {
			t.Errorf("%q: ran with %+v, want a usage error", args, got)
		}
		if _, err := reorder(NewSendApp(), args); err == nil || !strings.Contains(err.Error(), "needs a value") {
			t.Errorf("%q: %v, want \"needs a value\"", args, err)
		}
	}
}

// Option values are checked before anything is sent: these never reach the
// gateway (no socket is there to reach), they end in 64.
func TestSendChecksOptionsFirst(t *testing.T) {
	t.Setenv("FLEET_SOCKET", t.TempDir()+"/none.sock")
	for _, args := range [][]string{
		{"fleet-send", "--until", "read", "--timeout", "3s", "wpy", "x"},
		{"fleet-send", "wpy", "x", "--until", "read"},
		{"fleet-send", "--timeout", "0s", "--wait", "wpy", "x"},
		{"fleet-send", "--wait", "--until", "delivered", "wpy", "x"},
		{"fleet-send", "--status", "m-1", "--reply-to", "m-2"},
		{"fleet-send", "--reply-to", "m-1", "--answer", "a-1", "x"},
		{"fleet-send", "--status", "", "wpy", "x"},
	} {
		var stderr strings.Builder
		app := NewSendApp()
		app.Writer, app.ErrWriter = io.Discard, &stderr
		if code := Main(app, args); code != 64 || strings.Contains(stderr.String(), "no gateway") {
			t.Errorf("%q: exit %d, stderr %q; want 64 before any gateway is asked", args, code, stderr.String())
		}
	}
	var stderr strings.Builder
	app := NewAskApp()
	app.Writer, app.ErrWriter = io.Discard, &stderr
	if code := Main(app, []string{"fleet-ask", "bob", "q", "--ttl", "0s"}); code != 64 || !strings.Contains(stderr.String(), "--ttl must be positive") {
		t.Errorf("fleet-ask --ttl 0s: exit %d, stderr %q", code, stderr.String())
	}
}
