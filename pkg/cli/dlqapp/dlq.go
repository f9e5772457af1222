// Package dlqapp is fleet-dlq's command definition: one view over every
// dead letter an operator may see — this host's (from its gateway) and the
// broker's bridge.dlq (with an operator's login) — and what can be done
// with them: show, replay once under a new msg id, purge. It lives apart
// from pkg/cli because it links the AMQP client, which fleet-send should
// not pay for at every start.
package dlqapp

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// NewDLQApp is fleet-dlq.
func NewDLQApp() *ucli.App {
	app := fleetcli.NewApp("fleet-dlq", "list, show, replay and purge dead letters: this host's and the broker's bridge.dlq")
	app.UsageText = "fleet-dlq [options] [list] [--reason R] [--kind K] [--to WHO] [--from WHO] [--since D] [--host H]\n" +
		"fleet-dlq show MSG_ID\n" +
		"fleet-dlq replay MSG_ID... | replay FILTERS\n" +
		"fleet-dlq purge MSG_ID... | purge FILTERS | purge --all"
	app.Description = "Dead letters come from two places: this host's store (messages that died here, or that this " +
		"host sent and that died anywhere) and bridge.dlq on the broker (everything that died in a broker inbox or was " +
		"refused by a gateway), read with an operator's login (--broker, made by fleet-gw broker-setup --operator NAME; " +
		"over amqps:// with the CA and client certificate the gateway uses: --broker-ca, --broker-cert, --broker-key, " +
		"FLEET_BROKER_CA, FLEET_BROKER_CERT, FLEET_BROKER_KEY or the config file's broker-ca, broker-cert, broker-key). " +
		"A dead letter is one row however many places hold it: a message (msg id, recipient and sender's host) that is " +
		"in this host's store and in bridge.dlq is listed once, with both sources. " +
		"Listing and showing never remove anything. A replay delivers each dead letter again, once, to its recipient " +
		"under a new msg id that names it (replay_of), and removes it from every place that held it; a replay by filter " +
		"skips dead letters of kinds that are never delivered again (PRESENCE, RECEIPT, BOUNCE, ASK, control messages) " +
		"and says how many. Replaying a MSG_ID again once it is replayed sends nothing: it prints the replay made " +
		"before, in its present state (\"already_replayed\": true), exit 0. A recipient that is gone is exit 67 and " +
		"the dead letter stays. A copy in bridge.dlq whose text is sealed (what crossed the broker is sealed to the hosts " +
		"that send and deliver it) shows its text only on one of those hosts, where the gateway opens it once its " +
		"signature is proven; elsewhere its metadata, \"sealed\": true, \"readable\": false and the hosts it is sealed " +
		"to (sealed_to), and a replay of it is refused (exit 77) with the host to run it on. --as NAME narrows every command to the dead letters NAME sent or was sent, once the " +
		"gateway has checked NAME's credential; without it, fleet-dlq shows the host's whole view (FLEET_TOKEN is not read)."
	app.Flags = append(commonFlags(), filterFlags()...)
	app.Action = runList
	app.Commands = []*ucli.Command{
		{Name: "list", Usage: "list dead letters, one row each: msg id, kind, sender, recipient, reason, attempts, when, host, sources",
			Flags: filterFlags(), Action: runList},
		{Name: "show", Usage: "one dead letter whole: the message (body included), headers and death history",
			ArgsUsage: "MSG_ID", Action: runShow},
		{Name: "replay", Usage: "deliver dead letters again to their recipients, each once, under a new msg id",
			ArgsUsage: "MSG_ID... | FILTERS", Flags: filterFlags(), Action: runReplay},
		{Name: "purge", Usage: "remove dead letters for good, from every place that holds them, and print how many",
			ArgsUsage: "MSG_ID... | FILTERS | --all",
			Flags:     append(filterFlags(), &ucli.BoolFlag{Name: "all", Usage: "every dead letter (a purge with no id and no filter needs it)"}),
			Action:    runPurge},
	}
	for _, cmd := range app.Commands {
		cmd.Flags = append(cmd.Flags, commonFlags()...)
		cmd.HideHelpCommand = true
		cmd.OnUsageError = app.OnUsageError
	}
	return app
}

func commonFlags() []ucli.Flag {
	return append(fleetcli.ConnFlags(),
		fleetcli.JSONFlag(),
		&ucli.StringFlag{Name: "as", Usage: "only the dead letters entity NAME sent or was sent, proven by its owner-only credential file"},
		// FLEET_DLQ_BROKER is read by operatorURI, not as the flag's
		// EnvVars: only a URI on the command line is refused a password
		&ucli.StringFlag{Name: "broker",
			Usage: "an operator's broker URI, to read bridge.dlq (env FLEET_DLQ_BROKER); without it, this host's dead letters only"},
		// the TLS files resolve as the gateway's do (config.Keys): flag,
		// environment, config file
		&ucli.StringFlag{Name: "broker-ca", Usage: "CA file that signs an amqps:// broker's certificate (env FLEET_BROKER_CA)"},
		&ucli.StringFlag{Name: "broker-cert", Usage: "client certificate file for an amqps:// broker that asks for one (env FLEET_BROKER_CERT)"},
		&ucli.StringFlag{Name: "broker-key", Usage: "the client certificate's key file (env FLEET_BROKER_KEY)"},
	)
}

func filterFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "reason", Usage: "only dead letters whose reason contains R (case-insensitive)"},
		&ucli.StringFlag{Name: "kind", Usage: "only those of kind K (SEND, REPLY, BROADCAST, PRESENCE ...; case-insensitive)"},
		&ucli.StringFlag{Name: "to", Usage: "only those to WHO (a name, name@host or gid)"},
		&ucli.StringFlag{Name: "from", Usage: "only those from WHO (a name, name@host or gid)"},
		&ucli.StringFlag{Name: "since", Usage: "only those dead for at most D (1h) or since a time (RFC 3339)"},
		&ucli.StringFlag{Name: "host", Usage: "only those that died on host H"},
	}
}

// Entry is one dead letter as fleet-dlq prints it (a JSON line each):
// one row however many places hold it (Sources).
type Entry struct {
	MsgID     string          `json:"msg_id"`
	TraceID   string          `json:"trace_id,omitempty"`
	Kind      string          `json:"kind,omitempty"`
	Sender    *fleetcli.Party `json:"sender,omitempty"`
	Recipient *fleetcli.Party `json:"recipient,omitempty"`
	Reason    string          `json:"reason"`
	Attempts  int             `json:"attempts"`
	When      time.Time       `json:"when,omitzero"`
	Where     string          `json:"where"` // its first source: "store" (this host's) or "bridge.dlq"
	Host      string          `json:"host,omitempty"`
	Sources   []string        `json:"sources"` // every place that holds it: "store", "bridge.dlq"

	// show only
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
	Headers  map[string]any     `json:"headers,omitempty"`
	Raw      string             `json:"raw,omitempty"` // a body that is not an envelope, as text

	// a copy whose body is sealed (bridge.dlq holds what crossed the
	// broker): its text is shown only where this host's keys open it;
	// elsewhere SealedTo names the hosts where it is readable
	Sealed   bool     `json:"sealed,omitempty"`
	Readable *bool    `json:"readable,omitempty"`
	SealedTo []string `json:"sealed_to,omitempty"`
	Note     string   `json:"note,omitempty"`

	// a copy in bridge.dlq
	index    int // in the read
	body     []byte
	sig      []byte
	signedBy string
}

const (
	whereStore = "store"
	whereDLQ   = "bridge.dlq"
)

// filter is what the filter flags select.
type filter struct {
	reason, kind, to, from, host string
	since                        time.Time
	ids                          map[string]bool
}

func (f *filter) empty() bool {
	return f.reason == "" && f.kind == "" && f.to == "" && f.from == "" && f.host == "" && f.since.IsZero() && len(f.ids) == 0
}

func lineage(c *ucli.Context, name string) string {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet(name) {
			return ctx.String(name)
		}
	}
	return ""
}

func readFilter(c *ucli.Context, ids bool) (*filter, error) {
	f := &filter{reason: lineage(c, "reason"), kind: lineage(c, "kind"), to: lineage(c, "to"), from: lineage(c, "from"), host: lineage(c, "host")}
	if s := lineage(c, "since"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			f.since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, s); err == nil {
			f.since = t
		} else {
			return nil, fleetcli.Usage("--since %q is neither a duration (1h) nor an RFC 3339 time", s)
		}
	}
	if ids {
		f.ids = map[string]bool{}
		for _, a := range c.Args().Slice() {
			f.ids[a] = true
		}
	} else if c.NArg() > 0 {
		return nil, fleetcli.UnknownCommand(c.App, c.Args().First())
	}
	return f, nil
}

func who(p *fleetcli.Party, want string) bool {
	if p == nil {
		return false
	}
	return want == p.Gid || want == p.Name || (p.Name != "" && want == p.Name+"@"+p.Host)
}

// match says whether one copy of a dead letter is selected by the
// filters (its msg id aside: see letter.named).
func (f *filter) match(e *Entry) bool {
	switch {
	case f.reason != "" && !strings.Contains(strings.ToLower(e.Reason), strings.ToLower(f.reason)):
	case f.kind != "" && !strings.EqualFold(e.Kind, f.kind):
	case f.to != "" && !who(e.Recipient, f.to):
	case f.from != "" && !who(e.Sender, f.from):
	case f.host != "" && e.Host != f.host:
	case !f.since.IsZero() && e.When.Before(f.since):
	default:
		return true
	}
	return false
}

// letter is one dead letter: every copy of it that was read, this host's
// store's first (the one its own gateway vouches for).
type letter struct {
	copies []*Entry
}

func (l *letter) first() *Entry { return l.copies[0] }

// stored is this host's copy, or nil.
func (l *letter) stored() *Entry {
	if e := l.first(); e.Where == whereStore {
		return e
	}
	return nil
}

// named says whether the letter is one of ids: the id of any copy (this
// host's store keys a broadcast copy as msg id/gid).
func (l *letter) named(ids map[string]bool) bool {
	for _, e := range l.copies {
		if ids[e.MsgID] || (e.Envelope != nil && ids[e.Envelope.MsgID]) {
			return true
		}
	}
	return false
}

// selected says whether the filters select the letter: its id when ids
// are named, and every filter by some copy (the store and the broker may
// word its reason, and know where it died, differently).
func (l *letter) selected(f *filter) bool {
	if len(f.ids) > 0 && !l.named(f.ids) {
		return false
	}
	for _, e := range l.copies {
		if f.match(e) {
			return true
		}
	}
	return false
}

// row is the letter as one line: its first copy's fields, where it died
// as the broker tells it when a copy in bridge.dlq does, and its sources.
func (l *letter) row(full bool) *Entry {
	out := *l.first()
	out.Sources = nil
	for _, e := range l.copies {
		if !slices.Contains(out.Sources, e.Where) {
			out.Sources = append(out.Sources, e.Where)
		}
		if e.Where == whereDLQ {
			if e.Host != "" && out.Where == whereStore {
				out.Host = e.Host
			}
			if full && out.Headers == nil {
				out.Headers = e.Headers
			}
			if full && out.Envelope == nil && out.Raw == "" {
				out.Envelope, out.Raw = e.Envelope, e.Raw
			}
		}
	}
	if !full {
		out.Envelope, out.Headers, out.Raw = nil, nil, ""
	}
	return &out
}

// key joins the copies of one dead letter: its msg id, its recipient and
// its sender's host (the host that signs it; another host's message under
// the same msg id is another letter). A copy that is not an envelope is a
// letter of its own.
func (e *Entry) key() string {
	if e.Envelope == nil {
		return fmt.Sprintf("%s\x00%d\x00%s", e.Where, e.index, e.MsgID)
	}
	return e.Envelope.MsgID + "\x00" + e.Envelope.Recipient.Gid + "\x00" + e.Envelope.Sender.Host
}

func jsonOut(c *ucli.Context) bool {
	for _, ctx := range c.Lineage() {
		if ctx.Bool("json") {
			return true
		}
	}
	return !fleetcli.IsTerminal(os.Stdout)
}

func partyString(p *fleetcli.Party) string {
	switch {
	case p == nil:
		return "-"
	case p.Name != "" && p.Host != "":
		return p.Name + "@" + p.Host
	case p.Gid != "":
		return p.Gid
	}
	return "-"
}

func runList(c *ucli.Context) error {
	f, err := readFilter(c, false)
	if err != nil {
		return err
	}
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.close()
	list, err := s.letters(f)
	if err != nil {
		return err
	}
	w := c.App.Writer
	if jsonOut(c) {
		for _, l := range list {
			if err := fleetcli.PrintJSON(w, l.row(false)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(list) == 0 {
		fmt.Fprintln(c.App.ErrWriter, "fleet-dlq: no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MSG ID\tKIND\tFROM\tTO\tREASON\tATTEMPTS\tWHEN\tHOST\tSOURCES")
	for _, l := range list {
		e := l.row(false)
		when := "-"
		if !e.When.IsZero() {
			when = e.When.Local().Format(time.DateTime)
		}
		host := e.Host
		if host == "" {
			host = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", inert(e.MsgID), inert(e.Kind), inert(partyString(e.Sender)),
			inert(partyString(e.Recipient)), inert(clip(e.Reason, 60)), e.Attempts, when, inert(host), strings.Join(e.Sources, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	sealed := 0
	for _, l := range list {
		if e := l.row(false); e.Sealed && e.Readable != nil && !*e.Readable {
			sealed++
		}
	}
	if sealed > 0 {
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s sealed to other hosts: their text is readable only there (fleet-dlq show MSG_ID names them)\n", plural(sealed))
	}
	return nil
}

// inert makes a field safe for a terminal: what bridge.dlq holds came from
// any host's broker login (message ids, types, headers, unchecked
// envelopes), so every control character (an escape sequence, a tab that
// would break the table) is shown as its visible stand-in (deliver.Inert,
// the notation of injected text). Every line of human output goes through
// it; JSON output needs none of this.
func inert(s string) string { return deliver.Inert(s, false) }

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func runShow(c *ucli.Context) error {
	if c.NArg() != 1 {
		return fleetcli.Usage("want exactly one MSG_ID, got %d arguments", c.NArg())
	}
	id := c.Args().First()
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.close()
	list, err := s.letters(&filter{ids: map[string]bool{id: true}})
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s", id).WithHint("list them with: fleet-dlq list")
	}
	for _, l := range list {
		e := l.row(true)
		if jsonOut(c) {
			if err := fleetcli.PrintJSON(c.App.Writer, e); err != nil {
				return err
			}
			continue
		}
		out, _ := json.MarshalIndent(e, "", "  ")
		// JSON escapes C0 controls, not C1 (U+009B is a CSI to some terminals)
		fmt.Fprintf(c.App.Writer, "%s\n", deliver.Inert(string(out), true))
	}
	return nil
}

func runPurge(c *ucli.Context) error {
	f, err := readFilter(c, true)
	if err != nil {
		return err
	}
	all := false
	for _, ctx := range c.Lineage() {
		all = all || ctx.Bool("all")
	}
	if f.empty() && !all {
		return fleetcli.Usage("a purge with no MSG_ID and no filter removes every dead letter: add --all to mean it")
	}
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.close()
	list, err := s.letters(f)
	if err != nil {
		return err
	}
	var ids []string
	for _, l := range list {
		if e := l.stored(); e != nil {
			ids = append(ids, e.MsgID)
		}
	}
	if len(ids) > 0 {
		if _, err := s.client.Call(&api.PurgeDeadRequest{MsgIDs: ids}); err != nil {
			return err
		}
	}
	for _, l := range list {
		for _, e := range l.copies {
			if e.Where == whereDLQ {
				if err := s.read.Remove(e.index); err != nil {
					return err
				}
			}
		}
	}
	count := len(list)
	if jsonOut(c) {
		return fleetcli.PrintJSON(c.App.Writer, map[string]int{"purged": count})
	}
	fmt.Fprintf(c.App.Writer, "purged %s\n", plural(count))
	return nil
}

func plural(n int) string {
	if n == 1 {
		return "1 dead letter"
	}
	return strconv.Itoa(n) + " dead letters"
}

func base64Decode(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("malformed fleet-sig")
	}
	return b, nil
}
