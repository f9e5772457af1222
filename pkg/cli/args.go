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
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	flags := app.Flags
	commands := app.Commands
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
