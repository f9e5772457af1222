package docs

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/fleetd/fleet/pkg/cli/examples"
	"github.com/fleetd/fleet/pkg/config"
	ucli "github.com/urfave/cli/v2"
)

var configLine = regexp.MustCompile(`^([a-z][a-zA-Z0-9._-]*) = `)

// checkExamples parses every fleet command line in the examples and holds
// its command, flags and required flags to the definitions, the way
// pkg/cli reads them: a command's flags after the command, the app's
// before it. A line "key = value" must name a config key.
func checkExamples(apps []*ucli.App) error {
	byName := map[string]*ucli.App{}
	for _, a := range apps {
		byName[a.Name] = a
	}
	var errs []string
	for _, page := range examples.Names() {
		exs := examples.For(page)
		if byName[page] == nil {
			errs = append(errs, fmt.Sprintf("examples for %s, which is not in cli.Apps", page))
		}
		for _, ex := range exs {
			for _, line := range strings.Split(ex.Cmd, "\n") {
				if configLine.MatchString(line) {
					errs = append(errs, checkConfigLine(page+" example", line)...)
					continue
				}
				_, lineErrs := checkCommandLine(byName, line)
				for _, e := range lineErrs {
					errs = append(errs, fmt.Sprintf("%s example %q: %s", page, line, e))
				}
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	return errors.New("examples do not match the command definitions:\n\t" + strings.Join(errs, "\n\t"))
}

// checkConfigLine holds a "key = value" line to the config keys.
func checkConfigLine(where, line string) []string {
	m := configLine.FindStringSubmatch(line)
	if m == nil {
		return nil
	}
	for _, k := range config.Keys {
		if k.Name == m[1] {
			return nil
		}
	}
	if config.IsProfileKey(m[1]) {
		return nil
	}
	return []string{fmt.Sprintf("%s %q: no config key %s", where, line, m[1])}
}

// checkCommandLine checks every call of a fleet command in one shell line
// (after a pipe, in $( ), after a prompt or an assignment alike) and says
// how many it found.
func checkCommandLine(byName map[string]*ucli.App, line string) (int, []string) {
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []string
	calls := 0
	for _, name := range names {
		cs, err := examples.Calls(line, name)
		if err != nil {
			return 0, []string{err.Error()}
		}
		for _, args := range cs {
			calls++
			if err := checkInvocation(byName[name], args); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	return calls, errs
}

// shellWords is examples.Words, for the pages' code lines.
func shellWords(line string) ([]string, error) { return examples.Words(line) }

func isShellOperator(w string) bool { return examples.IsShellOperator(w) }

// checkInvocation checks the arguments of one call of app.
func checkInvocation(app *ucli.App, args []string) error {
	flags := withFlags(app.Flags, ucli.HelpFlag, ucli.VersionFlag)
	level := app.Name
	var cmd *ucli.Command
	set := map[string]bool{}
	npos := 0
loop:
	for i := 0; i < len(args); i++ {
		w := args[i]
		if isShellOperator(w) {
			break
		}
		last := strings.HasSuffix(w, ")") // the end of $( ... )
		w = strings.TrimSuffix(w, ")")
		switch {
		case w == "--":
			break loop
		case len(w) > 1 && w[0] == '-':
			name, _, inline := strings.Cut(strings.TrimLeft(w, "-"), "=")
			f := lookupFlag(flags, name)
			if f == nil {
				return fmt.Errorf("%s has no flag %s", level, w)
			}
			set[f.Names()[0]] = true
			if takesValue(f) && !inline {
				if i+1 >= len(args) || isShellOperator(args[i+1]) {
					return fmt.Errorf("%s %s needs a value", level, w)
				}
				i++
				last = last || strings.HasSuffix(args[i], ")")
			}
		default:
			if npos == 0 {
				cands := app.Commands
				if cmd != nil {
					cands = cmd.Subcommands
				}
				if c := findCommand(cands, w); c != nil {
					cmd, level = c, level+" "+c.Name
					flags = withFlags(c.Flags, ucli.HelpFlag)
					set = map[string]bool{}
					continue
				}
			}
			if cmd != nil && npos == 0 && len(cmd.Subcommands) > 0 { // fleet-roster hooks install
				if c := findCommand(cmd.Subcommands, w); c != nil {
					cmd, level = c, level+" "+c.Name
					flags = withFlags(c.Flags, ucli.HelpFlag)
					set = map[string]bool{}
					continue
				}
			}
			npos++
		}
		if last {
			break
		}
	}
	if cmd == nil && app.Action == nil && len(app.Commands) > 0 {
		return fmt.Errorf("%s needs a command", app.Name)
	}
	if cmd != nil && cmd.Action == nil && len(cmd.Subcommands) > 0 {
		return fmt.Errorf("%s needs a command", level)
	}
	for _, f := range flags {
		if r, ok := f.(ucli.RequiredFlag); ok && r.IsRequired() && !set[f.Names()[0]] {
			return fmt.Errorf("%s needs --%s", level, f.Names()[0])
		}
	}
	return nil
}

// withFlags returns a new slice: flags, then more that are not nil.
func withFlags(flags []ucli.Flag, more ...ucli.Flag) []ucli.Flag {
	out := append([]ucli.Flag(nil), flags...)
	for _, f := range more {
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}

func lookupFlag(flags []ucli.Flag, name string) ucli.Flag {
	for _, f := range flags {
		if f != nil && containsName(f, name) {
			return f
		}
	}
	return nil
}

func findCommand(cmds []*ucli.Command, name string) *ucli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func takesValue(f ucli.Flag) bool {
	d, ok := f.(ucli.DocGenerationFlag)
	return ok && d.TakesValue()
}
