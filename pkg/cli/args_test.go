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
		{"a flag after the text is text",
			[]string{"fleet-send", "bob", "hi", "--json"},
			[]string{"fleet-send", "--", "bob", "hi", "--json"}},
		{"flags after the text stay text, in order",
			[]string{"fleet-send", "bob", "fix", "this", "--wait", "--as", "alice"},
			[]string{"fleet-send", "--", "bob", "fix", "this", "--wait", "--as", "alice"}},
		{"flag value stays with its flag",
			[]string{"fleet-send", "bob", "--as", "alice", "hi", "there"},
			[]string{"fleet-send", "--as", "alice", "--", "bob", "hi", "there"}},
		{"flag=value form",
			[]string{"fleet-send", "bob", "--as=alice", "hi"},
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
		{"several flags between recipient and text",
			[]string{"fleet-send", "bob", "--socket", "/run/gw.sock", "--json", "--as", "alice", "hello", "world"},
			[]string{"fleet-send", "--socket", "/run/gw.sock", "--json", "--as", "alice", "--", "bob", "hello", "world"}},
		{"everything after -- is text, in order",
			[]string{"fleet-send", "bob", "--json", "--", "--as", "x", "-", "--json", "y"},
			[]string{"fleet-send", "--json", "--", "bob", "--as", "x", "-", "--json", "y"}},
		{"-- first",
			[]string{"fleet-send", "--", "bob", "--json"},
			[]string{"fleet-send", "--", "bob", "--json"}},
		{"lone dash is positional",
			[]string{"fleet-send", "bob", "-", "--json"},
			[]string{"fleet-send", "--json", "--", "bob", "-"}},
		{"lone dash after flags",
			[]string{"fleet-send", "--as", "alice", "bob", "-"},
			[]string{"fleet-send", "--as", "alice", "--", "bob", "-"}},
		{"flag value that looks like a flag",
			[]string{"fleet-send", "bob", "--as", "-weird", "hi"},
			[]string{"fleet-send", "--as", "-weird", "--", "bob", "hi"}},
		{"reply-to takes a value",
			[]string{"fleet-send", "thanks", "--reply-to", "m-1", "a", "lot"},
			[]string{"fleet-send", "--reply-to", "m-1", "--", "thanks", "a", "lot"}},
		{"unknown flag before the text moves in front, to be refused",
			[]string{"fleet-send", "bob", "-x", "hi"},
			[]string{"fleet-send", "-x", "--", "bob", "hi"}},
		{"a reply has no recipient: its text begins at once",
			[]string{"fleet-send", "--reply-to", "m-1", "thanks", "--json"},
			[]string{"fleet-send", "--reply-to", "m-1", "--", "thanks", "--json"}},
		{"flags only",
			[]string{"fleet-send", "--status", "m-1", "--json"},
			[]string{"fleet-send", "--status", "m-1", "--json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.in)
			got := interspersed(NewSendApp(), in)
			if !slices.Equal(got, tc.want) {
				t.Errorf("interspersed(%q)\n got  %q\n want %q", tc.in, got, tc.want)
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
}

// sendCall is what fleet-send's action saw.
type sendCall struct {
	ran      bool
	json     bool
	as, to   string
	args     []string
	parseErr error
}

// runSendParsed runs the real fleet-send app with its action replaced, so the
// test sees exactly what urfave/cli parsed from args.
func runSendParsed(t *testing.T, args []string, reorder bool) sendCall {
	t.Helper()
	app := NewSendApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	var got sendCall
	app.Action = func(c *cli.Context) error {
		got = sendCall{ran: true, json: c.Bool("json"), as: c.String("as"), to: c.String("reply-to"), args: c.Args().Slice()}
		return nil
	}
	if reorder {
		args = interspersed(app, args)
	}
	got.parseErr = app.Run(args)
	return got
}

// After the recipient, the text: a known flag is read only before it; a
// word of the text that is exactly an option is text — reported (Main
// refuses it) only under fleet-bcast's strict rule; "--" still ends the
// flags; an unknown flag before the text is refused.
func TestOptionInTheTextIsReported(t *testing.T) {
	for _, tc := range []struct {
		app   func() *cli.App
		args  []string
		stray string
	}{
		{NewSendApp, []string{"fleet-send", "bob", "fix", "this", "--wait"}, ""},
		{NewSendApp, []string{"fleet-send", "bob", "hi", "--as=alice"}, ""},
		{NewAskApp, []string{"fleet-ask", "bob", "why", "-h"}, ""},
		{NewBcastApp, []string{"fleet-bcast", "hello", "--group", "ops"}, "--group"},
		{NewBcastApp, []string{"fleet-bcast", "hi", "-h"}, "-h"},
		{NewSendApp, []string{"fleet-send", "bob", "run", "--no-verify"}, ""},
		{NewSendApp, []string{"fleet-send", "bob", "--", "fix", "--wait"}, ""},
		{NewSendApp, []string{"fleet-send", "bob", "--wait", "fix"}, ""},
	} {
		if _, got := reorder(tc.app(), tc.args); got != tc.stray {
			t.Errorf("reorder(%q): stray %q, want %q", tc.args, got, tc.stray)
		}
	}
}

func TestSendTextAfterRecipient(t *testing.T) {
	got := runSendParsed(t, []string{"fleet-send", "bob", "--json", "--as", "alice", "hi", "--json", "there"}, true)
	if got.parseErr != nil || !got.ran {
		t.Fatalf("Run: %v", got.parseErr)
	}
	if !got.json || got.as != "alice" || !slices.Equal(got.args, []string{"bob", "hi", "--json", "there"}) {
		t.Errorf("parsed %+v, want json, as alice, args [bob hi --json there]", got)
	}

	got = runSendParsed(t, []string{"fleet-send", "bob", "fix", "this", "--wait"}, true)
	if got.parseErr != nil || !slices.Equal(got.args, []string{"bob", "fix", "this", "--wait"}) {
		t.Errorf("a flag after the text: parsed %+v", got)
	}

	got = runSendParsed(t, []string{"fleet-send", "bob", "--", "--json", "-", "-x"}, true)
	if got.parseErr != nil || got.json || !slices.Equal(got.args, []string{"bob", "--json", "-", "-x"}) {
		t.Errorf("text after --: parsed %+v", got)
	}

	got = runSendParsed(t, []string{"fleet-send", "bob", "-"}, true)
	if got.parseErr != nil || !slices.Equal(got.args, []string{"bob", "-"}) {
		t.Errorf("lone dash: parsed %+v", got)
	}

	got = runSendParsed(t, []string{"fleet-send", "bob", "-x", "hi"}, true)
	if got.parseErr == nil || got.ran {
		t.Errorf("an unknown flag before the text was not refused: %+v", got)
	}
}

// A value-taking flag written last, with no value, must be refused as a
// usage error. interspersed puts the "--" it adds right after the flag, and
// urfave/cli then takes "--" as the flag's value.
func TestDanglingValueFlagIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"fleet-send", "bob", "--as"},
		{"fleet-send", "--reply-to"},
		{"fleet-send", "bob", "--status"},
	} {
		got := runSendParsed(t, args, true)
		if got.parseErr == nil || got.ran {
			t.Errorf("%q: ran with %+v, want a usage error", args, got)
		}
	}
}

func TestWantsJSONStopsAtDoubleDash(t *testing.T) {
	for args, want := range map[string]bool{
		"fleet-send --json bob hi":    true,
		"fleet-send -json bob hi":     true,
		"fleet-send bob -- hi --json": false,
		"fleet-send bob hi":           false,
		"fleet-send --json":           true,
	} {
		if got := wantsJSON(strings.Fields(args)); got != want {
			t.Errorf("wantsJSON(%q) = %v, want %v", args, got, want)
		}
	}
}

// Report prints a message as written: names and kinds keep their case.
func TestReportKeepsTheMessage(t *testing.T) {
	var b strings.Builder
	Report(&b, "fleet-roster", fault.New(fault.Usage, fault.KindNameTaken, "Alice is already registered (SPAWN_RESULT)").WithHint("choose another"), false)
	want := "fleet-roster: error: Alice is already registered (SPAWN_RESULT)\nfleet-roster: hint: choose another\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}
