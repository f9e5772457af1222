package cli

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// interspersed reorders args so that flags written after positional
// arguments are read: urfave/cli v2 stops parsing flags at the first
// positional argument and would silently take "fleet-send bob hi --json" as
// the text "hi --json". Flags move in front of the positional arguments of
// their own level (app or subcommand); everything after "--" stays text.
//
// A command that takes a text (TextRule) reads flags only up to where its
// text begins: "fleet-send bob fix this --wait" sends the text "fix this
// --wait" and does not wait. The text begins at the first positional
// argument after the recipient ("-", stdin, is not text).
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	flags := app.Flags
	commands := app.Commands
	rule, _ := app.Metadata[textRuleKey].(TextRule)
	seen := map[string]bool{}
	var pos []string
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		switch {
		case a == "--":
			out = append(out, "--")
			out = append(out, pos...)
			return append(out, rest[i+1:]...)
		case len(a) > 1 && a[0] == '-':
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			seen[name] = true
			out = append(out, a)
			if takesValue(flags, a) && !strings.Contains(a, "=") {
				if i+1 >= len(rest) {
					// a value flag written last: end with it, so
					// urfave/cli reports the missing value
					return out
				}
				i++
				out = append(out, rest[i])
			}
		case rule.Lead != nil && a != "-" && len(pos) >= rule.Lead(seen):
			// the text begins: the rest is text, flag-like or not
			out = append(out, "--")
			out = append(out, pos...)
			return append(out, rest[i:]...)
		default:
			if len(pos) == 0 {
				if cmd := findCommand(commands, a); cmd != nil {
					out = append(out, a)
					flags, commands = cmd.Flags, cmd.Subcommands
					continue
				}
			}
			pos = append(pos, a)
		}
	}
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}

// textRuleDoc is the text rule as the man pages of the commands that take
// a text say it.
const textRuleDoc = "Options go before the text: after the recipient, the first word that is not an option " +
	"begins the text, and everything from there on is text, options included (\"fleet-send bob fix this --wait\" " +
	"sends \"fix this --wait\"). A text that begins with - goes after --."

// TextRule marks a command that takes a text: Lead says how many
// positional arguments come before it, given the flags seen so far (by
// name, without dashes).
type TextRule struct {
	Lead func(seen map[string]bool) int
}

const textRuleKey = "fleet-text-rule"

// takesText gives app the text rule.
func takesText(app *cli.App, lead func(seen map[string]bool) int) {
	if app.Metadata == nil {
		app.Metadata = map[string]any{}
	}
	app.Metadata[textRuleKey] = TextRule{Lead: lead}
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether the flag token a names a flag that takes a
// value (any flag but a boolean one).
func takesValue(flags []cli.Flag, a string) bool {
	name := strings.TrimLeft(a, "-")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				_, isBool := f.(*cli.BoolFlag)
				return !isBool
			}
		}
	}
	return false
}
