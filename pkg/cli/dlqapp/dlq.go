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
	"github.com/fleetd/fleet/pkg/broker"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
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

// sources are where the dead letters are read: the gateway (nil when none
// runs and --broker was given) and bridge.dlq (nil without --broker).
type sources struct {
	client *api.Client
	host   string
	as     *api.EntityRow // --as: the entity the gateway proved
	dlq    *broker.DLQ
	read   *broker.DLQRead
}

func open(c *ucli.Context) (*sources, error) {
	url, err := operatorURI(c) // before a byte goes anywhere
	if err != nil {
		return nil, err
	}
	s := &sources{}
	as := lineage(c, "as")
	sess, gwErr := fleetcli.Connect(c)
	if gwErr == nil {
		s.client, s.host = sess.Client, sess.Client.Hello.Host
		if as == "" {
			s.client.Token = "" // the host's view: FLEET_TOKEN is not read
		}
	}
	if as != "" {
		// the gateway proves who --as names, as for every command
		if gwErr != nil {
			return nil, gwErr
		}
		resp, err := s.client.Call(&api.WhoamiRequest{})
		if err != nil {
			s.close()
			return nil, err
		}
		if resp.Entity == nil || resp.Entity.Name != as {
			s.close()
			return nil, fault.New(fault.Refused, fault.KindBadCredential, "the credential file of %s is another entity's", as).
				WithHint("register %s again with: fleet-roster join %s", as, as)
		}
		s.as = resp.Entity
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
	var cfg *config.Config
	if sess != nil {
		cfg = sess.Cfg
	}
	dlq, err := broker.OpenDLQ(url, tlsFiles(c, cfg))
	if err != nil {
		s.close()
		return nil, err
	}
	s.dlq = dlq
	return s, nil
}

// tlsFiles are the CA, client certificate and key for an amqps:// broker,
// resolved as the gateway resolves its own (flag, environment, config
// file): an operator on a host uses the files its gateway does.
func tlsFiles(c *ucli.Context, cfg *config.Config) broker.Config {
	if cfg == nil {
		// no gateway: the configuration is read here (a config file that
		// does not load leaves the flags and the environment)
		cfg, _, _ = fleetcli.Credential(c)
	}
	if cfg != nil {
		return broker.Config{CAFile: cfg.BrokerCA, CertFile: cfg.BrokerCert, KeyFile: cfg.BrokerKey}
	}
	get := func(flag, env string) string {
		if v := lineage(c, flag); v != "" {
			return v
		}
		return os.Getenv(env)
	}
	return broker.Config{CAFile: get("broker-ca", "FLEET_BROKER_CA"), CertFile: get("broker-cert", "FLEET_BROKER_CERT"),
		KeyFile: get("broker-key", "FLEET_BROKER_KEY")}
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
	if s.read != nil {
		s.read.Close()
	}
	if s.dlq != nil {
		s.dlq.Close()
	}
}

// brokerDeath says whether this host's reason for a death is a death in
// a broker inbox (gateway/deaths.go words them): it died in its
// recipient's inbox, on the recipient's host's side, as bridge.dlq says.
func brokerDeath(reason string) bool {
	for _, p := range []string{"expired in the broker", "rejected in the broker", "dropped by the broker", "dead in the broker"} {
		if strings.HasPrefix(reason, p) {
			return true
		}
	}
	return false
}

// local lists this host's dead letters.
func (s *sources) local() ([]*Entry, error) {
	if s.client == nil {
		return nil, nil
	}
	resp, err := s.client.Call(&api.DeadRequest{})
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
			e.Recipient = fleetcli.PartyOf(d.Record.Gid, d.Record.Recipient)
		}
		if brokerDeath(e.Reason) && e.Recipient != nil && e.Recipient.Host != "" {
			e.Host = e.Recipient.Host
		}
		s.unseal(e, &api.OpenDeadRequest{MsgID: d.Record.MsgID})
		out = append(out, e)
	}
	return out, nil
}

// remote reads bridge.dlq: every copy, held until close.
func (s *sources) remote() ([]*Entry, error) {
	if s.dlq == nil {
		return nil, nil
	}
	r, err := s.dlq.Read()
	if err != nil {
		return nil, err
	}
	s.read = r
	out := make([]*Entry, 0, len(r.Messages))
	for i, m := range r.Messages {
		e := fromBroker(m)
		e.index = i
		s.unseal(e, &api.OpenDeadRequest{Raw: e.body, Sig: e.sig, SignedBy: e.signedBy})
		out = append(out, e)
	}
	return out, nil
}

// unseal asks this host's gateway to open a sealed copy with req (it
// holds the keys, and checks a bridge.dlq copy's signature first): its
// text where this host's keys open it, else the hosts it is sealed to.
// The sealed bytes themselves are never shown. This host's store holds
// sealed ones too: its own messages that died in a broker inbox, kept as
// they were published.
func (s *sources) unseal(e *Entry, req *api.OpenDeadRequest) {
	env := e.Envelope
	if env == nil || len(env.Sealed) == 0 {
		return
	}
	env.Sealed = nil
	readable := false
	e.Sealed, e.Readable = true, &readable
	if s.client == nil {
		e.Note = "(sealed: text not readable here: no gateway runs to open it)"
		return
	}
	resp, err := s.client.Call(req)
	if err != nil || resp.Opened == nil {
		why := "the gateway did not open it"
		if err != nil {
			why += ": " + err.Error()
		}
		e.Note = "(sealed: text not readable here: " + why + ")"
		return
	}
	o := resp.Opened
	if o.Readable {
		readable = true
		env.Body = o.Text
		return
	}
	e.SealedTo = o.SealedTo
	e.Note = "(sealed to " + hostList(o.SealedTo) + ": text not readable here"
	if o.Reason != "not_for_us" && o.Detail != "" {
		e.Note += "; " + o.Detail
	}
	e.Note += ")"
}

// hostList says the hosts a copy is sealed to.
func hostList(hosts []string) string {
	switch len(hosts) {
	case 0:
		return "no host this one knows"
	case 1:
		return "host " + hosts[0]
	}
	return "hosts " + strings.Join(hosts, ", ")
}

// letters gathers the dead letters of both sources that f selects, one
// each however many copies: this host's first, oldest first, then those
// only bridge.dlq holds, in its order. With --as, only the entity's own.
func (s *sources) letters(f *filter) ([]*letter, error) {
	local, err := s.local()
	if err != nil {
		return nil, err
	}
	remote, err := s.remote()
	if err != nil {
		return nil, err
	}
	var out []*letter
	for _, l := range group(append(local, remote...)) {
		if l.selected(f) && s.mine(l) {
			out = append(out, l)
		}
	}
	return out, nil
}

// group joins copies into letters by their key, in the order each
// letter's first copy comes.
func group(copies []*Entry) []*letter {
	var all []*letter
	byKey := map[string]*letter{}
	for _, e := range copies {
		k := e.key()
		if l := byKey[k]; l != nil {
			l.copies = append(l.copies, e)
			continue
		}
		l := &letter{copies: []*Entry{e}}
		byKey[k] = l
		all = append(all, l)
	}
	return all
}

// mine says whether the letter is --as's entity's: it sent it or was sent
// it (every letter without --as).
func (s *sources) mine(l *letter) bool {
	if s.as == nil {
		return true
	}
	e := l.first()
	return (e.Sender != nil && e.Sender.Gid == s.as.Gid) || (e.Recipient != nil && e.Recipient.Gid == s.as.Gid)
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
	// sealed bodies
	broker.ReasonSealedElsewhere: "sealed to other hosts",
	broker.ReasonUnknownSealKey:  "sealed to a key its host no longer holds",
	broker.ReasonTampered:        "not authentic: sealed bytes altered",
	broker.ReasonUnsealed:        "refused: text in the clear",
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

// Replayed is one replay as fleet-dlq prints it.
type Replayed struct {
	ReplayOf  string   `json:"replay_of"`
	MsgID     string   `json:"msg_id"`
	State     string   `json:"state"`
	Recipient string   `json:"recipient"`
	Where     string   `json:"where"`             // the first source of the dead letter
	Sources   []string `json:"sources,omitempty"` // every place it was removed from
	Again     bool     `json:"again,omitempty"`   // replayed before: sent once more, dropped by the recipient if it has it
	// a MSG_ID replayed before and no dead letter any more: nothing was
	// sent; MsgID and State are the replay made then
	AlreadyReplayed bool `json:"already_replayed,omitempty"`
}

// replayable says whether a dead letter of kind k is ever delivered again
// (the gateway's rule, gateway/dlq.go replayEnv).
func replayable(k string) bool {
	switch envelope.Kind(k) {
	case envelope.Send, envelope.Reply, envelope.Broadcast:
		return true
	}
	return false
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
		return fault.New(fault.Unavailable, fault.KindNoGateway, "a replay needs this host's gateway: it delivers and signs").
			WithHint("start it with: fleet-gw run")
	}
	list, err := s.letters(f)
	if err != nil {
		return err
	}
	var first error
	fail := func(e *Entry, err error) {
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s (%s): %s\n", inert(e.MsgID), inert(e.Where), inert(err.Error()))
		if first == nil {
			first = err
		}
	}
	say := func(r Replayed) {
		if jsonOut(c) {
			_ = fleetcli.PrintJSON(c.App.Writer, r)
			return
		}
		switch {
		case r.AlreadyReplayed:
			fmt.Fprintf(c.App.Writer, "%s was replayed already as %s to %s (%s): nothing sent\n", inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		case r.Again:
			fmt.Fprintf(c.App.Writer, "%s replayed as %s to %s: %s (replayed before: the same message sent again, a copy the recipient has is dropped)\n",
				inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		default:
			fmt.Fprintf(c.App.Writer, "%s replayed as %s to %s: %s\n", inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		}
	}
	done := map[string]bool{} // named ids that are a letter
	skipped := map[string]int{}
	n := 0
	for _, l := range list {
		e := l.row(false)
		named := len(f.ids) > 0 && l.named(f.ids)
		for _, cp := range l.copies {
			done[cp.MsgID] = true
			if cp.Envelope != nil {
				done[cp.Envelope.MsgID] = true
			}
		}
		known := l.first().Envelope != nil || l.stored() != nil // its kind is not just a header
		if known && !replayable(e.Kind) && !named {
			skipped[e.Kind]++ // a filter takes only what can be delivered again
			continue
		}
		n++
		resp, err := s.replay(l)
		if err != nil {
			fail(e, err)
			continue
		}
		say(Replayed{ReplayOf: e.MsgID, MsgID: resp.Sent.MsgID, State: resp.Sent.State, Recipient: resp.Sent.Recipient,
			Where: e.Where, Sources: e.Sources, Again: resp.Sent.Again})
	}
	// a MSG_ID that is no dead letter (any more): what it was replayed as,
	// if this host replayed it; nothing is sent
	for id := range f.ids {
		if done[id] {
			continue
		}
		n++
		resp, err := s.client.Call(&api.ReplayRequest{MsgID: id, Known: true})
		if err == nil && s.as != nil && !ownReplay(resp.Sent, s.as) {
			err = fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s of %s", id, s.as.Name)
		}
		if err != nil {
			fail(&Entry{MsgID: id, Where: whereStore}, err)
			continue
		}
		say(Replayed{ReplayOf: id, MsgID: resp.Sent.MsgID, State: resp.Sent.State, Recipient: resp.Sent.Recipient,
			Where: whereStore, AlreadyReplayed: true})
	}
	if len(skipped) > 0 {
		var kinds []string
		total := 0
		for k, m := range skipped {
			kinds = append(kinds, fmt.Sprintf("%s %d", inert(k), m))
			total += m
		}
		slices.Sort(kinds)
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s never delivered again, skipped (%s); remove them with: fleet-dlq purge --kind KIND\n",
			plural(total), strings.Join(kinds, ", "))
	}
	if n == 0 {
		hint := "list them with: fleet-dlq list"
		if len(skipped) > 0 {
			hint = "only kinds that are never delivered again match: remove them with fleet-dlq purge --kind KIND"
		}
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter to replay matches").WithHint("%s", hint)
	}
	return inertError(first)
}

// ownReplay says whether a replay is of a message ent sent or was sent
// (a replay keeps both).
func ownReplay(sent *api.Sent, ent *api.EntityRow) bool {
	return sent.Gid == ent.Gid || sent.SenderGid == ent.Gid
}

// replay delivers letter l again through the gateway — this host's copy
// if it has one, else a copy from bridge.dlq its signature proves — and
// once delivered removes every copy of it from bridge.dlq (the gateway
// removes its own).
func (s *sources) replay(l *letter) (*api.Response, error) {
	var resp *api.Response
	var err error
	if e := l.stored(); e != nil {
		resp, err = s.client.Call(&api.ReplayRequest{MsgID: e.MsgID})
	} else {
		err = fault.New(fault.Data, fault.KindNotReplayable, "not an envelope: nothing to deliver again").
			WithHint("purge it: fleet-dlq purge %s", l.first().MsgID)
		for _, e := range l.copies {
			if e.Envelope == nil {
				continue
			}
			if !replayable(e.Kind) {
				err = fault.New(fault.Usage, fault.KindNotReplayable, "a %s is never delivered again", e.Kind).
					WithHint("purge it: fleet-dlq purge %s", e.MsgID)
				break
			}
			resp, err = s.client.Call(&api.ReplayRequest{Raw: e.body, Sig: e.sig, SignedBy: e.signedBy})
			if err == nil {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	for _, e := range l.copies {
		if e.Where == whereDLQ {
			if rerr := s.read.Remove(e.index); rerr != nil {
				return resp, rerr
			}
		}
	}
	return resp, nil
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
