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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	amqp "github.com/rabbitmq/amqp091-go"
	ucli "github.com/urfave/cli/v2"
)

// NewDLQApp is fleet-dlq.
func NewDLQApp() *ucli.App {
	app := fleetcli.NewApp("fleet-dlq", "list, show, replay and purge dead letters: this host's and the broker's bridge.dlq")
	app.UsageText = "fleet-dlq [options] [list] [--reason R] [--to WHO] [--from WHO] [--since D] [--host H]\n" +
		"fleet-dlq show MSG_ID\n" +
		"fleet-dlq replay MSG_ID... | replay FILTERS\n" +
		"fleet-dlq purge MSG_ID... | purge FILTERS | purge --all"
	app.Description = "Dead letters come from two places: this host's store (messages that died here, or that this " +
		"host sent and that died anywhere) and bridge.dlq on the broker (everything that died in a broker inbox or was " +
		"refused by a gateway), read with an operator's login (--broker, made by fleet-gw broker-setup --operator NAME). " +
		"Listing and showing never remove anything. A replay delivers a dead letter again to its recipient under a new " +
		"msg id that names it (replay_of), at most once however often it is asked; a recipient that is gone is exit 67 " +
		"and the dead letter stays."
	app.Flags = append(commonFlags(), filterFlags()...)
	app.Action = runList
	app.Commands = []*ucli.Command{
		{Name: "list", Usage: "list dead letters: msg id, trace id, kind, sender, recipient, reason, attempts, when, where",
			Flags: filterFlags(), Action: runList},
		{Name: "show", Usage: "one dead letter whole: the message (body included), headers and death history",
			ArgsUsage: "MSG_ID", Action: runShow},
		{Name: "replay", Usage: "deliver dead letters again to their recipients, each once, under a new msg id",
			ArgsUsage: "MSG_ID... | FILTERS", Flags: filterFlags(), Action: runReplay},
		{Name: "purge", Usage: "remove dead letters for good and print how many",
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
		// FLEET_DLQ_BROKER is read by operatorURI, not as the flag's
		// EnvVars: only a URI on the command line is refused a password
		&ucli.StringFlag{Name: "broker",
			Usage: "an operator's broker URI, to read bridge.dlq (env FLEET_DLQ_BROKER); without it, this host's dead letters only"},
		&ucli.StringFlag{Name: "broker-ca", EnvVars: []string{"FLEET_BROKER_CA"}, Usage: "CA file for an amqps:// broker (env FLEET_BROKER_CA)"},
	)
}

func filterFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "reason", Usage: "only dead letters whose reason contains R (case-insensitive)"},
		&ucli.StringFlag{Name: "to", Usage: "only those to WHO (a name, name@host or gid)"},
		&ucli.StringFlag{Name: "from", Usage: "only those from WHO (a name, name@host or gid)"},
		&ucli.StringFlag{Name: "since", Usage: "only those dead for at most D (1h) or since a time (RFC 3339)"},
		&ucli.StringFlag{Name: "host", Usage: "only those that died on host H"},
	}
}

// Entry is one dead letter as fleet-dlq prints it (a JSON line each).
type Entry struct {
	MsgID     string          `json:"msg_id"`
	TraceID   string          `json:"trace_id,omitempty"`
	Kind      string          `json:"kind,omitempty"`
	Sender    *fleetcli.Party `json:"sender,omitempty"`
	Recipient *fleetcli.Party `json:"recipient,omitempty"`
	Reason    string          `json:"reason"`
	Attempts  int             `json:"attempts"`
	When      time.Time       `json:"when,omitzero"`
	Where     string          `json:"where"` // "store" (this host's) or "bridge.dlq"
	Host      string          `json:"host,omitempty"`

	// show only
	Envelope *envelope.Envelope `json:"envelope,omitempty"`
	Headers  map[string]any     `json:"headers,omitempty"`
	Raw      string             `json:"raw,omitempty"` // a body that is not an envelope, as text

	body     []byte // bridge.dlq: the signed bytes
	sig      []byte
	signedBy string
}

const (
	whereStore = "store"
	whereDLQ   = "bridge.dlq"
)

// filter is what the filter flags select.
type filter struct {
	reason, to, from, host string
	since                  time.Time
	ids                    map[string]bool
}

func (f *filter) empty() bool {
	return f.reason == "" && f.to == "" && f.from == "" && f.host == "" && f.since.IsZero() && len(f.ids) == 0
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
	f := &filter{reason: lineage(c, "reason"), to: lineage(c, "to"), from: lineage(c, "from"), host: lineage(c, "host")}
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

func (f *filter) match(e *Entry) bool {
	switch {
	case len(f.ids) > 0 && !f.ids[e.MsgID]:
	case f.reason != "" && !strings.Contains(strings.ToLower(e.Reason), strings.ToLower(f.reason)):
	case f.to != "" && !who(e.Recipient, f.to):
	case f.from != "" && !who(e.Sender, f.from):
	case f.host != "" && e.Host != f.host:
	case !f.since.IsZero() && e.When.Before(f.since):
	default:
		return true
	}
	return false
}

// sources are where the dead letters are read: the gateway (nil when none
// runs and --broker was given) and bridge.dlq (nil without --broker).
type sources struct {
	client *api.Client
	host   string
	dlq    *broker.DLQ
}

func open(c *ucli.Context) (*sources, error) {
	url, err := operatorURI(c) // before a byte goes anywhere
	if err != nil {
		return nil, err
	}
	s := &sources{}
	sess, gwErr := fleetcli.Connect(c)
	if gwErr == nil {
		s.client, s.host = sess.Client, sess.Client.Hello.Host
	}
	if url == "" {
		if gwErr != nil {
			return nil, gwErr
		}
		if sess.Cfg.Broker != "" {
			fmt.Fprintln(c.App.ErrWriter, "fleet-dlq: bridge.dlq not read: no operator login (--broker or FLEET_DLQ_BROKER; make one with fleet-gw broker-setup --operator NAME)")
		}
		return s, nil
	}
	if gwErr != nil {
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: this host's dead letters not read: %s\n", inert(gwErr.Error()))
	}
	dlq, err := broker.OpenDLQ(url, broker.Config{CAFile: lineage(c, "broker-ca")})
	if err != nil {
		if s.client != nil {
			s.client.Close()
		}
		return nil, err
	}
	s.dlq = dlq
	return s, nil
}

// operatorURI is the operator's broker URI: --broker (refused with a
// password in it, as fleet-gw run --broker is), else FLEET_DLQ_BROKER.
func operatorURI(c *ucli.Context) (string, error) {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet("broker") {
			err := fleetcli.RefuseBrokerPassword(ctx, "broker", "put the URI in FLEET_DLQ_BROKER (an operator's login is in no config file)")
			return ctx.String("broker"), err
		}
	}
	return os.Getenv("FLEET_DLQ_BROKER"), nil
}

func (s *sources) close() {
	if s.client != nil {
		s.client.Close()
	}
	if s.dlq != nil {
		s.dlq.Close()
	}
}

// local lists this host's dead letters.
func (s *sources) local() ([]*Entry, error) {
	if s.client == nil {
		return nil, nil
	}
	resp, err := s.client.Call(&api.Request{Op: api.OpDead})
	if err != nil {
		return nil, err
	}
	out := make([]*Entry, 0, len(resp.Dead))
	for _, d := range resp.Dead {
		e := &Entry{MsgID: d.Record.MsgID, TraceID: d.Record.TraceID, Kind: d.Record.Kind, Reason: d.Record.Reason,
			Attempts: d.Record.Attempts, When: d.Record.Done, Where: whereStore, Host: s.host, Envelope: d.Envelope}
		if env := d.Envelope; env != nil {
			e.Sender, e.Recipient = fleetcli.PartyFrom(env.Sender), fleetcli.PartyFrom(env.Recipient)
		} else {
			e.Recipient = fleetcli.PartyOf(d.Record.Recipient, "")
		}
		out = append(out, e)
	}
	return out, nil
}

// walk visits bridge.dlq; visit says whether to remove each.
func (s *sources) walk(visit func(e *Entry) (bool, error)) error {
	if s.dlq == nil {
		return nil
	}
	return s.dlq.Walk(func(m *broker.DLQMessage) (bool, error) { return visit(fromBroker(m)) })
}

// refusalWords says a gateway's refusal reason (fleet-reason) as the
// issue's vocabulary of deaths.
var refusalWords = map[string]string{
	broker.ReasonMalformed:   "poison: not a valid envelope",
	broker.ReasonNewerSchema: "newer schema",
	broker.ReasonUnsigned:    "not authentic: unsigned",
	broker.ReasonUntrusted:   "not authentic: untrusted host",
	broker.ReasonForged:      "not authentic: bad signature",
	broker.ReasonWrongHost:   "not authentic: claims another host",
	broker.ReasonReplay:      "not authentic: replayed",
	broker.ReasonNotMember:   "misrouted: not a member",
	broker.ReasonMisrouted:   "misrouted",
}

func fromBroker(m *broker.DLQMessage) *Entry {
	e := &Entry{MsgID: m.MessageID, Kind: m.Type, Where: whereDLQ, When: m.Timestamp, body: m.Body, Headers: map[string]any{}}
	for k, v := range m.Headers {
		e.Headers[k] = v
	}
	e.signedBy, _ = m.Headers["fleet-host"].(string)
	if sig, ok := m.Headers["fleet-sig"].(string); ok {
		e.sig, _ = base64Decode(sig)
	}
	if env, err := envelope.Decode(m.Body, 1<<30); err == nil {
		e.Envelope = env
		e.MsgID, e.TraceID, e.Kind = env.MsgID, env.TraceID, string(env.Kind)
		e.Sender, e.Recipient = fleetcli.PartyFrom(env.Sender), fleetcli.PartyFrom(env.Recipient)
	} else {
		e.Raw = strings.ToValidUTF8(string(m.Body), "\uFFFD")
		e.TraceID, _ = m.Headers["fleet-trace-id"].(string)
	}
	reason, _ := m.Headers["fleet-reason"].(string)
	if words, ok := refusalWords[reason]; ok {
		reason = words
	}
	if n, ok := m.Headers["fleet-attempts"].(int64); ok {
		e.Attempts = int(n)
	}
	e.Host, _ = m.Headers["fleet-refused-by"].(string)
	if e.Host == "" {
		e.Host, _ = m.Headers["fleet-host"].(string) // a gateway's copy of a death on its host
	}
	if xs, ok := m.Headers["x-death"].([]any); ok && len(xs) > 0 && reason == "" {
		if x, ok := xs[0].(amqp.Table); ok {
			reason = xDeathWords(x["reason"])
			if q, ok := x["queue"].(string); ok {
				e.Host = queueHost(q)
			}
			if n, ok := x["count"].(int64); ok {
				e.Attempts = int(n)
			}
			if t, ok := x["time"].(time.Time); ok {
				e.When = t
			}
		}
	}
	if reason == "" {
		reason = "unknown"
	}
	e.Reason = reason
	return e
}

func xDeathWords(r any) string {
	switch r {
	case "expired":
		return "expired in the broker"
	case "rejected":
		return "rejected in the broker (delivery failed on its host)"
	case "maxlen":
		return "inbox full in the broker"
	case "delivery_limit":
		return "delivery limit reached in the broker"
	}
	return fmt.Sprintf("dead in the broker (%v)", r)
}

// queueHost is the host of an inbox queue agent.<host>.<uuid>.inbox.
func queueHost(q string) string {
	if gid, ok := strings.CutSuffix(strings.TrimPrefix(q, "agent."), ".inbox"); ok && ident.IsGid(gid) {
		return ident.GidHost(gid)
	}
	return ""
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

// collect gathers the matching dead letters of both sources, this host's
// first, oldest first within each.
func collect(s *sources, f *filter) ([]*Entry, error) {
	local, err := s.local()
	if err != nil {
		return nil, err
	}
	var out []*Entry
	for _, e := range local {
		if f.match(e) {
			out = append(out, e)
		}
	}
	err = s.walk(func(e *Entry) (bool, error) {
		if f.match(e) {
			out = append(out, e)
		}
		return false, nil
	})
	return out, err
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
	list, err := collect(s, f)
	if err != nil {
		return err
	}
	w := c.App.Writer
	if jsonOut(c) {
		for _, e := range list {
			line := *e
			line.Envelope, line.Headers, line.Raw = nil, nil, ""
			if err := fleetcli.PrintJSON(w, &line); err != nil {
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
	fmt.Fprintln(tw, "MSG ID\tKIND\tFROM\tTO\tREASON\tATTEMPTS\tWHEN\tWHERE")
	for _, e := range list {
		when := "-"
		if !e.When.IsZero() {
			when = e.When.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", inert(e.MsgID), inert(e.Kind), inert(partyString(e.Sender)),
			inert(partyString(e.Recipient)), inert(clip(e.Reason, 60)), e.Attempts, when, inert(e.Where+" "+e.Host))
	}
	return tw.Flush()
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
	list, err := collect(s, &filter{ids: map[string]bool{id: true}})
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s", id).WithHint("list them with: fleet-dlq list")
	}
	for _, e := range list {
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

// Replayed is one replay as fleet-dlq prints it.
type Replayed struct {
	ReplayOf  string `json:"replay_of"`
	MsgID     string `json:"msg_id"`
	State     string `json:"state"`
	Recipient string `json:"recipient"`
	Where     string `json:"where"`
	Again     bool   `json:"again,omitempty"` // replayed before: sent once more, dropped by the recipient if it has it
}

func runReplay(c *ucli.Context) error {
	f, err := readFilter(c, true)
	if err != nil {
		return err
	}
	if f.empty() {
		return fleetcli.Usage("name the dead letters to replay: MSG_ID... or a filter")
	}
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.close()
	if s.client == nil {
		return fault.New(fault.Unavailable, fault.KindNoGateway, "a replay needs this host's gateway: it delivers and signs")
	}
	var first error
	n := 0
	report := func(e *Entry, resp *api.Response, err error) bool {
		n++
		if err != nil {
			fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s (%s): %s\n", inert(e.MsgID), inert(e.Where), inert(err.Error()))
			if first == nil {
				first = err
			}
			return false
		}
		r := Replayed{ReplayOf: e.MsgID, MsgID: resp.Sent.MsgID, State: resp.Sent.State, Recipient: resp.Sent.Recipient,
			Where: e.Where, Again: resp.Sent.Again}
		if jsonOut(c) {
			_ = fleetcli.PrintJSON(c.App.Writer, r)
		} else {
			again := ""
			if r.Again {
				again = " (replayed before: sent again, a copy the recipient has is dropped)"
			}
			fmt.Fprintf(c.App.Writer, "%s replayed as %s to %s: %s%s\n", inert(e.MsgID), inert(r.MsgID), inert(r.Recipient), inert(r.State), again)
		}
		return true
	}
	local, err := s.local()
	if err != nil {
		return err
	}
	for _, e := range local {
		if f.match(e) {
			resp, err := s.client.Call(&api.Request{Op: api.OpReplay, MsgID: e.MsgID})
			report(e, resp, err)
		}
	}
	err = s.walk(func(e *Entry) (bool, error) {
		if !f.match(e) {
			return false, nil
		}
		if e.Envelope == nil {
			report(e, nil, fault.New(fault.Data, fault.KindNotReplayable, "not an envelope: nothing to deliver again (purge it)"))
			return false, nil
		}
		resp, err := s.client.Call(&api.Request{Op: api.OpReplay, Raw: e.body, Sig: e.sig, SignedBy: e.signedBy})
		return report(e, resp, err), nil // delivered: this copy is done
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter matches").WithHint("list them with: fleet-dlq list")
	}
	return inertError(first)
}

// inertError is err with its text made inert, its exit code and kind kept:
// a refusal may quote what a dead letter holds.
func inertError(err error) error {
	if err == nil {
		return nil
	}
	out := &fault.Error{Code: fault.CodeOf(err), Kind: fault.KindInternal, Msg: inert(err.Error()), Hint: inert(fault.HintOf(err))}
	var fe *fault.Error
	if errors.As(err, &fe) {
		out.Kind = fe.Kind
	}
	return out
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
	local, err := s.local()
	if err != nil {
		return err
	}
	var ids []string
	for _, e := range local {
		if f.match(e) {
			ids = append(ids, e.MsgID)
		}
	}
	count := 0
	if len(ids) > 0 {
		resp, err := s.client.Call(&api.Request{Op: api.OpPurgeDead, MsgIDs: ids})
		if err != nil {
			return err
		}
		count += resp.Count
	}
	err = s.walk(func(e *Entry) (bool, error) {
		if f.match(e) {
			count++
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return err
	}
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
