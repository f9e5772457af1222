package cli

import (
	"strconv"
	"strings"

	"github.com/fleetd/fleet/pkg/near"
	"github.com/urfave/cli/v2"
)

// The command-line rule of every fleet command (CommandLineRule says it in
// words, for the man pages):
//
//   - a word that is exactly one of the command's options (--json, -json,
//     -n, --as=alice) is that option, wherever it stands up to "--": before
//     the arguments, between them or after the text ("fleet-ask bob 'late
//     question' --ttl 1s" asks with a TTL of 1 s);
//   - a value option takes the next word as its value, or, when that word
//     is itself an option, the next word that is not ("--status --json ID");
//   - every other word is an argument (the recipient, the text), in order:
//     a quoted text is one word, and stays text whatever it contains;
//   - but a word that starts with "-" and is not an option is refused (64),
//     never guessed: a text that starts with "-" (a markdown list) goes
//     after "--", or comes on stdin;
//   - everything after "--" is an argument.
//
// urfave/cli v2 stops reading options at the first argument, so Main hands
// it the line reordered: each level's options (the app's, then each
// subcommand's, a word naming the subcommand at the head of the
// arguments), then "--" and the arguments.

// CommandLineRule is the rule above as the man pages and --help say it.
const CommandLineRule = "Options may stand anywhere on the command line, before, between or after the arguments, " +
	"up to --; every word after -- is an argument. The options of a subcommand come after its name " +
	"(fleet-roster join bob --mode pull). A word is an option only when it is exactly one of the " +
	"command's options (--json, -n 3, --as=alice); a value option takes the next word as its value, or the next " +
	"word that is not an option when an option follows it (--status --json ID). Any other word is an argument: " +
	"a quoted text is one word and is sent as it is, whatever it contains (fleet-send bob \"a --json in quotes\"), " +
	"and an option after the text is read, not sent (fleet-ask bob \"late question\" --ttl 1s asks with a TTL of 1s). " +
	"A word that starts with - and is not an option is refused (exit 64), never guessed: a text that starts " +
	"with - (a markdown list) goes after -- (fleet-send bob -- \"- item\"), or comes on stdin (fleet-send bob -). " +
	"Every option is checked before anything is sent, joined, spawned or stopped: a usage error (exit 64) has done nothing."

// interspersed reorders args as Main does (see reorder); a line the rule
// refuses is returned as it is.
func interspersed(app *cli.App, args []string) []string {
	out, err := reorder(app, args)
	if err != nil {
		return args
	}
	return out
}

// Reorder is the rule applied to args, as Main applies it (for the other
// app packages' tests): the line urfave/cli parses, or the usage error.
func Reorder(app *cli.App, args []string) ([]string, error) { return reorder(app, args) }

// level is one level of a command line: the app, or a subcommand.
type level struct {
	name  string // the app's or the subcommand's name
	flags []cli.Flag
	top   bool     // the app itself (--version)
	out   []string // the word that named it, then its options as written
}

// pendingValue is a value option still waiting for its value.
type pendingValue struct {
	lv  *level
	tok string
}

// reorder applies the rule to args: the line urfave/cli is to parse, or
// the usage error (64) that refuses it. It does not change args.
func reorder(app *cli.App, args []string) ([]string, error) {
	if len(args) < 2 || args[len(args)-1] == "--generate-bash-completion" {
		// a shell asking for completions: urfave/cli wants the line as
		// typed, that flag last
		return args, nil
	}
	out, _, err := readLine(app, args)
	return out, err
}

// commandPath names the subcommands args call, as Main reads the line
// ("hooks", "install" for fleet-roster hooks install codex); nil for the
// app itself or a line the rule refuses.
func commandPath(app *cli.App, args []string) []string {
	_, levels, err := readLine(app, args)
	if err != nil {
		return nil
	}
	var path []string
	for _, lv := range levels[1:] {
		path = append(path, lv.name)
	}
	return path
}

// readLine is reorder, and the levels the line names.
func readLine(app *cli.App, args []string) ([]string, []*level, error) {
	levels := []*level{{name: app.Name, flags: app.Flags, top: true, out: []string{args[0]}}}
	commands := app.Commands
	seen := map[string]bool{}
	var (
		pos     []string // the arguments, in order (strays included)
		stray   = -1     // index in pos of the first word refused
		pending []pendingValue
		after   []string // the words after "--"
		dashed  bool
	)
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			after, dashed = rest[i+1:], true
			break
		}
		if a != "-" && strings.HasPrefix(a, "-") {
			lv, f := findOption(levels, a)
			if lv == nil {
				if stray < 0 {
					stray = len(pos)
				}
				pos = append(pos, a)
				continue
			}
			seen[f] = true
			if !optionTakesValue(lv, a) {
				lv.out = append(lv.out, a)
				continue
			}
			if i+1 < len(rest) && rest[i+1] != "--" && !isAnyOption(levels, rest[i+1]) {
				lv.out = append(lv.out, a, rest[i+1])
				i++
				continue
			}
			pending = append(pending, pendingValue{lv, a})
			continue
		}
		if len(pending) > 0 {
			p := pending[0]
			pending = pending[1:]
			p.lv.out = append(p.lv.out, p.tok, a)
			continue
		}
		if len(pos) == 0 {
			if cmd := findCommand(commands, a); cmd != nil {
				levels = append(levels, &level{name: a, flags: cmd.Flags, out: []string{a}})
				commands = cmd.Subcommands
				continue
			}
		}
		pos = append(pos, a)
	}
	var out []string
	for _, lv := range levels {
		out = append(out, lv.out...)
	}
	if stray >= 0 {
		return nil, nil, strayError(app, levels, out, pos, stray, after, seen)
	}
	if len(pending) > 0 && !seen["help"] && !seen["h"] {
		return nil, nil, usage("%s needs a value", pending[0].tok).WithHint("see: %s --help", levelName(levels))
	}
	if len(pos) > 0 || dashed {
		out = append(out, "--")
		out = append(out, pos...)
		out = append(out, after...)
	}
	return out, levels, nil
}

// optionName is the name a word would be an option by: "--as=x" → "as".
func optionName(w string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(w, "-"), "-"), "=")
	return name
}

// findOption finds the level whose option w is, the innermost first, and
// the option's name; nil if w is no option of any level.
func findOption(levels []*level, w string) (*level, string) {
	name := optionName(w)
	if name == "" || strings.HasPrefix(name, "-") {
		return nil, ""
	}
	for i := len(levels) - 1; i >= 0; i-- {
		lv := levels[i]
		if name == "help" || name == "h" {
			return lv, name
		}
		if lv.top && name == "version" {
			return lv, name
		}
		if flagNamed(lv.flags, name) != nil {
			return lv, name
		}
	}
	return nil, ""
}

func isAnyOption(levels []*level, w string) bool {
	if w == "-" || !strings.HasPrefix(w, "-") {
		return false
	}
	lv, _ := findOption(levels, w)
	return lv != nil
}

// optionTakesValue reports whether the option word w of lv still needs
// the next word: a value option written without "=".
func optionTakesValue(lv *level, w string) bool {
	if strings.Contains(w, "=") {
		return false
	}
	f := flagNamed(lv.flags, optionName(w))
	if f == nil {
		return false // --help, --version
	}
	_, isBool := f.(*cli.BoolFlag)
	return !isBool
}

func flagNamed(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// levelName is the command a level's options belong to: "fleet-roster join".
func levelName(levels []*level) string {
	names := make([]string, len(levels))
	for i, lv := range levels {
		names[i] = lv.name
	}
	return strings.Join(names, " ")
}

// strayError refuses pos[stray], a word that starts with "-" and is no
// option: the nearest option if there is one, and, where the word stands
// in a text (or in the arguments of fleet-spawn's command), the line that
// sends it as text — after "--", or on stdin.
func strayError(app *cli.App, levels []*level, opts, pos []string, stray int, after []string, seen map[string]bool) error {
	w := pos[stray]
	name := levelName(levels)
	e := usage("%s is not an option of %s", quoteWord(w), name)
	var hints []string
	var all []string
	for _, lv := range levels {
		all = append(all, trimDashes(flagNamesOf(lv.flags))...)
	}
	if n := near.Closest(strings.TrimLeft(optionName(w), "-"), all); n != "" && !strings.ContainsAny(w, " \t\n") {
		hints = append(hints, "did you mean "+dashed(n)+"?")
	}
	words, _ := app.Metadata[wordsKey].(Words)
	lead := 0
	if words.Lead != nil {
		lead = words.Lead(seen)
	}
	if len(levels) == 1 && words.Lead != nil && stray >= lead {
		// the line as typed, but for the command's own name
		line := append(append([]string{app.Name}, opts[1:]...), pos[:lead]...)
		fixed := append(append(append([]string{}, line...), "--"), append(append([]string{}, pos[lead:]...), after...)...)
		cmd := commandLine(fixed)
		if len(cmd) > 200 || hasControl(cmd) {
			cmd = commandLine(line) + " -- " + strings.ToUpper(words.Noun) + "..."
		}
		if words.Stdin {
			hints = append(hints, "a "+words.Noun+" that starts with \"-\" goes after --: "+cmd+
				" (or comes on stdin: "+commandLine(append(line, "-"))+")")
		} else {
			hints = append(hints, words.Noun+" that start with \"-\" go after --: "+cmd)
		}
	}
	if len(hints) == 0 {
		hints = append(hints, "see: "+name+" --help")
	}
	return e.WithHint("%s", strings.Join(hints, " "))
}

// quoteWord shows a refused word: as it is, or quoted when it has spaces,
// quotes or control characters.
func quoteWord(w string) string {
	if hasControl(w) {
		return strconv.Quote(w)
	}
	return shellWord(w)
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return true
		}
	}
	return false
}

func commandLine(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellWord(w)
	}
	return strings.Join(q, " ")
}

func flagNamesOf(flags []cli.Flag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Names()...)
	}
	return out
}

// Words says what the arguments of a command are, for the hint of a
// refused word: Lead counts the arguments before the free words (the
// recipient), given the options seen (by name); Noun names the free words
// ("text", "arguments"); Stdin says they may come on stdin instead.
type Words struct {
	Lead  func(seen map[string]bool) int
	Noun  string
	Stdin bool
}

const wordsKey = "fleet-words"

// takesText marks app as taking a text after lead arguments.
func takesText(app *cli.App, lead func(seen map[string]bool) int) {
	setWords(app, Words{Lead: lead, Noun: "text", Stdin: true})
}

func setWords(app *cli.App, w Words) {
	if app.Metadata == nil {
		app.Metadata = map[string]any{}
	}
	app.Metadata[wordsKey] = w
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}
