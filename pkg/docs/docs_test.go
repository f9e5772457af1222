package docs

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/rosterapp"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

func apps() map[string]*ucli.App {
	m := map[string]*ucli.App{}
	for _, newApp := range AllApps() {
		a := newApp()
		m[a.Name] = a
	}
	return m
}

func TestRenderIsDeterministic(t *testing.T) {
	a, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := readPages()
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 4*len(AllApps())+len(ps) {
		t.Errorf("%d files, want 4 per app (%d apps) and one per page (%d)", len(a), len(AllApps()), len(ps))
	}
	for p, data := range a {
		if !bytes.Equal(data, b[p]) {
			t.Errorf("%s differs between two runs", p)
		}
	}
}

func TestManPages(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	for name := range apps() {
		page := string(files["man/"+name+".1"])
		if !strings.Contains(page, ".TH "+name+" 1") {
			t.Errorf("%s: not a section 1 page", name)
		}
		for _, sec := range []string{"NAME", "SYNOPSIS", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"} {
			if !strings.Contains(page, "\n.SH "+sec+"\n") {
				t.Errorf("%s: no %s section", name, sec)
			}
		}
		for _, e := range fault.Codes {
			code := strconv.Itoa(int(e.Code))
			if !strings.Contains(page, "\n.B "+code+"\n") {
				t.Errorf("%s: exit status %s is not listed", name, code)
			}
		}
		for _, env := range []string{"FLEET_CONFIG", "FLEET_SOCKET", "FLEET_STATE_DIR", "FLEET_UNCERTAIN"} {
			if !strings.Contains(page, "\n.B "+env+"\n") {
				t.Errorf("%s: %s is not listed", name, env)
			}
		}
		if strings.Contains(page, "\n.SH run\n") || strings.Contains(page, "\n.SH join\n") {
			t.Errorf("%s: a command is still a top-level section", name)
		}
	}
	if !strings.Contains(string(files["man/fleet-send.1"]), "\n.B FLEET_TOKEN\n") {
		t.Error("fleet-send: FLEET_TOKEN is not listed")
	}
}

func TestCompletionsOfferCommandsAndFlags(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	bash := string(files["completions/fleet-roster.bash"])
	zsh := string(files["completions/_fleet-roster"])
	for _, c := range []string{"join", "leave", "status", "dead", "list"} {
		if !strings.Contains(bash, c) || !strings.Contains(zsh, "'"+c+":") {
			t.Errorf("fleet-roster completions do not offer %s", c)
		}
	}
	if !strings.Contains(bash, "complete -F _fleet_roster fleet-roster") {
		t.Error("bash: no complete -F line")
	}
	if !strings.HasPrefix(zsh, "#compdef fleet-roster\n") {
		t.Error("zsh: no #compdef line")
	}
	if !strings.Contains(string(files["completions/fleet-recv.bash"]), "--follow -f --max -n") {
		t.Error("fleet-recv: bash does not offer --follow/-f and --max/-n")
	}
	fish := string(files["completions/fleet-roster.fish"])
	for _, c := range []string{"join", "leave", "status", "dead", "list"} {
		if !strings.Contains(fish, "-a '"+c+"' -d ") {
			t.Errorf("fleet-roster fish completion does not offer %s", c)
		}
	}
	if strings.Contains(bash+zsh+fish, rosterapp.CompleteCommand+" ") && strings.Contains(bash+zsh+fish, "'"+rosterapp.CompleteCommand+":") {
		t.Error("the hidden completion command is offered as a command")
	}
}

// TestCompletionsOfferChoices: every choice flag's values, as its
// definition lists them, are what bash, zsh and fish offer for it.
func TestCompletionsOfferChoices(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(app string, flags []ucli.Flag, cmds []*ucli.Command)
	walk = func(app string, flags []ucli.Flag, cmds []*ucli.Command) {
		for _, f := range flags {
			c, ok := f.(*cli.ChoiceFlag)
			if !ok {
				continue
			}
			n++
			words := strings.Join(c.Choices, " ")
			if !strings.Contains(string(files["completions/"+app+".bash"]), "compgen -W '"+words+"'") {
				t.Errorf("%s.bash: --%s does not offer %s", app, c.Name, words)
			}
			if !strings.Contains(string(files["completions/_"+app]), "]:"+c.Name+":("+words+")'") {
				t.Errorf("_%s: --%s does not offer %s", app, c.Name, words)
			}
			if !strings.Contains(string(files["completions/"+app+".fish"]), "-l "+c.Name+" -x -a '"+words+"'") {
				t.Errorf("%s.fish: --%s does not offer %s", app, c.Name, words)
			}
		}
		for _, c := range cmds {
			walk(app, c.Flags, c.Subcommands)
		}
	}
	for _, newApp := range AllApps() {
		app := newApp()
		walk(app.Name, app.Flags, app.Commands)
	}
	if n < 5 {
		t.Errorf("%d choice flags found; want --until, --mode, --turns, --paste, --header and more", n)
	}
}

func TestCheckInvocation(t *testing.T) {
	as := apps()
	for _, tc := range []struct {
		app, line, err string
	}{
		{"fleet-roster", "join alice --mode pull", ""},
		{"fleet-roster", "--socket /s join alice --mode=inject --exec cat", ""},
		{"fleet-roster", "join alice", "needs --mode"},
		{"fleet-roster", "join alice --mode pull --bogus /s", "no flag --bogus"},
		{"fleet-roster", "status --as bob busy", ""},
		{"fleet-roster", "--as bob status busy", ""}, // the top level takes --as (for --watch --text): a subcommand reads it,
		{"fleet-gw", "--state-dir /x", "no flag --state-dir"},
		{"fleet-gw", "", "needs a command"},
		{"fleet-gw", "run --uncertain reinject", ""},
		{"fleet-send", "--as alice bob - < report.txt", ""},
		{"fleet-send", "--to bob hi", "no flag --to"},
		{"fleet-recv", "-n 1 -f", ""},
		{"fleet-recv", "--status x", "no flag --status"},
		{"fleet-recv", "--as", "needs a value"},
		{"fleet-gw", "trust list --json", ""},
		{"fleet-gw", "trust add 'b KEY'", ""},
		{"fleet-gw", "trust", "fleet-gw trust needs a command"},
		{"fleet-gw", "trust list --bogus", "fleet-gw trust list has no flag --bogus"},
		{"fleet-roster", "hooks install claude --project /x --trust", ""},
		{"fleet-roster", "hooks install claude --watch 1s", "fleet-roster hooks install has no flag --watch"},
		{"fleet-roster", "hooks doctor claude --watch 60s", ""},
		{"fleet-gw", "run --host h1  # a comment --bogus", ""},
	} {
		words, err := shellWords(tc.line)
		if err != nil {
			t.Fatal(err)
		}
		err = checkInvocation(as[tc.app], words)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s %s: %v", tc.app, tc.line, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s %s: error %v, want one containing %q", tc.app, tc.line, err, tc.err)
		}
	}
}

func TestShellWords(t *testing.T) {
	got, err := shellWords(`a 'b c' "d \"e\"" f\ g $(x) a#b # c --d`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "b c", `d "e"`, "f g", "$(x)", "a#b"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("shellWords = %q, want %q", got, want)
	}
	if _, err := shellWords(`'open`); err == nil {
		t.Error("an unterminated quote is not an error")
	}
}

// Every command and subcommand of fleet reads its line by one rule
// (cli.CommandLineRule): an option of its level after an argument is read
// as that option, and a word that starts with "-" and is no option is
// refused (64), whatever the command.
func TestEveryCommandTakesOptionsAnywhere(t *testing.T) {
	var walk func(app *ucli.App, path []string, flags []ucli.Flag, cmds []*ucli.Command)
	walk = func(app *ucli.App, path []string, flags []ucli.Flag, cmds []*ucli.Command) {
		if len(flags) > 0 {
			opt := "--" + flags[0].Names()[0]
			words := []string{opt}
			if _, ok := flags[0].(*ucli.BoolFlag); !ok {
				words = append(words, "v")
			}
			line := append(append(slices.Clone(path), "arg"), words...)
			want := append(append(slices.Clone(path), words...), "--", "arg")
			if got, err := cli.Reorder(app, line); err != nil || !slices.Equal(got, want) {
				t.Errorf("%q: got %q, %v; want %q", line, got, err, want)
			}
			line = append(slices.Clone(path), "arg", "--no-such-option")
			if _, err := cli.Reorder(app, line); err == nil || fault.CodeOf(err) != fault.Usage ||
				!strings.Contains(err.Error(), "--no-such-option is not an option of "+strings.Join(path, " ")) {
				t.Errorf("%q: %v, want a usage error", line, err)
			}
		}
		for _, c := range cmds {
			walk(app, append(slices.Clone(path), c.Name), c.Flags, c.Subcommands)
		}
	}
	for _, newApp := range AllApps() {
		app := newApp()
		walk(app, []string{app.Name}, app.Flags, app.Commands)
	}
}
