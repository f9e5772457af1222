package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/near"
	"github.com/urfave/cli/v2"
)

// "Did you mean": a mistyped flag or command costs an agent a turn, so the
// hint names the nearest real one (edit distance at most 2, or a unique
// prefix); a text that starts with "-" is told about "--" (strayError).

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

// betterHint replaces the generic hint of an unknown command that
// urfave/cli reported with the nearest real one. (An unknown option never
// reaches urfave/cli: reorder refuses it, with its own hint.)
func betterHint(app *cli.App, err error) {
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Kind != fault.KindUsage {
		return
	}
	if _, word, ok := strings.Cut(err.Error(), "no help topic for '"); ok {
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
