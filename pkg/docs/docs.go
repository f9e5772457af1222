// Package docs generates fleet's man pages and shell completions from the
// command definitions in pkg/cli, so the two can never disagree.
// scripts/gendocs writes them (make generate); a test in pkg/cli checks the
// committed copies against a fresh run.
//
// For every app in cli.Apps it produces, relative to the output folder:
//
//	man/NAME.1             the page urfave/cli renders, plus COMMAND LINE,
//	                       ENVIRONMENT, EXIT STATUS, EXAMPLES and SEE ALSO
//	completions/NAME.bash  a bash `complete -F` function
//	completions/_NAME      a zsh #compdef function
//	completions/NAME.fish  fish complete lines
//
// and for every markdown page under pages/ (the concepts, section 7, and
// the config file, section 5: see pages.go) man/NAME.7 or man/NAME.5.
// Every fleet command line in the examples and in the pages' code is held
// to the definitions: a renamed flag or command fails generation.
//
// The output depends only on the definitions: no dates, no versions.
package docs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/dlqapp"
	"github.com/fleetd/fleet/pkg/cli/examples"
	"github.com/fleetd/fleet/pkg/cli/gwapp"
	"github.com/fleetd/fleet/pkg/cli/mcpapp"
	"github.com/fleetd/fleet/pkg/cli/rosterapp"
	"github.com/fleetd/fleet/pkg/cli/topapp"
	"github.com/fleetd/fleet/pkg/cli/traceapp"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// Dirs are the folders, relative to the output folder, that Render fills.
var Dirs = []string{"man", "completions"}

// AllApps is every command's constructor: fleet-gw's and the short ones.
func AllApps() []func() *ucli.App {
	return append([]func() *ucli.App{gwapp.NewGatewayApp, rosterapp.NewRosterApp, dlqapp.NewDLQApp, traceapp.NewTraceApp, topapp.NewTopApp, mcpapp.NewMCPApp}, cli.Apps...)
}

// Render returns every generated file, keyed by its slash-separated path
// relative to the output folder.
func Render() (map[string][]byte, error) {
	// Every use gets a fresh app from its constructor: rendering may
	// change the app it is given.
	fresh := func() []*ucli.App {
		apps := make([]*ucli.App, 0, len(AllApps()))
		for _, newApp := range AllApps() {
			apps = append(apps, newApp())
		}
		return apps
	}
	if err := checkExamples(fresh()); err != nil {
		return nil, err
	}
	var names []string
	for _, a := range fresh() {
		names = append(names, a.Name)
	}
	files := map[string][]byte{}
	for _, app := range fresh() {
		page, err := manPage(app, names)
		if err != nil {
			return nil, fmt.Errorf("%s: man page: %w", app.Name, err)
		}
		files["man/"+app.Name+".1"] = []byte(page)
	}
	for _, app := range fresh() {
		files["completions/"+app.Name+".bash"] = []byte(bashCompletion(app))
		files["completions/_"+app.Name] = []byte(zshCompletion(app))
		files["completions/"+app.Name+".fish"] = []byte(fishCompletion(app))
	}
	ps, err := readPages()
	if err != nil {
		return nil, err
	}
	var lineErrs []string
	for _, p := range ps {
		file := p.Name + "." + p.Section
		_, errs := CheckMarkdown("pages/"+file+".md", string(p.Src), fresh())
		lineErrs = append(lineErrs, errs...)
		roff, err := renderPage(p)
		if err != nil {
			return nil, err
		}
		files["man/"+file] = roff
	}
	if len(lineErrs) > 0 {
		return nil, errors.New("command lines in the pages do not match the command definitions:\n\t" + strings.Join(lineErrs, "\n\t"))
	}
	return files, nil
}

// Generate renders every file and writes it under dir, creating the man
// and completions folders as needed. Files it does not produce are left
// alone.
func Generate(dir string) error {
	files, err := Render()
	if err != nil {
		return err
	}
	for _, d := range Dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(p)), files[p], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// manPage is urfave/cli's section-1 page with fleet's extra sections.
func manPage(app *ucli.App, all []string) (string, error) {
	// The page must not change with the build: the template does not use
	// the version today, and this keeps it that way.
	app.Version = ""
	page, err := app.ToManWithSection(1)
	if err != nil {
		return "", err
	}
	page = demoteCommandHeadings(page, app.Commands)
	var b strings.Builder
	b.WriteString(strings.TrimRight(page, "\n"))
	b.WriteString("\n\n")
	writeCommandLine(&b)
	writeSections(&b, app)
	writeEnvironment(&b, app)
	writeExitStatus(&b, app)
	writeExamples(&b, app)
	writeSeeAlso(&b, app.Name, all)
	return b.String(), nil
}

// demoteCommandHeadings turns the per-command headings under COMMANDS,
// which the template renders as top-level sections (.SH), into subsections
// (.SS), so a pager's section list shows COMMANDS once.
func demoteCommandHeadings(page string, cmds []*ucli.Command) string {
	heads := map[string]bool{}
	var walk func([]*ucli.Command)
	walk = func(cs []*ucli.Command) {
		for _, c := range cs {
			heads[".SH "+strings.Join(c.Names(), ", ")] = true
			walk(c.Subcommands)
		}
	}
	walk(cmds)
	lines := strings.Split(page, "\n")
	inCommands := false
	for i, l := range lines {
		switch {
		case l == ".SH COMMANDS":
			inCommands = true
		case inCommands && heads[l]:
			lines[i] = ".SS " + strings.TrimPrefix(l, ".SH ")
		case strings.HasPrefix(l, ".SH "):
			inCommands = false
		}
	}
	return strings.Join(lines, "\n")
}

// hasFlag reports whether the app or any of its commands has flag name,
// and how to spell it on the command line.
func hasFlag(app *ucli.App, name string) (string, bool) {
	for _, f := range app.Flags {
		if containsName(f, name) {
			return "--" + name, true
		}
	}
	for _, c := range app.Commands {
		for _, f := range c.Flags {
			if containsName(f, name) {
				return app.Name + " " + c.Name + " --" + name, true
			}
		}
	}
	return "", false
}

func containsName(f ucli.Flag, name string) bool {
	for _, n := range f.Names() {
		if n == name {
			return true
		}
	}
	return false
}

// isClient reports whether app talks to a gateway rather than being one.
// (Not by --host: fleet-roster and fleet-spawn have one, naming another
// host, not this gateway's id.)
func isClient(app *ucli.App) bool {
	_, ok := hasFlag(app, "broker")
	return !ok
}

// configFlag reports whether a client's flag of that name sets config key k:
// only the connection flags do; fleet-spawn --host names a target host.
func configFlag(app *ucli.App, k string) (string, bool) {
	if isClient(app) && k != "socket" && k != "state-dir" {
		return "", false
	}
	return hasFlag(app, k)
}

// writeCommandLine is the rule every command reads its line by
// (cli.CommandLineRule), the same on every page.
func writeCommandLine(b *strings.Builder) {
	b.WriteString(".SH COMMAND LINE\n.PP\n")
	b.WriteString(roffCode(cli.CommandLineRule) + "\n\n")
}

func writeEnvironment(b *strings.Builder, app *ucli.App) {
	b.WriteString(".SH ENVIRONMENT\n.PP\n")
	b.WriteString("Each setting comes from its flag, else its environment variable, else the config file, else its default.\n")
	if isClient(app) {
		fmt.Fprintf(b, "Of the gateway's settings below, %s uses only \\fBFLEET_SOCKET\\fR and \\fBFLEET_STATE_DIR\\fR, "+
			"but it reads and checks them all: an invalid value in any is a usage error (exit 64).\n", roffCode(app.Name))
		b.WriteString(".TP\n.B FLEET_TOKEN\n")
		b.WriteString("The caller's credential, as printed once by \\fBfleet\\-roster join\\fR. ")
		if spelled, ok := hasFlag(app, "as"); ok {
			fmt.Fprintf(b, "\\fB%s\\fR \\fINAME\\fR takes precedence: it reads the credential that join saved in the state folder.", roffCode(spelled))
		}
		b.WriteString("\n")
	}
	b.WriteString(".TP\n.B FLEET_CONFIG\n")
	b.WriteString("The config file: \\fIkey\\fR = \\fIvalue\\fR lines, keys as below, \\fB#\\fR starts a comment. " +
		"Default: $XDG_CONFIG_HOME/fleet/config (~/.config/fleet/config), read only if it exists.")
	if spelled, ok := hasFlag(app, "config"); ok {
		fmt.Fprintf(b, " Flag: \\fB%s\\fR.", roffCode(spelled))
	}
	b.WriteString("\n")
	for _, k := range config.Keys {
		fmt.Fprintf(b, ".TP\n.B %s\n", k.Env)
		fmt.Fprintf(b, "%s. Default: %s. Config file key: \\fB%s\\fR.", roffText(k.Usage), roffText(k.Default), roffCode(k.Name))
		if spelled, ok := configFlag(app, k.Name); ok {
			fmt.Fprintf(b, " Flag: \\fB%s\\fR.", roffCode(spelled))
		}
		b.WriteString("\n")
	}
	for _, e := range extraEnv[app.Name] {
		fmt.Fprintf(b, ".TP\n.B %s\n%s\n", e[0], roffText(e[1]))
	}
	b.WriteString("\n")
}

// extraEnv are a command's own environment variables, beyond the
// gateway's settings: name and meaning.
var extraEnv = map[string][][2]string{
	"fleet-top": {{"FLEET_TOP_FRAMES", "A file to which the live view appends each frame's render time, in microseconds, one a line " +
		"(created if missing; scripts/bench-top.sh reads it for the frame times). Unset or empty: none is written"}},
}

// exitCodes is the exit-status table of pkg/fault (fault.Codes), where
// it is written once.
var exitCodes = fault.Codes

// retryText says in words what running a command again after code may do.
func retryText(r fault.Retry) string {
	switch r {
	case fault.RetryYes:
		return "Running it again as it is may succeed."
	case fault.RetryAfter:
		return "Running it again may succeed once what is named is back or mended."
	case fault.RetryNo:
		return "Running it again unchanged is not expected to succeed."
	case fault.RetryNever:
		return "Do not run it again as it is."
	}
	return ""
}

// codeText is a code's line of the table, with what a retry may do.
func codeText(e fault.CodeInfo) string {
	if r := retryText(e.Retry); r != "" {
		return e.Text + " " + r
	}
	return e.Text
}

func writeExitStatus(b *strings.Builder, app *ucli.App) {
	b.WriteString(".SH EXIT STATUS\n.PP\n")
	fmt.Fprintf(b, "Every failure prints one line on stderr, \\fB%s: error:\\fR followed by what went wrong, "+
		"and a \\fBhint:\\fR line when there is a next command to run", roffCode(app.Name))
	if _, ok := hasFlag(app, "json"); ok {
		b.WriteString("; with \\fB\\-\\-json\\fR, also one JSON error object")
	}
	b.WriteString(".\n")
	for _, e := range exitCodes {
		fmt.Fprintf(b, ".TP\n.B %d\n%s\n", e.Code, roffText(codeText(e)))
	}
	b.WriteString("\n")
}

func writeExamples(b *strings.Builder, app *ucli.App) {
	exs := examples.For(app.Name)
	if len(exs) == 0 {
		return
	}
	b.WriteString(".SH EXAMPLES\n")
	for _, ex := range exs {
		fmt.Fprintf(b, ".PP\n%s\n.PP\n.RS 4\n.EX\n", roffText(ex.Text))
		for _, l := range strings.Split(ex.Cmd, "\n") {
			b.WriteString(roffCode(l) + "\n")
		}
		b.WriteString(".EE\n.RE\n")
	}
	b.WriteString("\n")
}

// seeAlso names the concept pages (pages/) each command's page points to,
// besides fleet(7) and fleet-config(5), which every one does.
var seeAlso = map[string][]string{
	"fleet-gw":     {"fleet-broker(7)", "fleet-security(7)", "fleet-metrics(7)"},
	"fleet-roster": {"fleet-agents(7)", "fleet-json(7)", "fleet-security(7)"},
	"fleet-send":   {"fleet-json(7)"},
	"fleet-ask":    {"fleet-json(7)"},
	"fleet-bcast":  {"fleet-json(7)"},
	"fleet-recv":   {"fleet-agents(7)", "fleet-json(7)"},
	"fleet-mcp":    {"fleet-agents(7)"},
	"fleet-spawn":  {"fleet-json(7)"},
	"fleet-stop":   {"fleet-json(7)"},
	"fleet-trace":  {"fleet-json(7)", "fleet-broker(7)"},
	"fleet-dlq":    {"fleet-broker(7)", "fleet-json(7)"},
	"fleet-top":    {"fleet-metrics(7)"},
}

func writeSeeAlso(b *strings.Builder, name string, all []string) {
	var refs []string
	for _, n := range all {
		if n != name {
			refs = append(refs, "\\fB"+roffCode(n)+"\\fR(1)")
		}
	}
	for _, p := range append([]string{"fleet(7)", "fleet-config(5)"}, seeAlso[name]...) {
		n, sec, _ := strings.Cut(strings.TrimSuffix(p, ")"), "(")
		refs = append(refs, "\\fB"+roffCode(n)+"\\fR("+sec+")")
	}
	if len(refs) == 0 {
		return
	}
	b.WriteString(".SH SEE ALSO\n.PP\n" + strings.Join(refs, ", ") + "\n")
}

// roffText escapes one line of text for a roff body.
func roffText(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// roffCode escapes a command or flag: every '-' becomes a minus sign, so
// text copied from the rendered page still runs.
func roffCode(s string) string {
	return strings.ReplaceAll(roffText(s), "-", `\-`)
}
