package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/near"
	"github.com/urfave/cli/v2"
)

// "Did you mean": a mistyped flag or command costs an agent a turn, so the
// hint names the nearest real one (edit distance at most 2, or a unique
// prefix), and a text that starts with "-" is told about "--".

// flagNames are every flag name of app and its commands, as typed ("--json", "-n").
func flagNames(app *cli.App) []string {
	seen := map[string]bool{}
	var out []string
	add := func(fs []cli.Flag) {
		for _, f := range fs {
			for _, n := range f.Names() {
				d := "--" + n
				if len(n) == 1 {
					d = "-" + n
				}
				if !seen[d] {
					seen[d] = true
					out = append(out, d)
				}
			}
		}
	}
	add(app.Flags)
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			add(c.Flags)
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	sort.Strings(out)
	return out
}

// CommandNames are app's subcommand names.
func CommandNames(app *cli.App) []string {
	var out []string
	for _, c := range app.Commands {
		out = append(out, c.Names()...)
	}
	return out
}

// UnknownCommand is the usage error for a word where a command of app was
// expected, with the nearest command as a hint.
func UnknownCommand(app *cli.App, word string) *fault.Error {
	e := usage("unknown command %q", word)
	if near := near.Closest(word, CommandNames(app)); near != "" {
		return e.WithHint("did you mean: %s %s? (see: %s --help)", app.Name, near, app.Name)
	}
	return e.WithHint("see: %s --help", app.Name)
}

// betterHint replaces the generic hint of an unknown flag or command that
// urfave/cli reported with the nearest real one, and tells a text that
// starts with "-" to come after "--".
func betterHint(app *cli.App, err error) {
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Kind != fault.KindUsage {
		return
	}
	msg := err.Error()
	if _, tok, ok := strings.Cut(msg, "flag provided but not defined: "); ok {
		tok = strings.TrimSpace(tok)
		var hints []string
		if !strings.ContainsAny(tok, " \t\n") {
			bare := strings.TrimLeft(tok, "-")
			if near := near.Closest(bare, trimDashes(flagNames(app))); near != "" {
				hints = append(hints, fmt.Sprintf("did you mean %s?", dashed(near)))
			}
		}
		hints = append(hints, fmt.Sprintf("a text that starts with \"-\" goes after --: %s [options] -- %s", app.Name, shellWord(tok)))
		fe.Hint = strings.Join(hints, " ")
		return
	}
	if _, word, ok := strings.Cut(msg, "no help topic for '"); ok {
		word = strings.TrimSuffix(word, "'")
		if near := near.Closest(word, CommandNames(app)); near != "" {
			fe.Msg, fe.Err = fmt.Sprintf("unknown command %q", word), nil
			fe.Hint = fmt.Sprintf("did you mean: %s %s?", app.Name, near)
		}
	}
}

func trimDashes(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strings.TrimLeft(n, "-")
	}
	return out
}

func dashed(n string) string {
	if len(n) == 1 {
		return "-" + n
	}
	return "--" + n
}

// shellWord quotes s for a shell when it needs it.
func shellWord(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
