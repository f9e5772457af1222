// Package cli holds the urfave/cli apps of every fleet command and the one
// funnel that turns their errors into exit codes. The mains in cmd/ only
// call Main with a constructor from here; the doc generator imports the
// same constructors.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/version"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"
)

func init() {
	// -v must stay free for commands; --version only.
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the version"}
}

// Apps lists every command's constructor, for the doc generator.
// (fleet-gw, fleet-roster and fleet-trace are in pkg/cli/gwapp,
// pkg/cli/rosterapp and pkg/cli/traceapp; pkg/docs adds them.)
var Apps = []func() *cli.App{NewSendApp, NewRecvApp, NewBcastApp, NewAskApp, NewSpawnApp, NewStopApp}

// Main runs app with args and returns the exit status. Every failure is one
// line on stderr ("NAME: error: ..."), a hint line when there is a next
// command to run, and with --json also one JSON error object on stderr.
//
// The first SIGINT or SIGTERM cancels the command's context (fleet-gw then
// drains); default handling is restored at once, so a second one aborts.
// Signals are caught from the moment something waits on the context: a
// command that never does (a plain fleet-send) ends on Ctrl-C the default
// way, and does not start os/signal's watcher at all (signalContext).
func Main(app *cli.App, args []string) int {
	ctx := newSignalContext()
	ordered, err := reorder(app, args)
	if err == nil {
		if wantsHelp(app, ordered) {
			attachExamples(app)
		}
		err = app.RunContext(ctx, ordered)
	} else {
		ordered = args
	}
	if err == nil {
		return 0
	}
	var q quietExit
	if errors.As(err, &q) {
		return int(q)
	}
	stderr := app.ErrWriter
	if stderr == nil {
		stderr = os.Stderr
	}
	if !isFault(err) {
		// Our own code returns faults; a plain error is urfave/cli's
		// complaint about the command line (a missing required flag, say).
		err = fault.New(fault.Usage, fault.KindUsage, "%s", libraryMessage(err)).WithHint("see: %s --help", app.Name)
	}
	betterHint(app, err)
	Report(stderr, app.Name, err, wantsJSON(ordered))
	return int(fault.CodeOf(err))
}

// signalContext is a context cancelled by the first SIGINT or SIGTERM
// caught once Done was first called. Catching them costs a short command
// a good part of its run on a small machine (os/signal's watcher
// goroutine, its thread and wake-ups, and signal.Stop waiting for the
// watcher to settle at exit); only waiting commands need it.
type signalContext struct {
	context.Context // cancelled by the signal
	cancel          context.CancelFunc
	once            sync.Once
}

func newSignalContext() *signalContext {
	ctx, cancel := context.WithCancel(context.Background())
	return &signalContext{Context: ctx, cancel: cancel}
}

func (s *signalContext) Done() <-chan struct{} {
	s.once.Do(s.catch)
	return s.Context.Done()
}

// catch starts catching the signals: the first cancels, and gives them
// back to their default handling, so a second one aborts.
func (s *signalContext) catch() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		signal.Stop(ch)
		s.cancel()
	}()
}

// quietExit ends a command with its code and nothing more said: a hook's
// exit 2 (fleet-recv --hook claude --event wake), whose text is out
// already.
type quietExit int

func (q quietExit) Error() string { return "exit " + strconv.Itoa(int(q)) }

func isFault(err error) bool {
	var fe *fault.Error
	return errors.As(err, &fe)
}

// Report writes err the house way, its message as written: the writers of
// messages keep the rule (lowercase, no period), so a name such as Alice or
// a kind such as SPAWN_RESULT is never altered here.
//
// Under --json, stderr carries the JSON error object alone: a program
// reading it needs no line filter.
//
// The hint is the error's own, else its kind's (fault.KindTable): every
// kind with a next step says it, whichever layer raised it.
func Report(w io.Writer, name string, err error, asJSON bool) {
	if asJSON {
		body := api.FromFault(err)
		body.Hint = fault.HintFor(err, name)
		json.NewEncoder(w).Encode(map[string]any{"error": body})
		return
	}
	fmt.Fprintf(w, "%s: error: %s\n", name, err.Error())
	if h := fault.HintFor(err, name); h != "" {
		fmt.Fprintf(w, "%s: hint: %s\n", name, h)
	}
}

func wantsJSON(args []string) bool {
	for _, a := range args[1:] {
		if a == "--json" || a == "-json" {
			return true
		}
		if a == "--" {
			break
		}
	}
	return false
}

// newApp returns an app with the house settings: errors returned, never
// exited on; usage errors as faults; --help to stdout, errors to stderr.
func newApp(name, usage string) *cli.App {
	return &cli.App{
		Name:                 name,
		Usage:                usage,
		Version:              version.Version,
		HideHelpCommand:      true,
		EnableBashCompletion: true,
		Writer:               os.Stdout,
		ErrWriter:            os.Stderr,
		ExitErrHandler:       func(*cli.Context, error) {},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return fault.Wrap(fault.Usage, fault.KindUsage, err, "usage").WithHint("see: %s --help", name)
		},
	}
}

// Common flags, built fresh for every app (no package-level flag state).

func connFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "socket", Usage: "the gateway's socket (env FLEET_SOCKET)"},
		&cli.StringFlag{Name: "state-dir", Usage: "the gateway's state folder, for --as (env FLEET_STATE_DIR)"},
		&cli.StringFlag{Name: "config", Usage: "config file (env FLEET_CONFIG)"},
	}
}

func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: "machine-readable output: one JSON object, or JSON Lines for streams"}
}

func asFlag() cli.Flag {
	return &cli.StringFlag{Name: "as", Usage: "act as NAME, reading its owner-only credential file (default: env FLEET_TOKEN)"}
}

// loadConfig resolves the configuration from this command's flags, the
// environment and the config file.
func loadConfig(c *cli.Context) (*config.Config, error) {
	return config.Load(flagLookup(c), c.String("config"))
}

func flagLookup(c *cli.Context) config.Lookup {
	return func(name, env string) (string, bool) {
		for _, ctx := range c.Lineage() {
			if ctx.IsSet(name) {
				return ctx.String(name), true
			}
		}
		return config.EnvLookup(name, env)
	}
}

func configFlag(c *cli.Context) string {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet("config") {
			return ctx.String("config")
		}
	}
	return ""
}

// session is a connected command: its configuration and its client.
type session struct {
	cfg    *config.Config
	client *api.Client
}

// connect loads the configuration, dials the gateway and attaches the
// caller's credential (--as NAME, else FLEET_TOKEN). A missing credential
// is not an error here: the gateway refuses the ops that need one.
func connect(c *cli.Context) (*session, error) {
	cfg, token, err := credential(c)
	if err != nil {
		return nil, err
	}
	cl, err := DialGateway(cfg)
	if err != nil {
		return nil, err
	}
	cl.Token = token
	return &session{cfg: cfg, client: cl}, nil
}

// DialGateway connects to the gateway of cfg. A socket that was guessed
// (no flag, FLEET_SOCKET or config key) and has no gateway is not the end:
// the gateway records its socket in its state folder, where a command
// started without XDG_RUNTIME_DIR (cron) finds it. "No gateway" names
// every place looked at.
func DialGateway(cfg *config.Config) (*api.Client, error) {
	cl, err := api.Dial(cfg.Socket)
	if err == nil || cfg.SocketSet || fault.KindOf(err) != fault.KindNoGateway {
		return cl, err
	}
	record := config.SocketRecord(cfg.StateDir)
	looked := []string{cfg.Socket}
	switch rec := config.RecordedSocket(cfg.StateDir); {
	case rec == "":
		looked = append(looked, "no socket recorded in "+record)
	case rec == cfg.Socket:
		looked = append(looked, "the same recorded in "+record)
	default:
		cl, rerr := api.Dial(rec)
		if rerr == nil || fault.KindOf(rerr) != fault.KindNoGateway {
			return cl, rerr
		}
		looked = append(looked, rec+" (recorded in "+record+")")
	}
	return nil, fault.New(fault.Unavailable, fault.KindNoGateway, "no gateway running: looked at %s", strings.Join(looked, ", ")).
		WithHint("start one with: fleet-gw run (or set FLEET_SOCKET to a running gateway's socket)")
}

// credential loads the configuration and the caller's credential (--as
// NAME, else FLEET_TOKEN; "" when neither is given).
func credential(c *cli.Context) (*config.Config, string, error) {
	name, err := asName(c)
	if err != nil {
		return nil, "", err
	}
	cfg, err := config.LoadClient(flagLookup(c), configFlag(c))
	if err != nil {
		return nil, "", err
	}
	token := os.Getenv("FLEET_TOKEN")
	if name != "" {
		if token, err = ident.Load(cfg.StateDir, name); err != nil {
			return nil, "", err
		}
	}
	return cfg, token, nil
}

// asName returns --as NAME ("" when not given), refusing anything but an
// entity name (exit 64) before any file is read: the name becomes a path
// under the credentials folder.
func asName(c *cli.Context) (string, error) {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet("as") {
			name := ctx.String("as")
			if !ident.ValidName(name) {
				return "", usage("--as %q is not an entity name (a letter, then up to 63 letters, digits, '-' or '_')", name).
					WithHint("--as takes the name the entity joined with, never a path (fleet-roster lists the names)")
			}
			return name, nil
		}
	}
	return "", nil
}

func usage(format string, args ...any) *fault.Error {
	return fault.New(fault.Usage, fault.KindUsage, format, args...)
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

func printJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// Exported for pkg/cli/gwapp, which shares the house settings.

// NewApp returns an app with the house settings.
func NewApp(name, usage string) *cli.App { return newApp(name, usage) }

// Usage returns a usage error (exit 64).
func Usage(format string, args ...any) *fault.Error { return usage(format, args...) }

// LoadConfig resolves the gateway configuration from the command's flags,
// the environment and the config file.
func LoadConfig(c *cli.Context) (*config.Config, error) { return loadConfig(c) }

// LoadConfigIfExists is LoadConfig with the config file at path, or none
// if there is none there yet.
func LoadConfigIfExists(c *cli.Context, path string) (*config.Config, error) {
	return config.LoadIfExists(flagLookup(c), path)
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool { return isTerminal(f) }

// Exported for pkg/cli/rosterapp.

// ConnFlags are the flags that find the gateway.
func ConnFlags() []cli.Flag { return connFlags() }

// JSONFlag is --json.
func JSONFlag() cli.Flag { return jsonFlag() }

// AsFlag is --as NAME.
func AsFlag() cli.Flag { return asFlag() }

// Session is a connected command.
type Session struct {
	Cfg    *config.Config
	Client *api.Client
}

// Connect dials the gateway as connect does.
func Connect(c *cli.Context) (*Session, error) {
	s, err := connect(c)
	if err != nil {
		return nil, err
	}
	return &Session{Cfg: s.cfg, Client: s.client}, nil
}

// Credential loads the configuration and the caller's credential as
// Connect does, without dialing: for a command that dials once per request
// (fleet-mcp). The token is "" when neither --as nor FLEET_TOKEN gives one.
func Credential(c *cli.Context) (*config.Config, string, error) { return credential(c) }

// WaitNotice says on a terminal's stderr, after a second, what the
// command waits for; call the function it returns when the wait is over.
func WaitNotice(c *cli.Context, what string) (done func()) { return waitNotice(c, what) }

// PrintJSON writes v as one JSON line.
func PrintJSON(w io.Writer, v any) error { return printJSON(w, v) }

// Interspersed is the argument reordering Main applies (for the other app
// packages' tests).
func Interspersed(app *cli.App, args []string) []string { return interspersed(app, args) }

// libraryMessage is a command-line library's error in the house style: it
// begins with a capital ("Required flag ...") and may end with a period.
func libraryMessage(err error) string {
	msg := strings.TrimSuffix(err.Error(), ".")
	if msg != "" {
		msg = strings.ToLower(msg[:1]) + msg[1:]
	}
	return msg
}

// RefuseBrokerPassword refuses a broker URI with a password given on the
// command line as flag name (exit 64): ps shows every command line to every
// user. hint says where the URI goes instead. The flag must not be backed
// by an environment variable (IsSet would be true for the variable too).
func RefuseBrokerPassword(c *cli.Context, name, hint string) error {
	if !c.IsSet(name) || !config.HasPassword(c.String(name)) {
		return nil
	}
	return usage("--%s would show the broker password to every user through ps", name).WithHint("%s", hint)
}
