package broker

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Broker logins (design decision 13). Each gateway connects with a login
// of its own that the broker confines to that host's traffic; an operator
// with broker admin rights makes it once per host (fleet-gw broker-setup),
// and a stolen or misused gateway login exposes only its own host.
//
// Why the inbox queue carries the host: RabbitMQ permissions are regular
// expressions on resource names and, for topic exchanges, on routing and
// binding keys. A gid is "<host>.<uuid>", so an inbox is
// agent.<host>.<uuid>.inbox and its binding key on bridge.msg is the gid
// itself: one pattern per host confines both which queues a login may
// consume and which keys it may bind. Senders still route by gid alone
// (invariant 2); the host in it is where the entity was made, not an
// address anyone types.
//
// What a gateway's login may do, and what it may not (each refusal is a
// test in pkg/gateway, TestCrossLeastPrivilege):
//
//	configure  its own inboxes, control.<host>, roster.<host>, deaths.<host>
//	write      publish to bridge.msg, bridge.roster and bridge.control
//	           (its dead-letter copies go by bridge.msg as fleet.dead.<host>, see
//	           DeadKey); bind its own queues; bridge.dead, which its
//	           inboxes dead-letter to (RabbitMQ asks write for that)
//	read       consume its own queues; bind to bridge.msg, bridge.roster,
//	           bridge.control and bridge.dead (never bridge.dlq)
//	topics     bridge.msg: publish to gids, broadcast.<name> and
//	           fleet.dead.<host>; bind only its own gids and broadcast.<name>;
//	           bridge.roster: publish only roster.<host>.…, bind roster.#;
//	           bridge.control: bind only its own host id;
//	           bridge.dead: publish nothing, bind only fleet.sender.<host>
//	           (the deaths of its own messages, see SenderKey)
//
// The shared exchanges and bridge.dlq are made by the provisioning command,
// not by gateways: a login that may declare an exchange may also delete it.

// DLQLength caps bridge.dlq, the operators' copy of every dead letter.
const DLQLength = 100000

// HostUser is the broker login of host's gateway in vhost. Broker users
// are global and one broker may carry several fleets (a vhost each, with
// the same host ids), so the vhost is part of the name.
func HostUser(vhost, host string) string { return "fleet-gw-" + host + "@" + vhost }

// OperatorUser is the broker login of an operator (dead-letter tools).
func OperatorUser(vhost, name string) string { return "fleet-op-" + name + "@" + vhost }

// Grant is what one login may do in the fleet's vhost: RabbitMQ's
// configure / write / read patterns and its topic permissions.
type Grant struct {
	User                   string
	Configure, Write, Read string
	Topics                 []TopicGrant
}

// TopicGrant is a topic permission on one exchange: Write matches the
// routing keys the login may publish with, Read the keys it may bind with.
type TopicGrant struct {
	Exchange, Write, Read string
}

// nothing is a pattern no routing key matches (not even the empty one).
const nothing = `^(?!)`

const (
	gidKeyRE   = `[A-Za-z0-9][A-Za-z0-9_-]{0,62}\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`
	groupKeyRE = `broadcast\.[A-Za-z][A-Za-z0-9_-]{0,63}`
	hostKeyRE  = `[A-Za-z0-9][A-Za-z0-9_-]{0,62}`
)

// HostGrant is the least a gateway for host needs.
func HostGrant(vhost, host string) Grant {
	h := regexp.QuoteMeta(host)
	own := `agent\.` + h + `\.[0-9a-f-]{36}\.inbox|control\.` + h + `|roster\.` + h + `|deaths\.` + h
	return Grant{
		User:      HostUser(vhost, host),
		Configure: `^(` + own + `)$`,
		// write on bridge.dead: RabbitMQ wants it to declare a queue
		// dead-lettering there; its topic permission lets nothing be
		// published to it (only the broker dead-letters into it)
		Write: `^(bridge\.(msg|roster|control|dead)|` + own + `)$`,
		Read:  `^(bridge\.(msg|roster|control|dead)|` + own + `)$`,
		Topics: []TopicGrant{
			{ExMsg, `^(` + gidKeyRE + `|` + groupKeyRE + `|fleet\.dead\.` + h + `)$`, `^(` + h + `\.[0-9a-f-]{36}|` + groupKeyRE + `)$`},
			{ExRoster, `^roster\.` + h + `(\..*)?$`, `^roster\.#$`},
			{ExControl, `^` + hostKeyRE + `$`, `^` + h + `$`},
			{ExDead, nothing, `^fleet\.sender\.` + h + `$`},
		},
	}
}

// OperatorGrant is an operator's login: read, replay and purge the
// dead letters in bridge.dlq; nothing of any host's inboxes.
func OperatorGrant(vhost, name string) Grant {
	return Grant{
		User:      OperatorUser(vhost, name),
		Configure: `^$`,
		Write:     `^bridge\.msg$`,
		Read:      `^bridge\.dlq$`,
		Topics:    []TopicGrant{{ExMsg, `^(` + gidKeyRE + `)$`, `^$`}},
	}
}

// Definitions is what a setup imports into vhost (rabbitmqctl
// import_definitions, one call): the vhost, the three exchanges, bridge.dlq
// bound to bridge.msg as fleet.dead.*, and g's user with passwordHash and its permissions.
// Importing it again changes nothing but the password. With g nil, the
// topology alone.
func Definitions(vhost, queueType string, g *Grant, passwordHash string) []byte {
	type obj = map[string]any
	d := obj{"vhosts": []obj{{"name": vhost}}}
	var exs []obj
	for _, e := range sharedExchanges {
		exs = append(exs, obj{"name": e.name, "vhost": vhost, "type": e.kind, "durable": true,
			"auto_delete": false, "internal": false, "arguments": obj{}})
	}
	d["exchanges"] = exs
	args := obj{"x-max-length": DLQLength}
	for k, v := range queueArgs(queueType) {
		args[k] = v
	}
	d["queues"] = []obj{{"name": QDLQ, "vhost": vhost, "durable": true, "auto_delete": false, "arguments": args}}
	d["bindings"] = []obj{
		{"source": ExMsg, "vhost": vhost, "destination": QDLQ, "destination_type": "queue", "routing_key": "fleet.dead.*", "arguments": obj{}},
		{"source": ExDead, "vhost": vhost, "destination": QDLQ, "destination_type": "queue", "routing_key": DLQDeadKey, "arguments": obj{}},
	}
	if g != nil {
		d["users"] = []obj{{"name": g.User, "password_hash": passwordHash,
			"hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []string{}}}
		d["permissions"] = []obj{{"user": g.User, "vhost": vhost, "configure": g.Configure, "write": g.Write, "read": g.Read}}
		var tps []obj
		for _, t := range g.Topics {
			tps = append(tps, obj{"user": g.User, "vhost": vhost, "exchange": t.Exchange, "write": t.Write, "read": t.Read})
		}
		d["topic_permissions"] = tps
	}
	out, _ := json.MarshalIndent(d, "", "  ")
	return out
}

// HashPassword is RabbitMQ's rabbit_password_hashing_sha256 form of
// password: base64(salt ++ sha256(salt ++ password)), salt 4 random bytes.
func HashPassword(password string) string {
	var salt [4]byte
	if _, err := rand.Read(salt[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	sum := sha256.Sum256(append(salt[:], password...))
	return base64.StdEncoding.EncodeToString(append(salt[:], sum[:]...))
}

// Step is one rabbitmqctl call of a provisioning: its arguments and what
// it reads on standard input (a password or definitions: never an
// argument, so never in ps or a shell history).
type Step struct {
	Args  []string
	Stdin string
	// Secret marks Stdin as the password: shown as $PASSWORD.
	Secret bool
	// Tolerate is a substring of the output that makes a failure fine
	// (the user is already gone, say).
	Tolerate string
}

// SetupSteps are the rabbitmqctl commands that make g's login in vhost one
// by one, for an operator to read or run by hand (fleet-gw broker-setup
// --dry-run). Setup does the same with one definitions import, which is
// quicker: each rabbitmqctl call starts an Erlang VM.
func SetupSteps(g Grant, vhost, queueType string) []Step {
	steps := []Step{
		{Args: []string{"import_definitions"}, Stdin: string(Definitions(vhost, queueType, nil, "")) + "\n"},
		{Args: []string{"add_user", g.User}, Secret: true},
		{Args: []string{"set_permissions", "-p", vhost, g.User, g.Configure, g.Write, g.Read}},
	}
	for _, t := range g.Topics {
		steps = append(steps, Step{Args: []string{"set_topic_permissions", "-p", vhost, g.User, t.Exchange, t.Write, t.Read}})
	}
	return steps
}

// RemoveSteps delete user and close its open connections: a removed
// gateway loses the broker at once, and cannot log in again. Its queues
// stay (messages waiting for its entities are not thrown away).
func RemoveSteps(user string) []Step {
	return []Step{
		{Args: []string{"delete_user", user}, Tolerate: "does not exist"},
		{Args: []string{"close_all_user_connections", user, "fleet: broker login removed"}},
	}
}

// Shell renders a step as a line an operator can paste into a shell.
func (s Step) Shell(ctl string) string {
	var b strings.Builder
	if s.Secret {
		b.WriteString(`printf '%s\n' "$PASSWORD" | `)
	}
	b.WriteString(ctl)
	for _, a := range s.Args {
		b.WriteString(" " + shellQuote(a))
	}
	if s.Stdin != "" && !s.Secret {
		fmt.Fprintf(&b, " <<'EOF'\n%sEOF", s.Stdin)
	}
	return b.String()
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Provisioner runs provisioning steps with rabbitmqctl (Ctl: the command
// and its leading arguments, e.g. {"rabbitmqctl"} or {"sudo",
// "rabbitmqctl"}), on the broker's machine or wherever rabbitmqctl can
// reach the node.
type Provisioner struct {
	Ctl []string
	// QueueType of bridge.dlq: classic, or quorum on a cluster (as the
	// gateways' inbox-queue-type).
	QueueType string
}

func (p Provisioner) run(s Step) (string, error) {
	if len(p.Ctl) == 0 {
		return "", errors.New("no rabbitmqctl command")
	}
	cmd := exec.Command(p.Ctl[0], append(append([]string(nil), p.Ctl[1:]...), s.Args...)...)
	cmd.Stdin = strings.NewReader(s.Stdin)
	out, err := cmd.CombinedOutput()
	if err != nil && s.Tolerate != "" && strings.Contains(string(out), s.Tolerate) {
		return string(out), nil
	}
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl %s: %w: %s", s.Args[0], err, lastLine(string(out)))
	}
	return string(out), nil
}

func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return "(no output)"
}

// Run carries out steps in order, stopping at the first failure.
func (p Provisioner) Run(steps []Step) error {
	for _, s := range steps {
		if _, err := p.run(s); err != nil {
			return err
		}
	}
	return nil
}

// Setup makes (or re-makes, with a new password) g's login in the vhost of
// base (an amqp:// or amqps:// URI without credentials), with the fleet's
// topology, and returns the URI the gateway connects with. The password is
// random; rabbitmqctl gets only its hash, on standard input; the login is
// proved by authenticating it before Setup returns.
func (p Provisioner) Setup(g Grant, base string) (string, error) {
	u, vhost, err := ParseBase(base)
	if err != nil {
		return "", err
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	password := base64.RawURLEncoding.EncodeToString(raw[:])
	// an import keeps an exchange that exists with another type (a
	// bridge.control from before it was a topic exchange): refused before
	// the import, which would already have changed the password
	if out, err := p.run(Step{Args: []string{"list_exchanges", "-p", vhost, "--quiet", "--no-table-headers", "name", "type"}}); err == nil {
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			for _, e := range sharedExchanges {
				if len(f) == 2 && f[0] == e.name && f[1] != e.kind {
					return "", fmt.Errorf("%s exists in vhost %s with another type than %s (made by an earlier version): delete it (rabbitmqadmin delete exchange name=%s, or the management UI) and run this again", e.name, vhost, e.kind, e.name)
				}
			}
		}
	} // else: no such vhost yet, the import makes it
	if err := p.Run([]Step{{Args: []string{"import_definitions"}, Stdin: string(Definitions(vhost, p.QueueType, &g, HashPassword(password)))}}); err != nil {
		return "", err
	}
	// the import is applied by the time rabbitmqctl returns on the
	// versions we run, though it says "asynchronous": wait for proof
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := p.run(Step{Args: []string{"authenticate_user", g.User}, Stdin: password + "\n"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the new login does not authenticate: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	u.User = url.UserPassword(g.User, password)
	return u.String(), nil
}

// ParseBase checks a broker address for provisioning: amqp:// or amqps://,
// no credentials in it. It returns the URL and its vhost.
func ParseBase(base string) (*url.URL, string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		return nil, "", fmt.Errorf("broker address %q is not an amqp:// or amqps:// URI", Redact(base))
	}
	if u.User != nil {
		return nil, "", errors.New("the broker address must not carry a user or password: the login is made here")
	}
	uri, err := amqp.ParseURI(u.String())
	if err != nil {
		return nil, "", fmt.Errorf("broker address: %w", err)
	}
	if uri.Vhost == "" { // amqps://host/ is the default vhost, as a gateway dials it
		uri.Vhost = "/"
	}
	return u, uri.Vhost, nil
}
