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
// text begins: the first positional argument after the recipient ("-",
// stdin, is not text). From there everything is text, even a word that is
// exactly an option of the command ("fleet-send bob fix this --wait" sends
// "fix this --wait"). A strict rule (fleet-bcast, which has no recipient:
// "fleet-bcast hello --group ops" would go to everyone) refuses such a
// word instead, in Main, with the two ways to say it.
func interspersed(app *cli.App, args []string) []string {
	out, _ := reorder(app, args)
	return out
}

// reorder is interspersed, and also returns, under a strict text rule,
// the first word of the text that is exactly one of the command's options
// ("" if none): "fleet-bcast hello --group ops" must not broadcast "hello
// --group ops" to everyone, so Main refuses it (64) and shows where the
// option goes.
func reorder(app *cli.App, args []string) ([]string, string) {
	if len(args) < 2 {
		return args, ""
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
			return append(out, rest[i+1:]...), ""
		case len(a) > 1 && a[0] == '-':
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			seen[name] = true
			out = append(out, a)
			if takesValue(flags, a) && !strings.Contains(a, "=") {
				if i+1 >= len(rest) {
					// a value flag written last: end with it, so
					// urfave/cli reports the missing value
					return out, ""
				}
				i++
				out = append(out, rest[i])
			}
		case rule.Lead != nil && a != "-" && len(pos) >= rule.Lead(seen):
			// the text begins: the rest is text, flag-like or not — but
			// under a strict rule a word that is exactly an option is
			// taken for a mistake
			out = append(out, "--")
			out = append(out, pos...)
			stray := ""
			for _, w := range rest[i:] {
				if rule.Strict && isOption(flags, w) {
					stray = w
					break
				}
			}
			return append(out, rest[i:]...), stray
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
	return out, ""
}

// isOption reports whether w is exactly one of flags (--name, -n,
// --name=value), or --help / -h.
func isOption(flags []cli.Flag, w string) bool {
	if !strings.HasPrefix(w, "-") || w == "-" {
		return false
	}
	name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
	if name == "help" || name == "h" {
		return true
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// textRuleDoc is the text rule as the man pages of fleet-send and
// fleet-ask say it; strictTextRuleDoc as fleet-bcast's does.
const (
	textRuleDoc = "Options go before the text: after the recipient, the first word that is not an option " +
		"begins the text, and everything from there is text, even a word that is an option " +
		"(\"fleet-send bob fix this --wait\" sends \"fix this --wait\" and does not wait). -- still ends the options; " +
		"a text that begins with - goes after it."
	strictTextRuleDoc = "Options go before the text: the first word that is not an option begins the text. " +
		"A word in it that is exactly an option (\"fleet-bcast hello --group ops\") is refused, neither read nor " +
		"sent to everyone; put the text after -- to send such words, or a text that begins with -."
)

// TextRule marks a command that takes a text: Lead says how many
// positional arguments come before it, given the flags seen so far (by
// name, without dashes); Strict refuses a word of the text that is exactly
// an option.
type TextRule struct {
	Lead   func(seen map[string]bool) int
	Strict bool
}

const textRuleKey = "fleet-text-rule"

// takesText gives app the text rule (strict: see TextRule).
func takesText(app *cli.App, lead func(seen map[string]bool) int, strict bool) {
	if app.Metadata == nil {
		app.Metadata = map[string]any{}
	}
	app.Metadata[textRuleKey] = TextRule{Lead: lead, Strict: strict}
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
