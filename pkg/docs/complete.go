package docs

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/rosterapp"
	ucli "github.com/urfave/cli/v2"
)

// Shell completions: static scripts built from an app's flags, commands,
// subcommands and argument usage, for bash, zsh and fish alike. They offer
// the flags of the level the cursor is at (the app's before its command, a
// command's after it, as pkg/cli reads them), the commands and
// subcommands, and values where the kind of value is known: a choice
// flag's values from its definition (cli.ChoiceFlag), files, folders,
// commands, and what only the running fleet knows (entities, hosts,
// groups, profiles, trusted hosts), asked of it at completion time.

// valueKind says how to complete the value of a flag, by flag name: a
// kind of dynamic (below), "file", "dir" or "command". A flag not listed,
// and not a choice flag, takes free text: nothing is offered.
var valueKind = map[string]string{
	"config":      "file",
	"socket":      "file",
	"state-dir":   "dir",
	"broker-ca":   "file",
	"broker-cert": "file",
	"broker-key":  "file",
	"output":      "file",
	"project":     "dir",
	"exec":        "command",
	"nudge":       "command",
	"as":          "entity",
	"to":          "entity",
	"from":        "entity",
	"entity":      "entity",
	"mcp":         "entity",
	"host":        "host",
	"group":       "group",
	"add":         "group",
	"remove":      "group",
	"profile":     "profile",
}

// appValueKind overrides valueKind for one app's flag, "APP:FLAG":
// fleet-gw --host is the gateway's own id (or, for broker-setup, a host
// that may not run yet), not one of the fleet's hosts.
var appValueKind = map[string]string{
	"fleet-gw:host": "",
}

// argKind overrides what a level's first argument is, "APP LEVEL", and
// whether more arguments follow it; by default an enumeration
// ("busy|idle") gives its words and NAME an entity.
var argKind = map[string]struct {
	kind string
	more bool
}{
	"fleet-roster join":     {"", false},              // a new name
	"fleet-gw trust.add":    {"untrusted-host", true}, // a host heard of but not yet trusted, then its KEY
	"fleet-gw trust.remove": {"trusted-host", false},
}

// dynamic is, for each kind of value only the running fleet knows, the
// shell command that prints them one a line (in bash, zsh and fish alike;
// nothing, and no noise, when no gateway answers). The roster's come from
// fleet-roster's hidden completion command.
var dynamic = map[string]string{
	"entity":         complete("entities"),
	"host":           complete("hosts"),
	"group":          complete("groups"),
	"profile":        complete("profiles"),
	"untrusted-host": complete("untrusted-hosts"),
	"trusted-host":   "fleet-gw trust list 2>/dev/null | cut -d ' ' -f 1",
}

func complete(kind string) string {
	return "fleet-roster " + rosterapp.CompleteCommand + " " + kind + " 2>/dev/null"
}

// valueHint is how to complete one value.
type valueHint struct {
	kind  string   // a key of dynamic, "file", "dir", "command" or "" (free text)
	words []string // a fixed set of values
}

func (h valueHint) none() bool { return h.kind == "" && h.words == nil }

// flagSpec is one flag as the completions see it.
type flagSpec struct {
	name   string   // first name, without dashes
	spell  []string // every spelling: --name, -n
	value  bool     // takes a value
	repeat bool     // may be given more than once
	usage  string
	hint   valueHint
	help   bool // --help or --version: nothing else follows
}

// level is the app itself (id "") or one of its commands or subcommands
// (id "trust", "trust.add").
type level struct {
	id    string
	cmd   *ucli.Command // nil for the app
	flags []flagSpec
	args  string    // argument usage, e.g. "NAME" or "busy|idle"
	arg   valueHint // the first argument's values
	more  bool      // more arguments follow the first (a text)
	cmds  []*ucli.Command
}

func specs(app string, flags []ucli.Flag, hideHelp, hideVersion bool) []flagSpec {
	var all []ucli.Flag
	for _, f := range flags {
		if v, ok := f.(ucli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		all = append(all, f)
	}
	special := map[ucli.Flag]bool{}
	if !hideHelp && ucli.HelpFlag != nil {
		all = append(all, ucli.HelpFlag)
		special[ucli.HelpFlag] = true
	}
	if !hideVersion && ucli.VersionFlag != nil {
		all = append(all, ucli.VersionFlag)
		special[ucli.VersionFlag] = true
	}
	var out []flagSpec
	for _, f := range all {
		s := flagSpec{name: f.Names()[0], value: takesValue(f), help: special[f]}
		for _, n := range f.Names() {
			if len(n) == 1 {
				s.spell = append(s.spell, "-"+n)
			} else {
				s.spell = append(s.spell, "--"+n)
			}
		}
		if d, ok := f.(ucli.DocGenerationFlag); ok {
			s.usage = d.GetUsage()
		}
		if sl, ok := f.(ucli.DocGenerationSliceFlag); ok {
			s.repeat = sl.IsSliceFlag()
		}
		if s.value {
			s.hint = flagHint(app, f)
		}
		out = append(out, s)
	}
	return out
}

// flagHint is how to complete f's value: its choices, else by its name.
func flagHint(app string, f ucli.Flag) valueHint {
	if c, ok := f.(*cli.ChoiceFlag); ok {
		return valueHint{words: c.Choices}
	}
	name := f.Names()[0]
	if k, ok := appValueKind[app+":"+name]; ok {
		return valueHint{kind: k}
	}
	return valueHint{kind: valueKind[name]}
}

// levels is the app's, then every visible command's and subcommand's,
// depth first.
func levels(app *ucli.App) []level {
	top := level{flags: specs(app.Name, app.Flags, app.HideHelp, app.HideVersion), args: appArgs(app), cmds: visible(app.Commands)}
	top.arg, top.more = argHint(app.Name, "", top.args)
	ls := []level{top}
	var walk func(parent string, cmds []*ucli.Command)
	walk = func(parent string, cmds []*ucli.Command) {
		for _, c := range visible(cmds) {
			id := c.Name
			if parent != "" {
				id = parent + "." + c.Name
			}
			l := level{id: id, cmd: c, flags: specs(app.Name, c.Flags, c.HideHelp, true), args: c.ArgsUsage, cmds: visible(c.Subcommands)}
			l.arg, l.more = argHint(app.Name, id, l.args)
			ls = append(ls, l)
			walk(id, c.Subcommands)
		}
	}
	walk("", app.Commands)
	return ls
}

func visible(cmds []*ucli.Command) []*ucli.Command {
	var out []*ucli.Command
	for _, c := range cmds {
		if !c.Hidden {
			out = append(out, c)
		}
	}
	return out
}

// argHint is how to complete a level's first argument, and whether more
// arguments follow it.
func argHint(app, id, args string) (valueHint, bool) {
	if k, ok := argKind[app+" "+id]; ok {
		return valueHint{kind: k.kind}, k.more
	}
	if words := argWords(args); words != nil {
		return valueHint{words: words}, false
	}
	if entityArg.MatchString(args) {
		return valueHint{kind: "entity"}, strings.Contains(strings.TrimPrefix(args, "["), " ")
	}
	return valueHint{}, false
}

// appArgs is the app's argument usage: ArgsUsage, else what the first line
// of UsageText shows after "NAME [options]". An app with commands takes a
// command.
func appArgs(app *ucli.App) string {
	if len(app.Commands) > 0 {
		return ""
	}
	if app.ArgsUsage != "" {
		return app.ArgsUsage
	}
	first, _, _ := strings.Cut(app.UsageText, "\n")
	rest := strings.TrimSpace(strings.TrimPrefix(first, app.Name))
	rest = strings.TrimSpace(strings.TrimPrefix(rest, "[options]"))
	return rest
}

var enumArgs = regexp.MustCompile(`^\[?([a-z]+(\|[a-z]+)+)\]?$`)

// entityArg is an argument usage whose first argument names an entity
// ("NAME|NAME@HOST|GID [TEXT...|-]"): completed from the running gateway.
var entityArg = regexp.MustCompile(`^\[?NAME(\||\]|$| )`)

// argWords returns the fixed values of an argument usage such as
// "busy|idle" or "[claude|codex|gemini|opencode|copilot]", or nil.
func argWords(args string) []string {
	if m := enumArgs.FindStringSubmatch(args); m != nil {
		return strings.Split(m[1], "|")
	}
	return nil
}

// firstNames is the first name of every command: what a shell offers.
func firstNames(cmds []*ucli.Command) []string {
	var out []string
	for _, c := range cmds {
		out = append(out, c.Name)
	}
	return out
}

// childID is the id of command c under the level with id parent.
func childID(parent string, c *ucli.Command) string {
	if parent == "" {
		return c.Name
	}
	return parent + "." + c.Name
}

// ---- bash ----

func bashCompletion(app *ucli.App) string {
	fn := "_" + strings.NewReplacer("-", "_", ".", "_").Replace(app.Name)
	ls := levels(app)
	var b strings.Builder
	fmt.Fprintf(&b, "# bash completion for %s\n", app.Name)
	b.WriteString("# Generated by scripts/gendocs from the definitions in pkg/cli; do not edit.\n\n")
	fmt.Fprintf(&b, "%s() {\n", fn)
	b.WriteString("    local cur=${COMP_WORDS[COMP_CWORD]} prev= cmd= npos=0 i w\n")
	b.WriteString("    (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}\n")
	b.WriteString("    # With '=' in COMP_WORDBREAKS, --flag=value arrives as three words.\n")
	b.WriteString("    if [[ $cur == = ]]; then\n        cur=\n")
	b.WriteString("    elif [[ $prev == = ]] && (( COMP_CWORD > 1 )); then\n        prev=${COMP_WORDS[COMP_CWORD-2]}\n    fi\n")

	// Walk the words before the cursor: find the (sub)command, count
	// arguments.
	b.WriteString("    for (( i = 1; i < COMP_CWORD; i++ )); do\n")
	b.WriteString("        w=${COMP_WORDS[i]}\n")
	b.WriteString("        case $w in\n")
	b.WriteString("        --) return 0 ;; # the rest is text\n")
	b.WriteString("        =) i=$((i + 1)) ;; # the value of --flag=value\n")
	b.WriteString("        -*)\n")
	b.WriteString("            [[ ${COMP_WORDS[i+1]} == = ]] && continue\n")
	if pats := levelPatterns(ls, func(f flagSpec) bool { return f.value }); pats != "" {
		b.WriteString("            case $cmd:$w in\n")
		fmt.Fprintf(&b, "            %s) i=$((i + 1)) ;; # skip the flag's value\n", pats)
		b.WriteString("            esac\n")
	}
	b.WriteString("            ;;\n")
	b.WriteString("        *)\n")
	var steps []string
	for _, l := range ls {
		for _, c := range l.cmds {
			var ps []string
			for _, n := range c.Names() {
				ps = append(ps, l.id+":"+n)
			}
			steps = append(steps, fmt.Sprintf("                %s) cmd=%s; continue ;;\n", strings.Join(ps, "|"), childID(l.id, c)))
		}
	}
	if len(steps) > 0 {
		b.WriteString("            if (( npos == 0 )); then\n")
		b.WriteString("                case $cmd:$w in\n")
		for _, s := range steps {
			b.WriteString(s)
		}
		b.WriteString("                esac\n")
		b.WriteString("            fi\n")
	}
	b.WriteString("            npos=$((npos + 1)) ;;\n")
	b.WriteString("        esac\n")
	b.WriteString("    done\n")

	// The value of the flag before the cursor: one case per action, in
	// the order first met.
	b.WriteString("    case $prev in\n")
	b.WriteString("    '<'|'>'|'>>') " + bashAction(valueHint{kind: "file"}) + "; return 0 ;;\n")
	b.WriteString("    esac\n")
	var actions []string
	pats := map[string][]string{}
	for _, l := range ls {
		for _, f := range l.flags {
			if !f.value {
				continue
			}
			a := bashAction(f.hint)
			if _, ok := pats[a]; !ok {
				actions = append(actions, a)
			}
			pats[a] = append(pats[a], patterns(l.id, f))
		}
	}
	if len(actions) > 0 {
		b.WriteString("    case $cmd:$prev in\n")
		for _, a := range actions {
			fmt.Fprintf(&b, "    %s) %s; return 0 ;;\n", strings.Join(pats[a], "|"), a)
		}
		b.WriteString("    esac\n")
	}

	// Flags of the level the cursor is at.
	b.WriteString("    if [[ $cur == -* ]]; then\n")
	b.WriteString("        case $cmd in\n")
	for _, l := range ls {
		var spells []string
		for _, f := range l.flags {
			spells = append(spells, f.spell...)
		}
		fmt.Fprintf(&b, "        %s) mapfile -t COMPREPLY < <(compgen -W '%s' -- \"$cur\") ;;\n", caseLabel(l.id), strings.Join(spells, " "))
	}
	b.WriteString("        esac\n")
	b.WriteString("        return 0\n")
	b.WriteString("    fi\n")

	// Commands, and the first argument's values.
	var argCases []string
	for _, l := range ls {
		h := l.arg
		if len(l.cmds) > 0 {
			h = valueHint{words: firstNames(l.cmds)}
		}
		if h.none() {
			continue
		}
		argCases = append(argCases, fmt.Sprintf("    %s) (( npos == 0 )) && %s ;;\n", caseLabel(l.id), bashAction(h)))
	}
	if len(argCases) > 0 {
		b.WriteString("    case $cmd in\n")
		for _, c := range argCases {
			b.WriteString(c)
		}
		b.WriteString("    esac\n")
	}
	b.WriteString("    return 0\n")
	b.WriteString("}\n")
	fmt.Fprintf(&b, "complete -F %s %s\n", fn, app.Name)
	return b.String()
}

// bashAction fills COMPREPLY with the values h offers for $cur.
func bashAction(h valueHint) string {
	switch {
	case h.words != nil:
		return fmt.Sprintf("mapfile -t COMPREPLY < <(compgen -W '%s' -- \"$cur\")", strings.Join(h.words, " "))
	case h.kind == "file":
		return "compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- \"$cur\")"
	case h.kind == "dir":
		return "compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- \"$cur\")"
	case h.kind == "command":
		return "mapfile -t COMPREPLY < <(compgen -c -- \"$cur\")"
	case dynamic[h.kind] != "":
		return fmt.Sprintf("mapfile -t COMPREPLY < <(compgen -W \"$(%s)\" -- \"$cur\")", dynamic[h.kind])
	}
	return "COMPREPLY=()" // free text
}

func caseLabel(id string) string {
	if id == "" {
		return "''"
	}
	return id
}

// patterns is the case pattern "ID:--flag|ID:-f" of one flag.
func patterns(id string, f flagSpec) string {
	var ps []string
	for _, s := range f.spell {
		ps = append(ps, id+":"+s)
	}
	return strings.Join(ps, "|")
}

// levelPatterns joins the patterns of every flag, at every level, that
// keep accepts.
func levelPatterns(ls []level, keep func(flagSpec) bool) string {
	var ps []string
	for _, l := range ls {
		for _, f := range l.flags {
			if keep(f) {
				ps = append(ps, patterns(l.id, f))
			}
		}
	}
	return strings.Join(ps, "|")
}

// ---- zsh ----

func zshCompletion(app *ucli.App) string {
	fn := "_" + app.Name
	ls := levels(app)
	byID := map[string]level{}
	for _, l := range ls {
		byID[l.id] = l
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#compdef %s\n", app.Name)
	fmt.Fprintf(&b, "# zsh completion for %s\n", app.Name)
	b.WriteString("# Generated by scripts/gendocs from the definitions in pkg/cli; do not edit.\n\n")
	fmt.Fprintf(&b, "%s() {\n", fn)
	b.WriteString("  local curcontext=$curcontext state line ret=1\n")
	b.WriteString("  typeset -A opt_args\n\n")
	writeZshLevel(&b, app.Name, byID, ls[0], "  ")
	b.WriteString("  return ret\n")
	b.WriteString("}\n")
	fmt.Fprintf(&b, "\nif [[ $funcstack[1] == %s ]]; then\n", fn)
	fmt.Fprintf(&b, "  %s \"$@\"\n", fn)
	b.WriteString("else\n")
	fmt.Fprintf(&b, "  compdef %s %s\n", fn, app.Name)
	b.WriteString("fi\n")
	return b.String()
}

// writeZshLevel writes the _arguments call of one level and, for a level
// with subcommands, the states that pick one and go on with its own.
// ("*::" shifts $words: the subcommand is $words[1] inside.)
func writeZshLevel(b *strings.Builder, appName string, byID map[string]level, l level, ind string) {
	if len(l.cmds) == 0 {
		b.WriteString(ind + "_arguments -S")
		writeZshSpecs(b, l, ind+"  ")
		b.WriteString(" && ret=0\n")
		return
	}
	st := strings.ReplaceAll(l.id, ".", "_")
	b.WriteString(ind + "_arguments -C -S")
	writeZshSpecs(b, l, ind+"  ")
	fmt.Fprintf(b, " \\\n%s  '1: :->cmd%s' \\\n%s  '*:: :->arg%s' && ret=0\n", ind, st, ind, st)
	fmt.Fprintf(b, "%scase $state in\n", ind)
	fmt.Fprintf(b, "%s  cmd%s)\n", ind, st)
	fmt.Fprintf(b, "%s    local -a commands\n", ind)
	fmt.Fprintf(b, "%s    commands=(\n", ind)
	for _, c := range l.cmds {
		for _, n := range c.Names() {
			fmt.Fprintf(b, "%s      %s\n", ind, zshQuote(strings.ReplaceAll(n, ":", `\:`)+":"+c.Usage))
		}
	}
	fmt.Fprintf(b, "%s    )\n", ind)
	what := strings.TrimSpace(appName + " " + strings.ReplaceAll(l.id, ".", " "))
	fmt.Fprintf(b, "%s    _describe -t commands %s commands && ret=0\n", ind, zshQuote(what+" command"))
	fmt.Fprintf(b, "%s    ;;\n", ind)
	fmt.Fprintf(b, "%s  arg%s)\n", ind, st)
	fmt.Fprintf(b, "%s    curcontext=${curcontext%%:*:*}:%s-$words[1]:\n", ind, strings.ReplaceAll(what, " ", "-"))
	fmt.Fprintf(b, "%s    case $words[1] in\n", ind)
	for _, c := range l.cmds {
		fmt.Fprintf(b, "%s      %s)\n", ind, strings.Join(c.Names(), "|"))
		writeZshLevel(b, appName, byID, byID[childID(l.id, c)], ind+"        ")
		fmt.Fprintf(b, "%s        ;;\n", ind)
	}
	fmt.Fprintf(b, "%s    esac\n", ind)
	fmt.Fprintf(b, "%s    ;;\n", ind)
	fmt.Fprintf(b, "%sesac\n", ind)
}

// writeZshSpecs writes the _arguments specs of one level's flags and
// arguments, each on its own continued line.
func writeZshSpecs(b *strings.Builder, l level, indent string) {
	for _, f := range l.flags {
		fmt.Fprintf(b, " \\\n%s%s", indent, zshFlagSpec(f))
	}
	if len(l.cmds) > 0 {
		return
	}
	var specs []string
	switch {
	case !l.arg.none():
		msg := l.arg.kind
		if msg == "" {
			msg = zshMessage(l.args)
		}
		if strings.HasPrefix(l.args, "[") {
			specs = append(specs, "1::"+msg+":"+zshAction(l.arg))
		} else {
			specs = append(specs, "1:"+msg+":"+zshAction(l.arg))
		}
		if l.more {
			specs = append(specs, "*:text: ")
		}
	case l.args == "":
	case oneArg.MatchString(l.args):
		specs = append(specs, "1:"+zshMessage(l.args)+": ")
	case optArg.MatchString(l.args):
		specs = append(specs, "1::"+zshMessage(strings.Trim(l.args, "[]"))+": ")
	default:
		specs = append(specs, "*:"+zshMessage(l.args)+": ")
	}
	for _, s := range specs {
		fmt.Fprintf(b, " \\\n%s%s", indent, zshQuote(s))
	}
}

// One argument ("NAME") or an optional one ("[NAME]").
var (
	oneArg = regexp.MustCompile(`^[A-Z][A-Z_]*$`)
	optArg = regexp.MustCompile(`^\[[A-Z][A-Z_]*\]$`)
)

func zshFlagSpec(f flagSpec) string {
	desc := "[" + zshDesc(f.usage) + "]"
	if f.value {
		desc += ":" + zshMessage(f.name) + ":" + zshAction(f.hint)
	}
	exclude := ""
	switch {
	case f.help:
		exclude = "(- *)"
	case len(f.spell) > 1 && !f.repeat:
		exclude = "(" + strings.Join(f.spell, " ") + ")"
	}
	star := ""
	if f.repeat {
		star = "*"
	}
	forms := make([]string, len(f.spell))
	for i, s := range f.spell {
		forms[i] = s
		if f.value {
			if strings.HasPrefix(s, "--") {
				forms[i] += "=" // --flag=value or --flag value
			} else {
				forms[i] += "+" // -fvalue or -f value
			}
		}
	}
	if len(forms) == 1 {
		return zshQuote(exclude + star + forms[0] + desc)
	}
	// zsh brace expansion repeats the quoted parts for every spelling.
	return zshQuote(exclude+star) + "{" + strings.Join(forms, ",") + "}" + zshQuote(desc)
}

func zshAction(h valueHint) string {
	switch {
	case h.words != nil:
		return "(" + strings.Join(h.words, " ") + ")"
	case h.kind == "file":
		return "_files"
	case h.kind == "dir":
		return "_files -/"
	case h.kind == "command":
		return "_cmdstring"
	case dynamic[h.kind] != "":
		return "($(" + dynamic[h.kind] + "))"
	}
	return " " // a message, no matches
}

// zshDesc escapes an option description: brackets end it.
func zshDesc(s string) string {
	return strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`).Replace(s)
}

// zshMessage escapes a message: a colon ends it.
func zshMessage(s string) string {
	return strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(s)
}

// zshQuote single-quotes s for the shell; "" for the empty string.
func zshQuote(s string) string {
	if s == "" {
		return ""
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
