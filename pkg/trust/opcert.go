package trust

// Operator-certified hosts. Besides its per-host lines, a trust file may
// hold operator lines ("operator NAME KEY"). An operator key (kept on the
// operator's machine, offline: never in a gateway's state folder) signs
// host certificates — a host id bound to the host's signing key and its
// sealing key for a time — and revocation lists. A gateway
// that trusts an operator key admits a host that presents a valid
// certificate of that operator for the host id it signs as; it needs no
// line for that host.
//
// Three signed objects, each one line of text, so they paste, mail and
// travel in a bundle as they are:
//
//	fleet-enrol-v1.PAYLOAD.SIG    a host's enrolment request, signed by the host key
//	fleet-cert-v1.PAYLOAD.SIG     a host certificate, signed by the operator key
//	fleet-revoked-v1.PAYLOAD.SIG  a revocation list, signed by the operator key
//
// PAYLOAD is base64url (no padding) of a JSON object; SIG is base64url of
// the Ed25519 signature of "PREFIX\n" followed by the payload's bytes (the
// prefix separates the kinds: a signature on one is never valid as
// another). The payload is never re-encoded: the bytes signed are the
// bytes carried. A v1 reader refuses unknown fields (a field it does not
// understand could restrict what the object grants); a change of meaning
// takes a new prefix.

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/private"
)

// The prefixes of the three objects.
const (
	RequestPrefix = "fleet-enrol-v1"
	CertPrefix    = "fleet-cert-v1"
	RevokedPrefix = "fleet-revoked-v1"
	operatorFile  = "fleet-operator-key-v1"
)

// Bounds. A certificate is valid for at most MaxCertLife; so a
// revocation entry is needed only that long after it was made, and a list
// drops older ones at the next revocation. What a peer can make a gateway
// hold is bounded: a certificate of at most maxCertBytes, a list of at
// most MaxRevoked hosts and maxListBytes.
const (
	MaxCertLife  = 2 * 365 * 24 * time.Hour
	MaxRevoked   = 4096
	maxCertBytes = 2048
	maxListBytes = 512 << 10
	// certSkew is how far ahead of a gateway's clock the operator's may
	// be for a certificate to count from its not_before.
	certSkew = 5 * time.Minute
)

// Request is a new host's enrolment request: what it asks the operator
// to certify. It is signed by the host key itself (proof that the asker
// holds it).
type Request struct {
	V       int       `json:"v"`
	Host    string    `json:"host"`
	Key     string    `json:"key"`                // base64 Ed25519 public key, as in trust lines
	SealKey string    `json:"seal_key,omitempty"` // public sealing key (age1..., pkg/seal); none in requests made before sealing keys
	Made    time.Time `json:"made"`
}

// Cert is a host certificate: the operator says Host signs with Key (and
// is sealed to with SealKey, when it names one) from NotBefore to
// NotAfter. A certificate made before sealing keys names none: it still
// verifies, and its host announces no sealing key.
type Cert struct {
	V         int       `json:"v"`
	Serial    string    `json:"serial"` // 32 hex digits, random: names this certificate
	Host      string    `json:"host"`
	Key       string    `json:"key"`
	SealKey   string    `json:"seal_key,omitempty"`
	Operator  string    `json:"operator"` // base64 Ed25519 public key of the signer
	Issued    time.Time `json:"issued"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`

	// Raw is the certificate as it travels (the line); not in the payload.
	Raw string `json:"-"`
	// the signed bytes and the signature, for Verify
	signed, sig []byte
}

// Revoked is one revocation: every certificate of Host issued at or
// before Before is void (a certificate issued later — the host enrolled
// again — is not).
type Revoked struct {
	Host   string    `json:"host"`
	Before time.Time `json:"before"`
}

// Revocations is an operator's revocation list. Serial grows with every
// list the operator signs: a gateway keeps the list of highest serial it
// has seen and never goes back.
type Revocations struct {
	V        int       `json:"v"`
	Operator string    `json:"operator"`
	Serial   int64     `json:"serial"`
	Issued   time.Time `json:"issued"`
	Hosts    []Revoked `json:"hosts"`

	Raw         string `json:"-"`
	signed, sig []byte
}

// KeyID is a short fingerprint of a public key (16 hex digits of its
// sha256), for file names and log lines.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// seal encodes payload as prefix.PAYLOAD.SIG, signed by key.
func seal(prefix string, key ed25519.PrivateKey, payload any) (string, error) {
	data, err := json.Marshal(payload)
	if err != nil {
		return "", err
	}
	sig := ed25519.Sign(key, signedBytes(prefix, data))
	return prefix + "." + base64.RawURLEncoding.EncodeToString(data) + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

func signedBytes(prefix string, payload []byte) []byte {
	return append([]byte(prefix+"\n"), payload...)
}

// open splits prefix.PAYLOAD.SIG and decodes the payload into v, strictly;
// it returns the signed bytes and the signature (not yet verified).
func open(what, prefix, s string, max int, v any) (signed, sig []byte, err error) {
	s = strings.TrimSpace(s)
	if len(s) > max {
		return nil, nil, fmt.Errorf("%s of %d bytes (at most %d)", what, len(s), max)
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 || parts[0] != prefix {
		return nil, nil, fmt.Errorf("this is not a fleet %s (one line starting %s.)", what, prefix)
	}
	data, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, nil, fmt.Errorf("%s: bad payload encoding", what)
	}
	sig, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, nil, fmt.Errorf("%s: bad signature encoding", what)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, nil, fmt.Errorf("%s: %v", what, err)
	}
	if dec.More() {
		return nil, nil, fmt.Errorf("%s: trailing data", what)
	}
	return signedBytes(prefix, data), sig, nil
}

// pubKey decodes a base64 Ed25519 public key.
func pubKey(what, s string) (ed25519.PublicKey, error) {
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s %q is not an Ed25519 public key", what, s)
	}
	return k, nil
}

// checkSealKey accepts no sealing key or an age X25519 one (CheckSealKey).
func checkSealKey(s string) error {
	if s == "" {
		return nil
	}
	if err := CheckSealKey(s); err != nil {
		return fmt.Errorf("seal_key %q is not a public sealing key (age1...)", s)
	}
	return nil
}

// MakeRequest is host's enrolment request, signed by its key, naming no
// sealing key (as before sealing keys existed).
func MakeRequest(host string, key ed25519.PrivateKey) (string, error) {
	return MakeSealedRequest(host, key, "")
}

// MakeSealedRequest is host's enrolment request for its signing key and
// its public sealing key (age1...; "" for none), signed by its key.
func MakeSealedRequest(host string, key ed25519.PrivateKey, sealKey string) (string, error) {
	if !HostRE.MatchString(host) {
		return "", fmt.Errorf("%q is not a host id", host)
	}
	if err := checkSealKey(sealKey); err != nil {
		return "", err
	}
	return seal(RequestPrefix, key, Request{V: 1, Host: host, SealKey: sealKey,
		Key: base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey)), Made: time.Now().UTC().Truncate(time.Second)})
}

// ParseRequest reads and verifies an enrolment request (its host's
// signature: the asker holds the key it asks for).
func ParseRequest(s string) (*Request, error) {
	var r Request
	signed, sig, err := open("enrolment request", RequestPrefix, s, maxCertBytes, &r)
	if err != nil {
		return nil, err
	}
	if r.V != 1 {
		return nil, fmt.Errorf("enrolment request version %d (this fleet reads 1)", r.V)
	}
	if !HostRE.MatchString(r.Host) {
		return nil, fmt.Errorf("enrolment request: %q is not a host id", r.Host)
	}
	pub, err := pubKey("enrolment request: key", r.Key)
	if err != nil {
		return nil, err
	}
	if err := checkSealKey(r.SealKey); err != nil {
		return nil, fmt.Errorf("enrolment request: %v", err)
	}
	if !ed25519.Verify(pub, signed, sig) {
		return nil, errors.New("enrolment request: its signature is not by the key it names (altered)")
	}
	return &r, nil
}

// Certify signs a certificate for the request r, valid from now for life.
func Certify(op ed25519.PrivateKey, r *Request, life time.Duration) (*Cert, error) {
	if life <= 0 || life > MaxCertLife {
		return nil, fmt.Errorf("a certificate is valid for at most %v, not %v", MaxCertLife, life)
	}
	var serial [16]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	c := Cert{V: 1, Serial: hex.EncodeToString(serial[:]), Host: r.Host, Key: r.Key, SealKey: r.SealKey,
		Operator: base64.StdEncoding.EncodeToString(op.Public().(ed25519.PublicKey)),
		Issued:   now, NotBefore: now.Truncate(time.Second), NotAfter: now.Truncate(time.Second).Add(life)}
	raw, err := seal(CertPrefix, op, c)
	if err != nil {
		return nil, err
	}
	return ParseCert(raw)
}

// ParseCert reads a certificate and checks its form; the operator's
// signature is checked by Verify (against a key the reader trusts).
func ParseCert(s string) (*Cert, error) {
	var c Cert
	signed, sig, err := open("certificate", CertPrefix, s, maxCertBytes, &c)
	if err != nil {
		return nil, err
	}
	switch {
	case c.V != 1:
		return nil, fmt.Errorf("certificate version %d (this fleet reads 1)", c.V)
	case len(c.Serial) != 32 || strings.Trim(c.Serial, "0123456789abcdef") != "":
		return nil, fmt.Errorf("certificate serial %q is not 32 hex digits", c.Serial)
	case !HostRE.MatchString(c.Host):
		return nil, fmt.Errorf("certificate: %q is not a host id", c.Host)
	case c.NotBefore.IsZero() || !c.NotAfter.After(c.NotBefore):
		return nil, errors.New("certificate: not_after is not after not_before")
	case c.NotAfter.Sub(c.NotBefore) > MaxCertLife:
		return nil, fmt.Errorf("certificate valid for %v, longer than %v", c.NotAfter.Sub(c.NotBefore), MaxCertLife)
	case c.Issued.IsZero():
		return nil, errors.New("certificate: no issued time")
	}
	if _, err := pubKey("certificate: key", c.Key); err != nil {
		return nil, err
	}
	if _, err := pubKey("certificate: operator", c.Operator); err != nil {
		return nil, err
	}
	if err := checkSealKey(c.SealKey); err != nil {
		return nil, fmt.Errorf("certificate: %v", err)
	}
	c.Raw, c.signed, c.sig = strings.TrimSpace(s), signed, sig
	return &c, nil
}

// PublicKey is the host's signing key the certificate binds.
func (c *Cert) PublicKey() ed25519.PublicKey {
	k, _ := base64.StdEncoding.DecodeString(c.Key)
	return k
}

// OperatorKey is the key that signed it (as it claims: see Verify).
func (c *Cert) OperatorKey() ed25519.PublicKey {
	k, _ := base64.StdEncoding.DecodeString(c.Operator)
	return k
}

// Signed returns the signed bytes and the signature, for a verifier that
// remembers what it verified.
func (c *Cert) Signed() (body, sig []byte) { return c.signed, c.sig }

// Verify checks the operator's signature.
func (c *Cert) Verify() bool { return ed25519.Verify(c.OperatorKey(), c.signed, c.sig) }

// Current says why the certificate is not valid at now ("" when it is).
func (c *Cert) Current(now time.Time) string {
	switch {
	case now.Add(certSkew).Before(c.NotBefore):
		return "not valid before " + c.NotBefore.UTC().Format(time.RFC3339)
	case !now.Before(c.NotAfter):
		return "expired " + c.NotAfter.UTC().Format(time.RFC3339)
	}
	return ""
}

// Revoke returns the operator's next revocation list: prev's entries (nil
// for the first list), without those older than MaxCertLife (every
// certificate they void has expired), plus hosts revoked now.
func Revoke(op ed25519.PrivateKey, prev *Revocations, hosts []string) (*Revocations, error) {
	pub := base64.StdEncoding.EncodeToString(op.Public().(ed25519.PublicKey))
	now := time.Now().UTC()
	next := Revocations{V: 1, Operator: pub, Serial: 1, Issued: now, Hosts: []Revoked{}}
	by := map[string]time.Time{}
	if prev != nil {
		if prev.Operator != pub {
			return nil, errors.New("the revocation list is another operator's")
		}
		next.Serial = prev.Serial + 1
		for _, r := range prev.Hosts {
			if now.Sub(r.Before) < MaxCertLife {
				by[r.Host] = r.Before
			}
		}
	}
	for _, h := range hosts {
		if !HostRE.MatchString(h) {
			return nil, fmt.Errorf("%q is not a host id", h)
		}
		by[h] = now
	}
	for h, t := range by {
		next.Hosts = append(next.Hosts, Revoked{Host: h, Before: t})
	}
	sort.Slice(next.Hosts, func(i, j int) bool { return next.Hosts[i].Host < next.Hosts[j].Host })
	if len(next.Hosts) > MaxRevoked {
		return nil, fmt.Errorf("%d hosts revoked (at most %d within a certificate's life)", len(next.Hosts), MaxRevoked)
	}
	raw, err := seal(RevokedPrefix, op, next)
	if err != nil {
		return nil, err
	}
	return ParseRevocations(raw)
}

// ParseRevocations reads a revocation list and checks its form; the
// operator's signature is checked by Verify.
func ParseRevocations(s string) (*Revocations, error) {
	var r Revocations
	signed, sig, err := open("revocation list", RevokedPrefix, s, maxListBytes, &r)
	if err != nil {
		return nil, err
	}
	switch {
	case r.V != 1:
		return nil, fmt.Errorf("revocation list version %d (this fleet reads 1)", r.V)
	case r.Serial < 1:
		return nil, fmt.Errorf("revocation list serial %d", r.Serial)
	case len(r.Hosts) > MaxRevoked:
		return nil, fmt.Errorf("revocation list of %d hosts (at most %d)", len(r.Hosts), MaxRevoked)
	}
	if _, err := pubKey("revocation list: operator", r.Operator); err != nil {
		return nil, err
	}
	for _, h := range r.Hosts {
		if !HostRE.MatchString(h.Host) {
			return nil, fmt.Errorf("revocation list: %q is not a host id", h.Host)
		}
	}
	r.Raw, r.signed, r.sig = strings.TrimSpace(s), signed, sig
	return &r, nil
}

// OperatorKey is the key that signed the list (as it claims: see Verify).
func (r *Revocations) OperatorKey() ed25519.PublicKey {
	k, _ := base64.StdEncoding.DecodeString(r.Operator)
	return k
}

// Signed returns the signed bytes and the signature.
func (r *Revocations) Signed() (body, sig []byte) { return r.signed, r.sig }

// Verify checks the operator's signature.
func (r *Revocations) Verify() bool { return ed25519.Verify(r.OperatorKey(), r.signed, r.sig) }

// Voids reports whether the list revokes c (a certificate of the same
// operator).
func (r *Revocations) Voids(c *Cert) bool {
	if r == nil || r.Operator != c.Operator {
		return false
	}
	i := sort.Search(len(r.Hosts), func(i int) bool { return r.Hosts[i].Host >= c.Host })
	for ; i < len(r.Hosts) && r.Hosts[i].Host == c.Host; i++ {
		if !c.Issued.After(r.Hosts[i].Before) {
			return true
		}
	}
	return false
}

// Operator is an operator key as its owner holds it.
type Operator struct {
	Name string
	Key  ed25519.PrivateKey
}

// Line is the operator's trust line, for the hosts' trust files.
func (o *Operator) Line() string {
	return "operator " + o.Name + " " + base64.StdEncoding.EncodeToString(o.Key.Public().(ed25519.PublicKey))
}

// NewOperator writes a new operator key to path (0600; never over an
// existing file), refusing a path inside a gateway's state folder: the
// key that admits any host belongs on the operator's machine, offline.
func NewOperator(path, name string, stateDirs ...string) (*Operator, error) {
	if !HostRE.MatchString(name) {
		return nil, fmt.Errorf("%q is not an operator name (letters, digits, '-', '_'; at most 63)", name)
	}
	if dir := InStateDir(path, stateDirs...); dir != "" {
		return nil, &StateDirError{Path: path, Dir: dir}
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	data := "# fleet operator key: it signs host certificates and revocation lists.\n" +
		"# Keep it on the operator's machine, offline; never on a host.\n" +
		operatorFile + " " + name + " " + base64.StdEncoding.EncodeToString(priv.Seed()) + "\n"
	f, err := private.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return &Operator{Name: name, Key: priv}, nil
}

// StateDirError refuses an operator key in a gateway's state folder.
type StateDirError struct{ Path, Dir string }

func (e *StateDirError) Error() string {
	return fmt.Sprintf("%s is in the gateway state folder %s: an operator key must not be kept on a host", e.Path, e.Dir)
}

// InStateDir returns the gateway state folder path would be in: one of
// dirs, or any folder above path holding a host.key ("" if none).
func InStateDir(path string, dirs ...string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	dir := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if a, err := filepath.Abs(d); err == nil {
			if real, err := filepath.EvalSymlinks(a); err == nil {
				a = real
			}
			if dir == a || strings.HasPrefix(dir, a+string(filepath.Separator)) {
				return d
			}
		}
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, "host.key")); err == nil {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// ReadOperator reads an operator key file (this user's, 0600).
func ReadOperator(path string) (*Operator, error) {
	data, err := private.ReadFile("operator key", path, true, 4096)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) == 3 && f[0] == operatorFile && HostRE.MatchString(f[1]) {
			seed, err := base64.StdEncoding.DecodeString(f[2])
			if err == nil && len(seed) == ed25519.SeedSize {
				return &Operator{Name: f[1], Key: ed25519.NewKeyFromSeed(seed)}, nil
			}
		}
		break
	}
	return nil, fmt.Errorf("%s is not a fleet operator key (fleet-gw operator init makes one)", path)
}

// HostCertPath is where a gateway keeps its own certificate.
func HostCertPath(stateDir string) string { return filepath.Join(stateDir, "host.cert") }

// InstallCert checks that raw is a certificate for host and key (signed by
// the operator it names) and keeps it as the host's certificate.
func InstallCert(stateDir, host string, key ed25519.PublicKey, raw string) (*Cert, error) {
	c, err := ParseCert(raw)
	if err != nil {
		return nil, err
	}
	switch {
	case !c.Verify():
		return nil, errors.New("the certificate's signature is not its operator's (altered)")
	case c.Host != host:
		return nil, fmt.Errorf("the certificate is for host %s, and this host is %s", c.Host, host)
	case !bytes.Equal(c.PublicKey(), key):
		return nil, errors.New("the certificate is for another key than this host's (made from another host's request, or before its key changed)")
	}
	if why := c.Current(time.Now()); why != "" && !strings.HasPrefix(why, "not valid before") {
		return nil, fmt.Errorf("the certificate is %s", why)
	}
	if err := private.MakeDir(stateDir); err != nil {
		return nil, err
	}
	return c, private.WriteFile(HostCertPath(stateDir), []byte(c.Raw+"\n"), 0o600)
}

// ReadHostCert returns the host's own certificate, nil if it has none.
func ReadHostCert(stateDir string) (*Cert, error) {
	data, err := private.ReadFile("host certificate", HostCertPath(stateDir), false, maxCertBytes+64)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return ParseCert(string(data))
}

// A gateway's state folder keeps the certificates it heard, one per host
// (certs/HOST.cert), and the newest revocation list of each operator
// (revoked/KEYID.list), 0600 each, so both outlive a restart.
const (
	certsDir   = "certs"
	revokedDir = "revoked"
)

// SavePeerCert keeps c as the certificate heard from its host.
func SavePeerCert(stateDir string, c *Cert) error {
	dir := filepath.Join(stateDir, certsDir)
	if err := private.MakeDir(dir); err != nil {
		return err
	}
	return private.WriteFile(filepath.Join(dir, c.Host+".cert"), []byte(c.Raw+"\n"), 0o600)
}

// LoadPeerCerts returns the certificates kept, by host. A file that is not
// a certificate of the host it is named for is skipped and reported.
func LoadPeerCerts(stateDir string) (map[string]*Cert, []error) {
	out := map[string]*Cert{}
	var errs []error
	dir := filepath.Join(stateDir, certsDir)
	names, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return out, []error{err}
	}
	for _, n := range names {
		host, ok := strings.CutSuffix(n.Name(), ".cert")
		if !ok || !HostRE.MatchString(host) {
			continue
		}
		path := filepath.Join(dir, n.Name())
		data, err := private.ReadFile("certificate", path, false, maxCertBytes+64)
		var c *Cert
		if err == nil {
			c, err = ParseCert(string(data))
		}
		if err == nil && c.Host != host {
			err = fmt.Errorf("a certificate of %s", c.Host)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		out[host] = c
	}
	return out, errs
}

// SaveRevocations keeps r as its operator's newest list.
func SaveRevocations(stateDir string, r *Revocations) error {
	dir := filepath.Join(stateDir, revokedDir)
	if err := private.MakeDir(dir); err != nil {
		return err
	}
	return private.WriteFile(filepath.Join(dir, KeyID(r.OperatorKey())+".list"), []byte(r.Raw+"\n"), 0o600)
}

// LoadRevocations returns the lists kept, by operator (base64 key); their
// signatures are not checked here.
func LoadRevocations(stateDir string) (map[string]*Revocations, []error) {
	out := map[string]*Revocations{}
	var errs []error
	dir := filepath.Join(stateDir, revokedDir)
	names, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return out, []error{err}
	}
	for _, n := range names {
		if !strings.HasSuffix(n.Name(), ".list") || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, n.Name())
		data, err := private.ReadFile("revocation list", path, false, maxListBytes+64)
		var r *Revocations
		if err == nil {
			r, err = ParseRevocations(string(data))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		if old := out[r.Operator]; old == nil || r.Serial > old.Serial {
			out[r.Operator] = r
		}
	}
	return out, errs
}

// ReadRevocationsFile reads the operator's own copy of its list (nil if
// there is none yet).
func ReadRevocationsFile(path string) (*Revocations, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return ParseRevocations(string(data))
}
