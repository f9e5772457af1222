package gateway

// certs.go — operator-certified hosts (pkg/trust/opcert.go).
//
// A gateway whose trust file holds an operator line admits a host with no
// line of its own when that host presents a certificate of that operator
// for the host id it signs as. Certificates travel with presence: every
// presence message of a certified host carries its certificate (field
// "cert"), so the first one a gateway hears from a new host admits it; the
// certificate is then kept (STATE_DIR/certs/HOST.cert) and admits the
// host's other messages, across restarts too. A host's newest valid
// certificate wins: an older one it (or a thief of its old key) presents
// later is refused.
//
// A certificate counts only while the operator that signed it is in the
// trust file, it is within its not_before .. not_after, and no revocation
// list of that operator voids it. An operator's revocation list is signed
// by the operator and numbered; it is imported on any one host (fleet-gw
// cert revoked --import), read by that gateway at its next snapshot, and
// carried in every gateway's snapshots (field "revoked"): a gateway that
// trusts the operator takes a list numbered higher than the one it holds
// from any peer, keeps it (STATE_DIR/revoked/KEYID.list) and refuses the
// revoked hosts from then on, after a restart too. So a revocation reaches
// every running gateway within about one presence interval of its import,
// and a gateway that was down meanwhile learns it from the next snapshot
// of any peer that holds it. A per-host trust line is the local
// operator's own decision and is not affected by certificates or
// revocation lists: fleet-gw trust remove removes it.

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"crypto/ed25519"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/trust"
)

// maxListsCarried bounds the revocation lists a presence message may carry
// and a gateway holds (one per trusted operator).
const maxListsCarried = 8

// certs owns what this gateway knows of certified hosts: the certificates
// heard (one per host), the operators' revocation lists, and its own
// certificate.
type certs struct {
	dir  string // the state folder
	host string
	own  ed25519.PublicKey
	file *trust.File
	memo *verified
	log  *slog.Logger

	mu     sync.Mutex
	peers  map[string]*trust.Cert        // host -> its newest certificate heard
	lists  map[string]*trust.Revocations // operator key -> its newest list, signature checked
	mine   *trust.Cert                   // this host's certificate (nil: none)
	mineAt string                        // the raw certificate last read from disk
	said   map[string]string             // what was last logged of a thing, to log each change once
}

func newCerts(dir, host string, own ed25519.PublicKey, file *trust.File, memo *verified, log *slog.Logger) *certs {
	c := &certs{dir: dir, host: host, own: own, file: file, memo: memo, log: log,
		peers: map[string]*trust.Cert{}, lists: map[string]*trust.Revocations{}, said: map[string]string{}}
	peers, errs := trust.LoadPeerCerts(dir)
	for _, err := range errs {
		log.Warn("a kept certificate is unreadable: ignored", "err", err)
	}
	c.peers = peers
	c.Refresh()
	return c
}

// Refresh rereads this host's certificate and the revocation lists kept in
// the state folder (one imported since); called once per presence interval.
func (c *certs) Refresh() {
	if c == nil {
		return
	}
	mine, err := trust.ReadHostCert(c.dir)
	lists, errs := trust.LoadRevocations(c.dir)
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		c.once("mine", err.Error(), func() {
			c.log.Error("this host's certificate is unreadable: not presented", "err", err, "fix", "fleet-gw cert install FILE")
		})
		c.mine = nil
	case mine == nil:
		c.mine = nil
	case mine.Raw == c.mineAt && c.mine != nil:
	case mine.Host != c.host || !bytes.Equal(mine.PublicKey(), c.own) || !mine.Verify():
		c.once("mine", mine.Raw, func() {
			c.log.Error("this host's certificate is not for this host and its key: not presented",
				"cert_host", mine.Host, "serial", mine.Serial, "fix", "fleet-gw cert request, certified again, then fleet-gw cert install")
		})
		c.mine = nil
	default:
		c.mine, c.mineAt = mine, mine.Raw
		c.once("mine", mine.Raw, func() {
			c.log.Info("this host presents its operator certificate", "serial", mine.Serial,
				"operator_key", trust.KeyID(mine.OperatorKey()), "not_after", mine.NotAfter.UTC())
		})
	}
	if c.mine != nil {
		if why := c.mine.Current(time.Now()); why != "" {
			c.once("mine current", why, func() {
				c.log.Error("this host's certificate is "+why+": the other hosts refuse it",
					"serial", c.mine.Serial, "fix", "fleet-gw cert request, certified again, then fleet-gw cert install")
			})
		}
	}
	for _, err := range errs {
		c.once("list "+err.Error(), "1", func() { c.log.Warn("a kept revocation list is unreadable: ignored", "err", err) })
	}
	for _, r := range lists {
		c.takeLocked(r, "the state folder", ops)
	}
}

// once runs f when what was last said of key is not what.
func (c *certs) once(key, what string, f func()) {
	if c.said[key] == what && what != "" {
		return
	}
	c.said[key] = what
	f()
}

// Present is what this host's presence carries: its certificate ("" if it
// has none) and, for a snapshot, the revocation lists it holds.
func (c *certs) Present() (cert string, lists []string) {
	if c == nil {
		return "", nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mine != nil {
		cert = c.mine.Raw
	}
	keys := make([]string, 0, len(c.lists))
	for k := range c.lists {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lists = append(lists, c.lists[k].Raw)
	}
	return cert, lists
}

// invalidLocked says why cert does not admit its host now ("" when it
// does), with ops the operators the trust file holds. Under c.mu.
func (c *certs) invalidLocked(cert *trust.Cert, now time.Time, ops map[string]string) string {
	if _, ok := ops[cert.Operator]; !ok {
		return "its operator key " + trust.KeyID(cert.OperatorKey()) + " is not in the receiver's trust file"
	}
	body, sig := cert.Signed()
	if !c.memo.check(cert.OperatorKey(), body, sig) {
		return "its operator signature does not verify (forged or altered)"
	}
	if why := cert.Current(now); why != "" {
		return why
	}
	if l := c.lists[cert.Operator]; l.Voids(cert) {
		return "it is revoked (revocation list " + strconv.FormatInt(l.Serial, 10) + ")"
	}
	return ""
}

// Key returns the key host signs with by the certificate it presents
// (presented, "" if none) or the one kept for it, and the certificate to
// Keep once the message's signature verified by that key. No certificate
// at all is (nil, nil, nil): the host is simply not trusted. A certificate
// that does not admit it is a refusal saying why.
func (c *certs) Key(host, presented string, now time.Time) (ed25519.PublicKey, *trust.Cert, error) {
	if c == nil {
		return nil, nil, nil
	}
	var cert *trust.Cert
	if presented != "" {
		var err error
		if cert, err = trust.ParseCert(presented); err != nil {
			return nil, nil, broker.Refuse(broker.ReasonMalformed, "presence: %v", err)
		}
		if cert.Host != host {
			return nil, nil, broker.Refuse(broker.ReasonWrongHost, "host %q presents a certificate of host %q", host, cert.Host)
		}
	}
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.peers[host]
	if cert == nil {
		cert = kept
	} else if kept != nil && kept.Serial != cert.Serial && kept.Issued.After(cert.Issued) && c.invalidLocked(kept, now, ops) == "" {
		return nil, nil, broker.Refuse(broker.ReasonUntrusted, "host %q presents certificate %s, superseded by its newer certificate %s",
			host, cert.Serial, kept.Serial)
	}
	if cert == nil {
		return nil, nil, nil
	}
	if why := c.invalidLocked(cert, now, ops); why != "" {
		return nil, nil, broker.Refuse(broker.ReasonUntrusted, "host %q is not in the receiver's trust file and its certificate %s does not admit it: %s",
			host, cert.Serial, why).Here("trust file %s", c.file.Path())
	}
	if kept != nil && kept.Serial == cert.Serial {
		return cert.PublicKey(), nil, nil
	}
	return cert.PublicKey(), cert, nil
}

// Keep records cert as its host's certificate, proven by a message its
// host signed with the key it binds, and keeps it in the state folder.
func (c *certs) Keep(cert *trust.Cert) {
	c.mu.Lock()
	if old := c.peers[cert.Host]; old != nil && (old.Serial == cert.Serial || old.Issued.After(cert.Issued)) {
		c.mu.Unlock()
		return
	}
	c.peers[cert.Host] = cert
	c.mu.Unlock()
	c.log.Info("host admitted by its operator certificate", "peer", cert.Host, "serial", cert.Serial,
		"operator_key", trust.KeyID(cert.OperatorKey()), "not_after", cert.NotAfter.UTC())
	if err := trust.SavePeerCert(c.dir, cert); err != nil {
		c.log.Warn("could not keep a host's certificate: its next presence brings it again", "peer", cert.Host, "err", err)
	}
}

// Trusted reports whether host is admitted now by the certificate kept
// for it.
func (c *certs) Trusted(host string, now time.Time) bool {
	if c == nil {
		return false
	}
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	cert := c.peers[host]
	return cert != nil && c.invalidLocked(cert, now, ops) == ""
}

// SealKey is the sealing key (age1...) the certificate kept for host
// names, while that certificate admits it; "" otherwise.
func (c *certs) SealKey(host string, now time.Time) string {
	if c == nil {
		return ""
	}
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	cert := c.peers[host]
	if cert == nil || c.invalidLocked(cert, now, ops) != "" {
		return ""
	}
	return cert.SealKey
}

// Hosts are the hosts admitted now by their kept certificates, sorted.
func (c *certs) Hosts(now time.Time) []string {
	if c == nil {
		return nil
	}
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for h, cert := range c.peers {
		if h != c.host && c.invalidLocked(cert, now, ops) == "" {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}

// Hear takes the revocation lists a peer's snapshot carried: each one of
// an operator this gateway trusts, numbered higher than the one held and
// signed by that operator, replaces it and is kept.
func (c *certs) Hear(lists []string, from string) {
	if c == nil || len(lists) == 0 {
		return
	}
	if len(lists) > maxListsCarried {
		lists = lists[:maxListsCarried]
	}
	ops := c.file.Operators()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, raw := range lists {
		r, err := trust.ParseRevocations(raw)
		if err != nil {
			c.once("bad list "+from, err.Error(), func() {
				c.log.Warn("a peer carries a revocation list that does not read: ignored", "peer", from, "err", err)
			})
			continue
		}
		c.takeLocked(r, from, ops)
	}
}

// takeLocked takes r if it is newer than the list held of its operator,
// that operator is trusted and signed it. Under c.mu.
func (c *certs) takeLocked(r *trust.Revocations, from string, ops map[string]string) {
	if old := c.lists[r.Operator]; old != nil && old.Serial >= r.Serial {
		return
	}
	name, ok := ops[r.Operator]
	if !ok {
		return // another operator's: not this gateway's business
	}
	body, sig := r.Signed()
	if !c.memo.check(r.OperatorKey(), body, sig) {
		c.once("forged list "+from, strconv.FormatInt(r.Serial, 10), func() {
			c.log.Warn("a revocation list of a trusted operator does not verify: ignored", "from", from, "operator", name, "serial", r.Serial)
		})
		return
	}
	if _, held := c.lists[r.Operator]; !held && len(c.lists) >= maxListsCarried {
		return
	}
	c.lists[r.Operator] = r
	var void []string
	for h, cert := range c.peers {
		if r.Voids(cert) {
			void = append(void, h)
		}
	}
	sort.Strings(void)
	c.log.Warn("revocation list taken: the hosts it revokes are refused from now on", "from", from, "operator", name,
		"serial", r.Serial, "revoked", len(r.Hosts), "revoked_here", void)
	if from != "the state folder" {
		if err := trust.SaveRevocations(c.dir, r); err != nil {
			c.log.Error("could not keep a revocation list: it holds until this gateway stops, and comes again with the next snapshot of a peer",
				"operator", name, "serial", r.Serial, "err", err)
		}
	}
}

// presentedCert is the certificate a presence message carries ("" if it
// is no presence or carries none).
func presentedCert(env *envelope.Envelope) string {
	if env.Kind != envelope.Presence {
		return ""
	}
	var b struct {
		Cert string `json:"cert"`
	}
	if json.Unmarshal([]byte(env.Body), &b) != nil {
		return ""
	}
	return b.Cert
}
