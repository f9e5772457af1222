package gateway

// admit.go — what a message from the broker must prove before it may act
// on this host (design decision 6, closed by default).
//
// Every message a gateway publishes is signed with its host key
// (pkg/trust). The broker package hands every delivery — inbox, control
// queue, roster queue — to admission.check before anything else sees it:
//
//  1. its fields fit the same grammar as local ones (ids, names, hosts,
//     groups): nothing malformed reaches a log line, a store key or a pane;
//  2. it is signed (fleet-host, fleet-sig) by this host, by a host in
//     the trust file, or by a host certified by an operator in the trust
//     file (certs.go) — no trust file, or an empty one, admits no other
//     host at all;
//  3. the sender it names lives on the signing host: the envelope says so,
//     and so does the sender's gid, which names the host it was made on;
//  4. it is not older than its window (presence: presence-ttl; SPAWN and
//     STOP: their own expiry, at most controlWindow; everything else: the
//     dedup window) nor from the future; a repeated msg id is dropped by
//     the store's dedup as before.
//
// The claims that need the gateway's state are checked where the message
// is taken: presence speaks only for its own host and moves forward
// (presence.go), a broadcast copy reaches only members of its group
// (intake.go), a replay is of a dead letter its signer sent
// (intake.go, replayClaim), answers, TOO_LATE notices, receipts and control
// results come only from the host the original went to (ask.go,
// receipt.go, control.go), and a BOUNCE never crosses hosts. Whatever fails
// is a *broker.Refusal: the broker copies it to bridge.dlq with the reason
// and logs one ERROR line with its trace id.

import (
	"crypto/ed25519"
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
)

const (
	// controlWindow bounds how long a SPAWN or STOP may live: a request
	// must expire within it (its caller's timeout), so a captured request
	// can never be replayed after it.
	controlWindow = time.Hour
	// maxSkew is how far in the future a message's creation time may be
	// (clocks of the hosts differ a little; a message from further ahead
	// would outlive every window).
	maxSkew = 5 * time.Minute
)

// idRE is the grammar of msg ids, trace ids, turn ids and request ids.
var idRE = regexp.MustCompile(ident.IDPattern)

// admission checks what comes from the broker. It owns the verification
// memo and the hosts heard but not trusted.
type admission struct {
	host        string // this host
	own         ed25519.PublicKey
	file        *trust.File
	certs       *certs // the operator-certified hosts (nil: none, in tests)
	memo        *verified
	dedupWindow time.Duration
	presenceTTL time.Duration

	mu        sync.Mutex
	untrusted map[string]time.Time // host id -> last refused as not trusted
}

// setupAuth gives the broker this gateway's signer and its admission check.
func (g *Gateway) setupAuth(ring *seal.Keyring) error {
	priv, err := trust.HostKey(g.cfg.StateDir)
	if err != nil {
		return err
	}
	own, file, memo := priv.Public().(ed25519.PublicKey), trust.Open(g.cfg.TrustFile), newVerified(1024)
	g.admit = &admission{
		host: g.cfg.Host, own: own, file: file, memo: memo,
		certs:       newCerts(g.cfg.StateDir, g.cfg.Host, own, file, memo, g.log),
		dedupWindow: g.cfg.DedupWindow, presenceTTL: g.cfg.PresenceTTL,
		untrusted: map[string]time.Time{},
	}
	keys, err := g.admit.file.Keys()
	switch {
	case err != nil:
		g.log.Error("the trust file is unreadable: no other host is admitted",
			"trust_file", g.cfg.TrustFile, "err", err, "fix", "fleet-gw trust list shows what is wrong; fleet-gw trust add HOST KEY rewrites it")
	case len(keys) == 0 && len(file.Operators()) > 0:
		g.log.Info("trusted operators: the hosts they certify are admitted", "operators", len(file.Operators()), "trust_file", g.cfg.TrustFile)
	case len(keys) == 0:
		g.log.Warn("no host is trusted: messages from other hosts are refused (closed by default)",
			"trust_file", g.cfg.TrustFile, "fix", "on each other host run `fleet-gw key`, then here: fleet-gw trust add HOST KEY")
	default:
		g.log.Info("trusted hosts", "count", len(keys), "trust_file", g.cfg.TrustFile)
	}
	g.br.SetAuth(func(body []byte) []byte { return ed25519.Sign(priv, body) }, g.admit.check)
	// sealing.go: text is sealed to the hosts that deliver it (issue 27)
	sl := newSealing(g.cfg.Host, ring, file, g.admit.certs, g.cfg.PlaintextHosts, g.cfg.MaxBody, g.log)
	sl.everyone, sl.trusted, sl.spawn = g.admit.trustedHosts, g.admit.trusted, checkSpawn
	if sl.fallback = g.cfg.SealFallback == "clear"; sl.fallback {
		g.log.Warn("seal-fallback = clear: a trusted host that announces no sealing key gets message text the broker can read (each such message names it in clear_hosts)",
			"fix", "give every host a sealing key (fleet-gw key there; fleet-gw trust add HOST SIGNING-KEY SEALING-KEY here), then remove seal-fallback")
	}
	// a sealed broadcast copy its member has in the clear (sealing.go)
	g.br.OnDropped(func(env *envelope.Envelope, why string) { g.audit.Message("dropped", env, 0, why) })
	sl.announced = g.peers.SealKey // presence.go: the key a host announced, signed
	sl.members = func(group string) []string {
		var hosts []string
		for _, r := range g.peers.Rows(time.Now(), g.br.Connected(), g.cfg.PresenceTTL, g.admit.trusted) {
			if slices.Contains(r.Groups, group) {
				hosts = append(hosts, r.Host)
			}
		}
		return hosts
	}
	g.br.SetSealer(sl)
	g.seal, g.rcpt.plain, g.route.seal, g.ctl.seal = sl, sl.Plain, sl, sl
	g.br.OnRefused(g.admit.noteRefused)
	notices := &refusalNotices{host: g.cfg.Host, maxBody: g.cfg.MaxBody, log: g.log,
		local: localPaths(g.cfg.StateDir, g.cfg.TrustFile, g.cfg.Socket, g.cfg.File),
		publish: func(to string, env *envelope.Envelope) {
			g.side.Go(func() {
				if err := g.br.Publish(g.hardCtx, to, env, false); err != nil {
					g.log.Info("refusal notice not sent", "msg_id", env.InReplyTo, "trace_id", env.TraceID, "to", to, "err", err)
				}
			})
		}}
	g.br.OnRefusedMsg(notices.refused)
	return nil
}

// check admits a message signed by host, or says why not.
func (a *admission) check(host string, body, sig []byte, env *envelope.Envelope) error {
	if err := a.signed(host, body, sig, env); err != nil {
		return err
	}
	return a.fresh(env)
}

// signed checks who made env: its fields, and a signature by a host this
// one trusts (or by this host itself) that is the host its sender claims.
func (a *admission) signed(host string, body, sig []byte, env *envelope.Envelope) error {
	if err := checkFields(env); err != nil {
		return err
	}
	if host == "" || len(sig) == 0 {
		return broker.Refuse(broker.ReasonUnsigned, "no fleet-host or fleet-sig header")
	}
	pub := a.own
	var cert *trust.Cert // a certificate to keep once the signature proved it
	if host != a.host {
		k, ok := a.file.Key(host)
		if !ok {
			var err error
			if k, cert, err = a.certs.Key(host, presentedCert(env), time.Now()); err != nil {
				return err
			}
			if k == nil {
				// the path only in this host's log: a refusal notice
				// crosses to the host refused, trusted or not
				return broker.Refuse(broker.ReasonUntrusted, "host %q is not in the receiver's trust file (add it there with: fleet-gw trust add %s KEY)",
					host, host).Here("trust file %s", a.file.Path())
			}
		}
		pub = k
	}
	if !a.memo.check(pub, body, sig) {
		return broker.Refuse(broker.ReasonForged, "bad signature for host %q: forged or altered", host)
	}
	if env.Sender.Host != host {
		return broker.Refuse(broker.ReasonWrongHost, "sender claims host %q but %q signed it", env.Sender.Host, host)
	}
	if env.Sender.Gid != "" && ident.GidHost(env.Sender.Gid) != host {
		// a gid names the host it was made on: no other host speaks for it
		return broker.Refuse(broker.ReasonWrongHost, "sender %s was made on %q, but %q signed it", env.Sender.Gid, ident.GidHost(env.Sender.Gid), host)
	}
	if cert != nil {
		a.certs.Keep(cert)
	}
	return nil
}

// fresh refuses an envelope older than its window (a replay) or from the
// future.
func (a *admission) fresh(env *envelope.Envelope) error {
	now := time.Now()
	window := a.dedupWindow
	switch env.Kind {
	case envelope.Presence:
		window = a.presenceTTL
	case envelope.Spawn, envelope.Stop, envelope.Trace:
		window = controlWindow
		if env.Expires.IsZero() || env.Expires.Sub(env.Created) > controlWindow {
			return broker.Refuse(broker.ReasonReplay, "a %s must expire within %v of its creation", env.Kind, controlWindow)
		}
	}
	if age := now.Sub(env.Created); age > window {
		return broker.Refuse(broker.ReasonReplay, "created %s, older than its %v window: a replay",
			env.Created.Format(time.RFC3339), window)
	}
	if env.Created.Sub(now) > maxSkew {
		return broker.Refuse(broker.ReasonReplay, "created %s, in the future", env.Created.Format(time.RFC3339))
	}
	return nil
}

// checkFields holds a remote envelope to the grammar of local ones.
func checkFields(env *envelope.Envelope) error {
	bad := func(format string, args ...any) error {
		return broker.Refuse(broker.ReasonMalformed, format, args...)
	}
	switch {
	case !idRE.MatchString(env.MsgID):
		return bad("msg_id %q is not an id", env.MsgID)
	case !idRE.MatchString(env.TraceID):
		return bad("trace_id %q is not an id", env.TraceID)
	case env.InReplyTo != "" && !idRE.MatchString(env.InReplyTo):
		return bad("in_reply_to %q is not an id", env.InReplyTo)
	case env.TurnID != "" && !idRE.MatchString(env.TurnID):
		return bad("turn_id %q is not an id", env.TurnID)
	case env.ReplayOf != "" && !idRE.MatchString(env.ReplayOf):
		return bad("replay_of %q is not an id", env.ReplayOf)
	case !trust.HostRE.MatchString(env.Sender.Host):
		return bad("sender host %q is not a host id", env.Sender.Host)
	case env.Sender.Group != "":
		return bad("a sender has no group")
	}
	for _, p := range []struct {
		what string
		p    envelope.Party
	}{{"sender", env.Sender}, {"recipient", env.Recipient}} {
		if p.p.Gid != "" && !ident.IsGid(p.p.Gid) {
			return bad("%s gid %q is not a gid", p.what, p.p.Gid)
		}
		if p.p.Name != "" && !nameRE.MatchString(p.p.Name) {
			return bad("%s name %q is not an entity name", p.what, p.p.Name)
		}
		if p.p.Host != "" && !trust.HostRE.MatchString(p.p.Host) {
			return bad("%s host %q is not a host id", p.what, p.p.Host)
		}
	}
	for _, gid := range env.ClearGids {
		if !ident.IsGid(gid) {
			return bad("clear_gids %q is not a gid", gid)
		}
	}
	group := env.Recipient.Group
	switch env.Kind {
	case envelope.Broadcast:
		if !ident.ValidGroup(group) {
			return bad("broadcast group %q is not a group name", group)
		}
	case envelope.Spawn, envelope.Stop, envelope.Trace:
		if group != "control" || env.Recipient.Host == "" {
			return bad("a %s names its target host and no entity", env.Kind)
		}
		if env.Kind == envelope.Spawn {
			return checkSpawn(env.Body)
		}
	case envelope.Presence:
		if group != "roster" {
			return bad("presence is addressed to the roster")
		}
	default:
		if group != "" || env.Recipient.Gid == "" {
			return bad("a %s is addressed to one gid", env.Kind)
		}
	}
	return nil
}

// checkSpawn holds what a SPAWN asks for to the grammar of local names
// and groups, before the target records, logs or binds any of it: the name
// becomes a file name, each group a routing key (ident.ValidGroup). A body
// that is not a spawn request at all is answered as malformed by the
// target (controlExec.CarryOut).
func checkSpawn(body string) error {
	var b spawnBody
	if json.Unmarshal([]byte(body), &b) != nil {
		return nil
	}
	if !ident.ValidName(b.Name) {
		return broker.Refuse(broker.ReasonMalformed, "a spawn of %q, not an entity name", b.Name)
	}
	if err := ident.CheckMember(b.Groups); err != nil {
		return broker.Refuse(broker.ReasonMalformed, "a spawn of %s: %v", b.Name, err)
	}
	return nil
}

// noteRefused remembers hosts refused as not trusted, for the roster.
func (a *admission) noteRefused(reason, host string) {
	if reason != broker.ReasonUntrusted || !trust.HostRE.MatchString(host) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.untrusted[host]; !ok && len(a.untrusted) >= 256 {
		return // a flood of invented host ids does not grow the view
	}
	a.untrusted[host] = time.Now()
}

// untrustedRows are the hosts heard within the presence TTL but not
// trusted: one row each, status "untrusted", so fleet-roster shows what
// is knocking and the operator can decide.
func (a *admission) untrustedRows() []api.EntityRow {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []api.EntityRow
	for host, at := range a.untrusted {
		if a.trusted(host) || time.Since(at) > a.presenceTTL {
			delete(a.untrusted, host)
			continue
		}
		out = append(out, api.EntityRow{Host: host, Groups: []string{}, Status: "untrusted", LastSeen: at.UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// trusted reports whether messages from host are admitted now: by its
// line in the trust file, or by its operator certificate.
func (a *admission) trusted(host string) bool {
	if a == nil || host == a.host {
		return true
	}
	_, ok := a.file.Key(host)
	return ok || a.certs.Trusted(host, time.Now())
}

// trustedNow is trusted over one reading of the trust file and the
// certificates, for asking about many hosts at once (a roster of rows).
func (a *admission) trustedNow() func(host string) bool {
	if a == nil {
		return func(string) bool { return true }
	}
	keys, _ := a.file.Keys()
	certified := map[string]bool{}
	for _, h := range a.certs.Hosts(time.Now()) {
		certified[h] = true
	}
	return func(host string) bool {
		_, ok := keys[host]
		return ok || certified[host] || host == a.host
	}
}

// trustedHosts are the other hosts admitted now, sorted: those with a
// line in the trust file and those certified by a trusted operator.
func (a *admission) trustedHosts() []string {
	if a == nil {
		return nil
	}
	keys, _ := a.file.Keys() // unreadable: no line admits anyone
	seen := map[string]bool{}
	var out []string
	for h := range keys {
		if h != a.host && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, h := range a.certs.Hosts(time.Now()) {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}

// admitsCertified reports whether this host admits the hosts certified
// by an operator (one is in its trust file).
func (a *admission) admitsCertified() bool {
	return a != nil && len(a.file.Operators()) > 0
}

// certified is the part that knows the operator-certified hosts (nil, and
// so certifying no one, without a broker).
func (a *admission) certified() *certs {
	if a == nil {
		return nil
	}
	return a.certs
}
