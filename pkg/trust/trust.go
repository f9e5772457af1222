// Package trust is who a gateway believes across hosts (design decision
// 6): this host's Ed25519 signing key (STATE_DIR/host.key, 0600) and the
// trust file of the other hosts' public keys (lines "HOST BASE64-KEY
// [SEALING-KEY]", the line `fleet-gw key` prints on each host). The
// sealing key ("age1...", pkg/seal) is what other hosts will seal message
// bodies to; a line without one (written before sealing keys existed) is
// still read, as a host that announces no sealing key. The gateway signs everything
// it publishes with its key and admits from the broker only what a host
// in its trust file signed. No trust file, or an empty one, admits no
// other host: closed by default. The file may also hold operator lines
// ("operator NAME KEY"): a host certified by a trusted operator is
// admitted without a line of its own (opcert.go).
//
// The file is edited with `fleet-gw trust add|remove|list`, atomically
// (a new file renamed over the old), and a running gateway sees every
// change at its next message: a removed host is refused from then on,
// including what it had already queued.
package trust

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetd/fleet/internal/bech32"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/private"
)

// HostRE is the grammar of a host id: what config accepts for this host
// and what a message from the broker may name (^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$,
// checked by hand: see ident.ValidHost).
var HostRE hostGrammar

type hostGrammar struct{}

// MatchString reports whether s is a host id.
func (hostGrammar) MatchString(s string) bool { return ident.ValidHost(s) }

// HostKey returns the signing key in stateDir, creating it on first use.
func HostKey(stateDir string) (ed25519.PrivateKey, error) {
	path := filepath.Join(stateDir, "host.key")
	data, err := private.ReadFile("host key", path, true, 4096)
	if err == nil {
		seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
		if err != nil || len(seed) != ed25519.SeedSize {
			return nil, fmt.Errorf("%s is not a fleet host key", path)
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := private.MakeDir(stateDir); err != nil {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return priv, private.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600)
}

// Line is host's line for the trust files of the others, without a
// sealing key (as before sealing keys existed).
func Line(host string, pub ed25519.PublicKey) string {
	return host + " " + base64.StdEncoding.EncodeToString(pub)
}

// SealedLine is host's line with its public sealing key: what `fleet-gw
// key` prints.
func SealedLine(host string, pub ed25519.PublicKey, sealKey string) string {
	return Line(host, pub) + " " + sealKey
}

// Entry is one trusted host, or one trusted operator (opcert.go): a host
// entry has Host, an operator entry Operator (its name). A host entry
// with no SealKey is a host that announces no sealing key.
type Entry struct {
	Host     string `json:"host,omitempty"`
	Key      string `json:"key"`                // base64, as in the file
	SealKey  string `json:"seal_key,omitempty"` // age1..., as in the file; "" for none
	Operator string `json:"operator,omitempty"`
}

// Sealing reports whether the host announces a sealing key.
func (e Entry) Sealing() bool { return e.SealKey != "" }

// String is the entry's line in the file.
func (e Entry) String() string {
	switch {
	case e.Operator != "":
		return "operator " + e.Operator + " " + e.Key
	case e.SealKey != "":
		return e.Host + " " + e.Key + " " + e.SealKey
	}
	return e.Host + " " + e.Key
}

// ParseLine reads "HOST KEY [SEALING-KEY]" (the output of `fleet-gw key`)
// or "operator NAME KEY" (the output of `fleet-gw operator init`). The
// two three-field forms never meet: an operator's NAME is a host id, and
// a host's KEY is base64 of 32 bytes, which ends in '=', never in one.
func ParseLine(line string) (Entry, error) {
	f := strings.Fields(line)
	if len(f) == 3 && f[0] == "operator" && HostRE.MatchString(f[1]) {
		return CheckOperator(f[1], f[2])
	}
	switch len(f) {
	case 2:
		return Check(f[0], f[1])
	case 3:
		return CheckSealed(f[0], f[1], f[2])
	}
	return Entry{}, fmt.Errorf("%q is not a trust line (HOST KEY [SEALING-KEY], as fleet-gw key prints it, or operator NAME KEY)", line)
}

// CheckSealed validates a host id, a base64 Ed25519 public key and a
// public sealing key (age1...).
func CheckSealed(host, key, sealKey string) (Entry, error) {
	e, err := Check(host, key)
	if err != nil {
		return e, err
	}
	if err := CheckSealKey(sealKey); err != nil {
		return Entry{}, err
	}
	e.SealKey = sealKey
	return e, nil
}

// CheckSealKey validates a public sealing key: an age X25519 recipient
// ("age1" and 58 more characters of Bech32), checksum included, so a
// mistyped key is refused when it is added rather than at the first
// message sealed to it.
func CheckSealKey(s string) error {
	hrp, raw, err := bech32.Decode(s)
	if err != nil || hrp != "age" || len(raw) != 32 || strings.ToLower(s) != s {
		return fmt.Errorf("%q is not a sealing key (age1..., the third field of the line fleet-gw key prints)", s)
	}
	return nil
}

// CheckOperator validates an operator name and a base64 Ed25519 key.
func CheckOperator(name, key string) (Entry, error) {
	if !HostRE.MatchString(name) {
		return Entry{}, fmt.Errorf("%q is not an operator name (letters, digits, '-', '_'; at most 63)", name)
	}
	pub, err := base64.StdEncoding.DecodeString(key)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return Entry{}, fmt.Errorf("%q is not an operator public key (44 characters of base64, as fleet-gw operator init prints it)", key)
	}
	return Entry{Operator: name, Key: key}, nil
}

// id is what an entry replaces in the file: the host's line, or the
// operator's of that name.
func (e Entry) id() string {
	if e.Operator != "" {
		return "operator " + e.Operator
	}
	return e.Host
}

// Check validates a host id and a base64 Ed25519 public key.
func Check(host, key string) (Entry, error) {
	if !HostRE.MatchString(host) {
		return Entry{}, fmt.Errorf("%q is not a host id (letters, digits, '-', '_'; at most 63)", host)
	}
	pub, err := base64.StdEncoding.DecodeString(key)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return Entry{}, fmt.Errorf("%q is not a host public key (44 characters of base64, as fleet-gw key prints it)", key)
	}
	return Entry{Host: host, Key: key}, nil
}

// Read returns the file's entries, in host order. A missing file has none.
// Lines that are not valid entries are reported, not skipped: a typo must
// not silently distrust a host. A file another user owns or may write is
// refused (77): a trust line is what lets a host's messages in. (It may be
// a link, to a file kept by configuration management; the file reached is
// judged.)
func Read(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := private.Check("trust file", f, false); err != nil {
		return nil, err
	}
	byHost := map[string]Entry{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := ParseLine(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		byHost[e.id()] = e
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(byHost))
	for _, e := range byHost {
		out = append(out, e)
	}
	sortEntries(out)
	return out, nil
}

// sortEntries puts hosts first, in host order, then operators by name.
func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool {
		if (es[i].Operator == "") != (es[j].Operator == "") {
			return es[i].Operator == ""
		}
		return es[i].id() < es[j].id()
	})
}

// write replaces the file with entries, atomically, owner-only.
func write(path string, entries []Entry) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# fleet trust file: hosts whose signed messages this gateway admits.\n")
	b.WriteString("# Edit with: fleet-gw trust add HOST KEY | fleet-gw trust remove HOST\n")
	for _, e := range entries {
		b.WriteString(e.String() + "\n")
	}
	return private.WriteFile(path, []byte(b.String()), 0o600)
}

// Add trusts e.Host (or operator e.Operator) with e.Key (and e.SealKey),
// replacing the line it had. It reports whether the file changed.
func Add(path string, e Entry) (bool, error) {
	entries, err := Read(path)
	if err != nil {
		return false, err
	}
	for i, x := range entries {
		if x.id() == e.id() {
			if x.Key == e.Key && x.SealKey == e.SealKey {
				return false, nil
			}
			entries[i] = e
			return true, write(path, entries)
		}
	}
	entries = append(entries, e)
	sortEntries(entries)
	return true, write(path, entries)
}

// Remove distrusts host. It reports whether host was trusted.
func Remove(path, host string) (bool, error) { return remove(path, host) }

// RemoveOperator distrusts the operator called name: the hosts it
// certified are refused from then on. It reports whether it was trusted.
func RemoveOperator(path, name string) (bool, error) { return remove(path, "operator "+name) }

func remove(path, id string) (bool, error) {
	entries, err := Read(path)
	if err != nil {
		return false, err
	}
	for i, x := range entries {
		if x.id() == id {
			return true, write(path, append(entries[:i], entries[i+1:]...))
		}
	}
	return false, nil
}

// File is the trust file as a running gateway sees it: reread whenever it
// changed (its inode, size, modification or change time), checked with
// one stat per call.
type File struct {
	path string

	mu    sync.Mutex
	id    fileID
	keys  map[string]ed25519.PublicKey
	seals map[string]string // host -> its sealing key (age1...), for hosts that announce one
	ops   map[string]string // base64 key -> name: the operators trusted
	err   error             // the last read's error: a broken file trusts no one
	found bool
}

type fileID struct {
	ino          uint64
	size         int64
	mtime, ctime time.Time
}

// Open returns the trust file at path; nothing is read until used.
func Open(path string) *File { return &File{path: path} }

// Path is where the file is.
func (f *File) Path() string { return f.path }

// Keys returns the trusted hosts' keys as the file says now, and the error
// that made it unreadable, if any (then no host is trusted).
func (f *File) Keys() (map[string]ed25519.PublicKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Stat(f.path, &st); err != nil {
		f.keys, f.seals, f.ops, f.err, f.found, f.id = nil, nil, nil, nil, false, fileID{}
		if !errors.Is(err, syscall.ENOENT) {
			f.err = err
		}
		return nil, f.err
	}
	id := fileID{ino: st.Ino, size: st.Size,
		mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), ctime: time.Unix(st.Ctim.Sec, st.Ctim.Nsec)}
	if f.found && id == f.id {
		return f.keys, f.err
	}
	entries, err := Read(f.path)
	keys := make(map[string]ed25519.PublicKey, len(entries))
	seals := map[string]string{}
	ops := map[string]string{}
	for _, e := range entries {
		if e.Operator != "" {
			ops[e.Key] = e.Operator
			continue
		}
		pub, _ := base64.StdEncoding.DecodeString(e.Key)
		keys[e.Host] = pub
		if e.SealKey != "" {
			seals[e.Host] = e.SealKey
		}
	}
	if err != nil {
		keys, seals, ops = nil, nil, nil
	}
	f.keys, f.seals, f.ops, f.err, f.found, f.id = keys, seals, ops, err, true, id
	return keys, err
}

// Operators returns the operators trusted as the file says now: base64
// public key -> name.
func (f *File) Operators() map[string]string {
	f.Keys() // reread if it changed
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops
}

// SealKey returns the sealing key (age1...) host's line announces; false
// if the file does not trust host or its line announces none (a host
// that predates sealing keys).
func (f *File) SealKey(host string) (string, bool) {
	f.Keys() // reread if it changed
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.seals[host]
	return k, ok
}

// Key returns host's key, if the file trusts host.
func (f *File) Key(host string) (ed25519.PublicKey, bool) {
	keys, _ := f.Keys()
	k, ok := keys[host]
	return k, ok
}

// Count is the number of trusted hosts.
func (f *File) Count() int {
	keys, _ := f.Keys()
	return len(keys)
}
