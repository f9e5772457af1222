package cli

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fleetd/fleet/pkg/cli/examples"
	"github.com/urfave/cli/v2"
)

// Every --help ends with EXAMPLES, from the same table as the man page's
// (pkg/cli/examples): the app's help shows them all, a command's help
// those that call it (fleet-roster join --help: the joins). They are
// attached only when the line asks for help, so a command that runs pays
// nothing for them.

// helpWords are the words that ask for help, wherever they stand up to --.
var helpWords = []string{"-h", "--help", "-help", "--h"}

// wantsHelp reports whether urfave/cli will print a help page for args:
// a help option, or an app with commands and no action called bare.
func wantsHelp(app *cli.App, args []string) bool {
	if len(args) == 1 && app.Action == nil && len(app.Commands) > 0 {
		return true
	}
	for _, a := range args[1:] {
		if a == "--" {
			return false
		}
		if slices.Contains(helpWords, a) {
			return true
		}
	}
	return false
}

// attachExamples gives app's help, and each command's, its EXAMPLES.
func attachExamples(app *cli.App) {
	exs := examples.For(app.Name)
	if len(exs) == 0 {
		return
	}
	// the command paths each example calls (nil: the app itself)
	paths := make([][][]string, len(exs))
	for i, ex := range exs {
		for _, line := range strings.Split(ex.Cmd, "\n") {
			calls, err := examples.Calls(line, app.Name)
			if err != nil {
				continue
			}
			for _, args := range calls {
				paths[i] = append(paths[i], commandPath(app, append([]string{app.Name}, args...)))
			}
		}
	}
	base := app.CustomAppHelpTemplate
	if base == "" {
		base = cli.AppHelpTemplate
	}
	app.CustomAppHelpTemplate = base + examplesTemplate(exs)
	var walk func(cmds []*cli.Command, parent []string)
	walk = func(cmds []*cli.Command, parent []string) {
		for _, c := range cmds {
			path := append(slices.Clone(parent), c.Name)
			var mine []examples.Example
			for i, ex := range exs {
				if slices.ContainsFunc(paths[i], func(p []string) bool { return hasPrefix(p, path) }) {
					mine = append(mine, ex)
				}
			}
			if len(mine) > 0 && c.CustomHelpTemplate == "" {
				t := cli.CommandHelpTemplate
				if len(c.Subcommands) > 0 {
					t = cli.SubcommandHelpTemplate
				}
				c.CustomHelpTemplate = t + examplesTemplate(mine)
			}
			walk(c.Subcommands, path)
		}
	}
	walk(app.Commands, nil)
}

func hasPrefix(p, prefix []string) bool {
	return len(p) >= len(prefix) && slices.Equal(p[:len(prefix)], prefix)
}

// examplesTemplate is the EXAMPLES section as a text/template constant.
func examplesTemplate(exs []examples.Example) string {
	return "{{" + strconv.Quote(ExamplesText(exs)) + "}}"
}

// ExamplesText is the EXAMPLES section of a --help: each example's text,
// wrapped, then its lines as they are typed, indented.
func ExamplesText(exs []examples.Example) string {
	var b strings.Builder
	b.WriteString("\nEXAMPLES:\n")
	for i, ex := range exs {
		if i > 0 {
			b.WriteString("\n")
		}
		for _, l := range wrapWords(ex.Text, 76) {
			b.WriteString("   " + l + "\n")
		}
		for _, l := range strings.Split(ex.Cmd, "\n") {
			b.WriteString("       " + l + "\n")
		}
	}
	return b.String()
}

// wrapWords breaks text into lines of at most width bytes where it can.
func wrapWords(text string, width int) []string {
	var lines []string
	cur := ""
	for _, w := range strings.Fields(text) {
		switch {
		case cur == "":
			cur = w
		case len(cur)+1+len(w) > width:
			lines = append(lines, cur)
			cur = w
		default:
			cur += " " + w
		}
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}
