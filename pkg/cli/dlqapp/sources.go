package dlqapp

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	amqp "github.com/rabbitmq/amqp091-go"
	ucli "github.com/urfave/cli/v2"
)

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
	broker.ReasonNotAccepted: "refused: its recipient does not accept the sender",
	broker.ReasonLoop:        "refused: a loop, past max-hops",
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
