// Package config resolves fleet's settings with one precedence for every
// command: flag > FLEET_* environment > config file > default. Every short
// command finds the gateway's socket the same way the gateway chose it.
package config

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/private"
	"github.com/fleetd/fleet/pkg/trust"
)

// Config is the resolved configuration of one gateway or client.
type Config struct {
	Host     string // host id; default: the hostname
	StateDir string // durable state: store, credentials, audit log
	Socket   string // the gateway's local socket
	// SocketSet: Socket was given (flag, environment, config file), not
	// guessed; a client that finds no gateway at a guessed socket also
	// tries the one the gateway recorded (RecordedSocket).
	SocketSet bool
	File      string // config file that was read, if any

	MaxBody          int           // body limit in bytes
	DeliveryAttempts int           // inject attempts before dead-lettering
	RetryBase        time.Duration // first retry delay
	RetryMax         time.Duration // cap on the retry delay
	NudgeAfter       time.Duration // first nudge after a message waits this long
	NudgeMax         time.Duration // cap on the nudge interval
	SettleDelay      time.Duration // tmux: pause between paste and Enter
	ExecTimeout      time.Duration // exec adapter and hooks: time limit per run
	StartBound       time.Duration // tmux: starting past this with no hook is unhooked
	StuckAfter       time.Duration // tmux: busy past this with no hook is stuck
	ConfirmWithin    time.Duration // tmux: how long a paste's proof of delivery may take
	DedupWindow      time.Duration // how long delivered msg ids are remembered
	DeadRetention    time.Duration // how long dead letters are kept before they are pruned
	DrainTimeout     time.Duration // shutdown: bound on finishing in-flight work
	Uncertain        string        // "hold" or "reinject": the kill-during-inject window
	MaxConnections   int           // socket connections served at once; more are refused (pkg/gateway slots)
	FrameTimeout     time.Duration // a socket frame, once begun, must be complete within this; a connection's first, within this of connecting
	AuditMaxSize     int           // bytes of audit.log before it is rotated
	AuditFiles       int           // rotated audit files kept (audit.log.1 … .N)
	MetricsListen    string        // host:port of the Prometheus endpoint; "" = off

	Broker         string        // amqp:// or amqps:// URI; "" = single-host mode
	BrokerCA       string        // amqps: private CA file
	BrokerCert     string        // amqps: client certificate file
	BrokerKey      string        // amqps: client key file
	Heartbeat      time.Duration // AMQP heartbeat
	InboxMaxLength int           // every inbox's cap: x-max-length on the broker, the gateway's for local ones
	InboxQueueType string        // classic or quorum
	InboxTTL       time.Duration // every inbox's message TTL: x-message-ttl on the broker, the gateway's sweep for local ones; 0: none
	PublishTimeout time.Duration // bound on a broker confirm

	TrustFile        string        // host public keys admitted across hosts
	AcceptDefault    []accept.Rule // who may reach an entity that has no policy of its own (issue 37.1)
	PlaintextHosts   []string      // hosts sent (and accepted from) unsealed text: no sealing key (issue 27); loud
	SealFallback     string        // refuse (77) or clear: text to a trusted host that announces no sealing key (issue 36)
	AskTTL           time.Duration // default time an ask waits for its answer
	MaxHops          int           // a message past this many hops in its trace is refused as a loop
	PairRate         int           // messages one entity may send another a minute; 0: no limit
	UrgentRate       int           // urgent messages one entity may send a minute, to anyone; 0: no limit
	PresenceInterval time.Duration // heartbeat interval on bridge.roster
	PresenceTTL      time.Duration // a host not heard this long leaves the view

	Profiles map[string]*Profile // fleet-spawn profiles: profile.NAME.* keys of the file only (profile.go)
}

// Key describes one setting: its config-file key, environment variable and
// help text. The CLI builds its flags from this table, the docs list it.
type Key struct {
	Name, Env, Usage, Default string
}

// Choices are the values of the settings that take one of a fixed set:
// the config check reads them here, and so do fleet-gw's flags and, from
// those, the shell completions.
var Choices = map[string][]string{
	"uncertain":        {"hold", "reinject"},
	"inbox-queue-type": {"classic", "quorum"},
	"seal-fallback":    {"refuse", "clear"},
}

// ChoiceHints are the next step for a setting of Choices given another
// value (the flag's error, and the config's when it is the only one).
var ChoiceHints = map[string]string{
	"seal-fallback": "leave seal-fallback out (refuse: a host with no sealing key gets no text) or set seal-fallback = clear; fleet-security(7), SEALED BODIES",
}

// Keys is every setting, in the order the docs list them.
var Keys = []Key{
	{"host", "FLEET_HOST", "host id of this gateway", "the hostname"},
	{"state-dir", "FLEET_STATE_DIR", "folder for the store, credentials and audit log", "$XDG_STATE_HOME/fleet"},
	{"socket", "FLEET_SOCKET", "the gateway's local socket", "$XDG_RUNTIME_DIR/fleet/gw.sock, else STATE_DIR/gw.sock"},
	{"max-body", "FLEET_MAX_BODY", "largest message body in bytes", "1048576"},
	{"delivery-attempts", "FLEET_DELIVERY_ATTEMPTS", "inject attempts before a message is dead-lettered", "5"},
	{"retry-base", "FLEET_RETRY_BASE", "first delay between inject attempts", "1s"},
	{"retry-max", "FLEET_RETRY_MAX", "longest delay between inject attempts", "1m"},
	{"nudge-after", "FLEET_NUDGE_AFTER", "first nudge of a pull entity after mail waits this long", "30s"},
	{"nudge-max", "FLEET_NUDGE_MAX", "longest interval between nudges", "30m"},
	{"settle-delay", "FLEET_SETTLE_DELAY", "tmux: pause between pasting the text and pressing Enter", "150ms"},
	{"exec-timeout", "FLEET_EXEC_TIMEOUT", "time limit of one exec delivery or hook", "30s"},
	{"start-bound", "FLEET_START_BOUND", "tmux: an agent that sent no hook this long after it joined reads unhooked", "2m"},
	{"stuck-after", "FLEET_STUCK_AFTER", "tmux: an agent busy this long with no hook reads stuck", "10m"},
	{"confirm-within", "FLEET_CONFIRM_WITHIN", "tmux: a paste is delivered only if the agent shows it took it within this", "15s"},
	{"dedup-window", "FLEET_DEDUP_WINDOW", "how long delivered msg ids are remembered", "168h"},
	{"dead-retention", "FLEET_DEAD_RETENTION", "how long a dead letter is kept (fleet-roster dead) before it is pruned; its msg id is still remembered for the dedup window", "720h"},
	{"drain-timeout", "FLEET_DRAIN_TIMEOUT", "bound on finishing in-flight work at shutdown", "10s"},
	{"max-connections", "FLEET_MAX_CONNECTIONS", "socket connections the gateway serves at once; at the cap a new one takes the place of the oldest that has sent nothing, and is refused only when every one has spoken", "1024"},
	{"frame-timeout", "FLEET_FRAME_TIMEOUT", "time a client has to finish sending a request frame it has begun, and a new connection its first frame (one that has spoken may idle between frames)", "10s"},
	{"audit-max-size", "FLEET_AUDIT_MAX_SIZE", "bytes of STATE_DIR/audit.log before it is rotated to audit.log.1 (fleet-trace searches every file)", "67108864"},
	{"audit-files", "FLEET_AUDIT_FILES", "rotated audit files kept (audit.log.1 … audit.log.N); the oldest is removed", "5"},
	{"metrics-listen", "FLEET_METRICS_LISTEN", "serve Prometheus metrics on HOST:PORT at /metrics (no authentication: keep it on 127.0.0.1 unless the network is private)", "none (off)"},
	{"uncertain", "FLEET_UNCERTAIN", "a message whose injection was cut by a crash: hold (dead-letter as uncertain) or reinject", "hold"},
	{"broker", "FLEET_BROKER", "AMQP broker URI (amqp:// or amqps://) for cross-host messages, or a cluster's node URIs separated by commas; none: single-host mode", "none"},
	{"broker-ca", "FLEET_BROKER_CA", "amqps: CA certificate file that signs the broker's certificate", "the system roots"},
	{"broker-cert", "FLEET_BROKER_CERT", "amqps: client certificate file", "none"},
	{"broker-key", "FLEET_BROKER_KEY", "amqps: client key file", "none"},
	{"heartbeat", "FLEET_HEARTBEAT", "AMQP heartbeat interval: a silent network is noticed within a few", "5s"},
	{"inbox-max-length", "FLEET_INBOX_MAX_LENGTH", "cap of every inbox (local and broker) in messages; over it, a new message is refused (the sender is told the inbox is full, 75), dead-lettered and bounced", "10000"},
	{"inbox-queue-type", "FLEET_INBOX_QUEUE_TYPE", "broker inboxes and control queues: classic (one broker node) or quorum (replicated across a cluster's nodes; the length cap is then approximate)", "classic"},
	{"inbox-ttl", "FLEET_INBOX_TTL", "how long a message may wait in an inbox (local or broker) before it is dead-lettered as expired, its sender bounced; 0s: for ever", "168h"},
	{"publish-timeout", "FLEET_PUBLISH_TIMEOUT", "longest wait for the broker to confirm a remote send", "5s"},
	{"trust-file", "FLEET_TRUST_FILE", "host public keys whose signed messages are admitted (lines HOST KEY SEALING-KEY; fleet-gw key prints this host's)", "STATE_DIR/trust"},
	{"accept-default", "FLEET_ACCEPT_DEFAULT", "who may message, ask or broadcast to an entity of this host that has no policy of its own (fleet-roster accept), and who may spawn on it: patterns NAME, NAME@HOST, @HOST, group:G or *, each optionally /KIND,... (SEND, ASK, BROADCAST, SPAWN, STOP), separated by spaces; a message none accepts is refused (exit 77, not_accepted)", "*"},
	{"plaintext-hosts", "FLEET_PLAINTEXT_HOSTS", "INSECURE: hosts with no sealing key (an older fleet) that this gateway sends message text the broker can read, and accepts such text from, separated by commas; every other host gets sealed text or none (exit 77, no_seal_key)", "none"},
	{"seal-fallback", "FLEET_SEAL_FALLBACK", "a trusted host that announces no sealing key and plaintext-hosts does not name: refuse (exit 77, no_seal_key, naming every such host, before anything is sent) or clear (INSECURE: that host alone gets text the broker can read, said loudly and named in clear_hosts)", "refuse"},
	{"ask-ttl", "FLEET_ASK_TTL", "how long fleet-ask waits for an answer unless --ttl says otherwise", "10m"},
	{"max-hops", "FLEET_MAX_HOPS", "hops a trace may have: the first message of a flow is hop 0, and a reply, an answer, an ask --about, or a send, ask or broadcast made while a message is delivered to an exec worker, is one more than that message; past it a message is refused as a loop (one of this host's exits 77, loop, whatever its recipient's host; one from another host for an entity here is refused as it arrives, and its sender gets a BOUNCE), and the other party gets a NOTICE; a positive whole number", "32"},
	{"urgent-rate", "FLEET_URGENT_RATE", "urgent messages (fleet-send --urgent, fleet-ask --urgent) one entity may send a minute, to all recipients together, checked by the sender's gateway on top of pair-rate: a burst of that many, then one every minute/urgent-rate; over it the send is refused, never queued or sent as normal mail (exit 75, rate_limited, naming the time to wait); 0 turns it off", "10"},
	{"pair-rate", "FLEET_PAIR_RATE", "messages (sends, replies, asks, answers; broadcasts per sender and group) one entity may send one recipient a minute, checked by the sender's gateway: a burst of that many, then one every minute/pair-rate; over it a send is refused, never queued (exit 75, rate_limited, naming the time to wait), and one refused for another reason spends none; 0 turns it off", "30"},
	{"presence-interval", "FLEET_PRESENCE_INTERVAL", "how often this gateway announces its entities on bridge.roster", "5s"},
	{"presence-ttl", "FLEET_PRESENCE_TTL", "a host not heard this long leaves the roster view", "3 intervals"},
}

// BrokerNodes splits the broker setting into its node URIs (a cluster's
// nodes are separated by commas or spaces).
func BrokerNodes(raw string) []string {
	return strings.FieldsFunc(raw, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// HasPassword says whether a broker setting holds a password in any of its
// node URIs: such a value belongs in the environment or in a config file of
// mode 0600, never on a command line (ps shows it to every user).
func HasPassword(raw string) bool {
	for _, one := range BrokerNodes(raw) {
		if u, err := url.Parse(one); err == nil {
			if _, has := u.User.Password(); has {
				return true
			}
		}
	}
	return false
}

// Lookup is how Load reads one setting from outside the file: flags first,
// then the environment. It returns "", false when neither sets it.
type Lookup func(name, env string) (string, bool)

// EnvLookup reads the environment only.
func EnvLookup(_, env string) (string, bool) {
	v, ok := os.LookupEnv(env)
	return v, ok && v != ""
}

// Load resolves the gateway's configuration. configPath may be "" (then
// FLEET_CONFIG, then $XDG_CONFIG_HOME/fleet/config if it exists).
func Load(lookup Lookup, configPath string) (*Config, error) {
	return load(lookup, configPath, false, false)
}

// LoadIfExists resolves the gateway's configuration with the config file
// at configPath if there is one there, and with none if not (fleet-gw
// join, about to write it).
func LoadIfExists(lookup Lookup, configPath string) (*Config, error) {
	return load(lookup, configPath, false, true)
}

// LoadClient resolves the configuration of a short command: the same
// sources, but a bad value of a setting only the gateway uses is the
// gateway's business, not a reason for fleet-send to fail.
func LoadClient(lookup Lookup, configPath string) (*Config, error) {
	return load(lookup, configPath, true, false)
}

func load(lookup Lookup, configPath string, client, optional bool) (*Config, error) {
	if lookup == nil {
		lookup = EnvLookup
	}
	file := map[string]string{}
	path := configPath
	explicit := path != "" && !optional
	if path == "" {
		if v, ok := os.LookupEnv("FLEET_CONFIG"); ok && v != "" {
			path, explicit = v, true
		} else if dir, err := os.UserConfigDir(); err == nil {
			path = filepath.Join(dir, "fleet", "config")
		}
	}
	if path != "" {
		m, err := readFile(path)
		switch {
		case err == nil:
			file = m
		case errors.Is(err, fs.ErrNotExist) && !explicit:
			path = ""
		case errors.As(err, new(*fault.Error)):
			return nil, err
		default:
			return nil, fault.Wrap(fault.Usage, fault.KindUsage, err, "config file")
		}
	}
	get := func(name string) (string, bool) {
		for _, k := range Keys {
			if k.Name == name {
				if v, ok := lookup(k.Name, k.Env); ok {
					return v, true
				}
			}
		}
		v, ok := file[name]
		return v, ok
	}
	c := &Config{File: path}
	var errs []error
	str := func(name, def string) string {
		if v, ok := get(name); ok {
			return v
		}
		return def
	}
	num := func(name string, def int) int {
		v, ok := get(name)
		if !ok {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive whole number", name, v))
			return def
		}
		return n
	}
	dur := func(name string, def time.Duration) time.Duration {
		v, ok := get(name)
		if !ok {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("%s: %q is not a duration such as 30s", name, v))
			return def
		}
		return d
	}
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".") // the short name: dots would split routing keys
	c.Host = str("host", host)
	c.StateDir = str("state-dir", defaultStateDir())
	// a state folder another user owns or may write is refused by every
	// command, before it reads a credential there or dials a socket
	// recorded there; a missing one is the gateway's to make
	if err := private.Dir(c.StateDir); errors.Is(err, fs.ErrPermission) {
		return nil, fault.Wrap(fault.Refused, fault.KindNotPrivate, err, "state folder %s is not this user's: it cannot even be looked at", c.StateDir).
			WithHint("use a folder of your own: --state-dir or FLEET_STATE_DIR")
	} else if fe := fault.NotPrivate(err); fe != nil {
		return nil, fe
	} // missing, or not a folder: the gateway's to make, or to refuse (73)
	c.Socket = str("socket", defaultSocket(c.StateDir))
	_, c.SocketSet = get("socket")
	c.MaxBody = num("max-body", 1<<20)
	c.DeliveryAttempts = num("delivery-attempts", 5)
	c.RetryBase = dur("retry-base", time.Second)
	c.RetryMax = dur("retry-max", time.Minute)
	c.NudgeAfter = dur("nudge-after", 30*time.Second)
	c.NudgeMax = dur("nudge-max", 30*time.Minute)
	c.SettleDelay = dur("settle-delay", 150*time.Millisecond)
	c.ExecTimeout = dur("exec-timeout", 30*time.Second)
	c.StartBound = dur("start-bound", 2*time.Minute)
	c.StuckAfter = dur("stuck-after", 10*time.Minute)
	c.ConfirmWithin = dur("confirm-within", 15*time.Second)
	c.DedupWindow = dur("dedup-window", 7*24*time.Hour)
	c.DeadRetention = dur("dead-retention", 30*24*time.Hour)
	if c.DeadRetention <= 0 {
		errs = append(errs, fmt.Errorf("dead-retention must be positive"))
		c.DeadRetention = 30 * 24 * time.Hour
	}
	c.DrainTimeout = dur("drain-timeout", 10*time.Second)
	c.MaxConnections = num("max-connections", 1024)
	c.FrameTimeout = dur("frame-timeout", 10*time.Second)
	if c.FrameTimeout <= 0 {
		errs = append(errs, fmt.Errorf("frame-timeout must be positive"))
		c.FrameTimeout = 10 * time.Second
	}
	c.AuditMaxSize = num("audit-max-size", 64<<20)
	c.AuditFiles = num("audit-files", 5)
	c.Uncertain = str("uncertain", "hold")
	c.MetricsListen = str("metrics-listen", "")
	if c.MetricsListen == "none" {
		c.MetricsListen = ""
	}
	c.Broker = str("broker", "")
	if c.Broker == "none" {
		c.Broker = ""
	}
	c.BrokerCA = str("broker-ca", "")
	c.BrokerCert = str("broker-cert", "")
	c.BrokerKey = str("broker-key", "")
	c.Heartbeat = dur("heartbeat", 5*time.Second)
	c.InboxMaxLength = num("inbox-max-length", 10000)
	c.InboxTTL = dur("inbox-ttl", 7*24*time.Hour)
	c.InboxQueueType = str("inbox-queue-type", "classic")
	if !slices.Contains(Choices["inbox-queue-type"], c.InboxQueueType) {
		errs = append(errs, fmt.Errorf("inbox-queue-type: %q is not %s", c.InboxQueueType, strings.Join(Choices["inbox-queue-type"], " or ")))
	}
	c.PublishTimeout = dur("publish-timeout", 5*time.Second)
	c.TrustFile = str("trust-file", filepath.Join(c.StateDir, "trust"))
	if rules, err := accept.ParseAll(strings.Fields(str("accept-default", "*"))); err != nil {
		errs = append(errs, fmt.Errorf("accept-default: %w", err))
		c.AcceptDefault, _ = accept.ParseAll([]string{"*"})
	} else {
		c.AcceptDefault = rules
	}
	for _, h := range BrokerNodes(str("plaintext-hosts", "")) {
		switch {
		case h == "none":
		case !trust.HostRE.MatchString(h):
			errs = append(errs, fmt.Errorf("plaintext-hosts: %q is not a host id", h))
		case !slices.Contains(c.PlaintextHosts, h):
			c.PlaintextHosts = append(c.PlaintextHosts, h)
		}
	}
	c.SealFallback = str("seal-fallback", "refuse")
	hint := ""
	if !slices.Contains(Choices["seal-fallback"], c.SealFallback) {
		hint = ChoiceHints["seal-fallback"]
		errs = append(errs, fmt.Errorf("seal-fallback: %q is not %s (refuse: a host with no sealing key gets no text; clear: it gets text the broker can read)", c.SealFallback, strings.Join(Choices["seal-fallback"], " or ")))
	}
	c.AskTTL = dur("ask-ttl", 10*time.Minute)
	c.MaxHops = num("max-hops", 32)
	c.PairRate = 30
	if v, ok := get("pair-rate"); ok {
		// 0 is a value here: no limit
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("pair-rate: %q is not a whole number of messages a minute (0: no limit)", v))
		} else {
			c.PairRate = n
		}
	}
	c.UrgentRate = 10
	if v, ok := get("urgent-rate"); ok {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("urgent-rate: %q is not a whole number of urgent messages a minute (0: no limit)", v))
		} else {
			c.UrgentRate = n
		}
	}
	c.PresenceInterval = dur("presence-interval", 5*time.Second)
	if c.PresenceInterval <= 0 {
		errs = append(errs, fmt.Errorf("presence-interval must be positive"))
		c.PresenceInterval = 5 * time.Second
	}
	c.PresenceTTL = dur("presence-ttl", 3*c.PresenceInterval)
	if c.Broker != "" {
		nodes := BrokerNodes(c.Broker)
		for _, u := range nodes {
			if !strings.HasPrefix(u, "amqp://") && !strings.HasPrefix(u, "amqps://") {
				errs = append(errs, fmt.Errorf("broker: want amqp:// or amqps:// URIs (a cluster's nodes separated by commas)"))
				break
			}
		}
		if len(nodes) == 0 {
			errs = append(errs, fmt.Errorf("broker: no URI"))
		}
	}
	if c.InboxTTL > c.DedupWindow {
		errs = append(errs, fmt.Errorf("inbox-ttl (%v) is longer than dedup-window (%v): a message could outlive its dedup record", c.InboxTTL, c.DedupWindow))
	}
	if !slices.Contains(Choices["uncertain"], c.Uncertain) {
		errs = append(errs, fmt.Errorf("uncertain: %q is not %s", c.Uncertain, strings.Join(Choices["uncertain"], " or ")))
	}
	if !trust.HostRE.MatchString(c.Host) {
		errs = append(errs, fmt.Errorf("host: %q is not a usable host id (a letter or digit, then up to 62 letters, digits, '-' or '_')", c.Host))
	}
	var perrs []error
	c.Profiles, perrs = profiles(file)
	errs = append(errs, perrs...)
	if client {
		errs = nil
	}
	if err := errors.Join(errs...); err != nil {
		fe := fault.Wrap(fault.Usage, fault.KindUsage, err, "configuration")
		if len(errs) == 1 && hint != "" {
			fe = fe.WithHint("%s", hint)
		}
		return nil, fe
	}
	return c, nil
}

// defaultStateDir is $XDG_STATE_HOME/fleet, ~/.local/state/fleet, or
// with neither (a service with no HOME) a folder of this user's own in the
// temporary folder, fleet-UID: whoever made it first must be this user
// (private.MakeDir refuses it otherwise), never adopted from another.
func defaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "fleet")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "fleet")
	}
	return filepath.Join(os.TempDir(), "fleet-"+strconv.Itoa(os.Getuid()))
}

// SocketRecord is the file in the state folder where a running gateway
// records its socket's path: a command started without XDG_RUNTIME_DIR
// (cron, a service, ssh without a session) guesses another default socket
// than a gateway started in a login session, and finds it there.
func SocketRecord(stateDir string) string { return filepath.Join(stateDir, "socket") }

// RecordedSocket is the socket a gateway on stateDir recorded ("" if none).
// The record is believed only as a small regular file of this user that
// nobody else may write, naming a socket of this user: a state folder in a
// shared place (no HOME: /tmp) must not steer a command, and its
// credential, to someone else's socket.
func RecordedSocket(stateDir string) string {
	path := SocketRecord(stateDir)
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 || !ownedByMe(fi) {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return ""
	}
	p := strings.TrimSpace(string(b))
	if si, err := os.Lstat(p); err != nil || si.Mode()&os.ModeSocket == 0 || !ownedByMe(si) {
		return ""
	}
	if !filepath.IsAbs(p) || strings.ContainsAny(p, "\x00\n") {
		return ""
	}
	return p
}

// ownedByMe reports whether fi belongs to this process's user.
func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

func defaultSocket(stateDir string) string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "fleet", "gw.sock")
	}
	return filepath.Join(stateDir, "gw.sock")
}

// checkFile refuses a config file that another user owns or may write (it
// names the state folder, the broker, and the commands profiles launch),
// and one holding a secret (a broker URI with its password) that its group
// or others may read: the password would be anyone's on this machine.
func checkFile(f *os.File, file map[string]string) error {
	if HasPassword(file["broker"]) {
		return private.Check("config file holding the broker password", f, true)
	}
	return private.Check("config file", f, false)
}

// readFile reads "key = value" lines; '#' starts a comment. Values may be
// quoted with double quotes. Unknown keys are an error, so a typo is loud.
func readFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	known := map[string]bool{}
	for _, k := range Keys {
		known[k.Name] = true
	}
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want key = value", path, n)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		if !known[k] && !strings.HasPrefix(k, "profile.") { // profile.*: checked by profiles()
			return nil, fmt.Errorf("%s:%d: unknown setting %q", path, n, k)
		}
		m[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return m, checkFile(f, m)
}
