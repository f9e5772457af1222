// Package ident issues and checks entity credentials. A credential is
// "fleet1.<gid>.<secret>"; the gateway stores only the sha256 of the secret.
// A caller is an entity only by presenting its credential — there is no
// --from — and the credential file is readable by its owner alone.
package ident

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/private"
)

const prefix = "fleet1."

// Issue returns a new credential for gid and the hash to store.
func Issue(gid string) (token, hash string) {
	secret := envelope.NewToken()
	return prefix + gid + "." + secret, Hash(secret)
}

// Hash returns the stored form of a secret.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Parse splits a credential into gid and secret.
func Parse(token string) (gid, secret string, err error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(token), prefix)
	if !ok {
		return "", "", fault.New(fault.Refused, fault.KindBadCredential, "credential is not a fleet credential")
	}
	i := strings.LastIndexByte(rest, '.') // a gid holds a dot, a secret none
	if i < 0 {
		return "", "", fault.New(fault.Refused, fault.KindBadCredential, "credential is malformed")
	}
	gid, secret = rest[:i], rest[i+1:]
	if !IsGid(gid) || secret == "" {
		return "", "", fault.New(fault.Refused, fault.KindBadCredential, "credential is malformed")
	}
	return gid, secret, nil
}

// Check reports whether secret matches the stored hash, in constant time.
func Check(secret, hash string) bool {
	return subtle.ConstantTimeCompare([]byte(Hash(secret)), []byte(hash)) == 1
}

// A gid is "<host>.<uuid>": the entity's id for ever, made on the host
// that registered it. The host in it binds the entity to that host's
// signing key (another host cannot speak for it) and to that host's broker
// login (its inbox queue, agent.<gid>.inbox, is in the host's namespace).
// Senders route by the gid as a whole; nobody types the host.
//
// The grammars here (gid, host, name) are checked by hand, not by regular
// expressions: a counted repetition such as {0,62} compiles to a large
// program, and compiling three at package init cost every short command
// ~2 ms and ~200 KB at each start (GODEBUG=inittrace=1). TestGrammars
// holds each to its regular expression.

// IsGid reports whether s is a gid: HOST.UUID (UUID in lowercase hex,
// 8-4-4-4-12).
func IsGid(s string) bool {
	host, id, ok := strings.Cut(s, ".")
	return ok && ValidHost(host) && isUUID(id)
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// ValidHost reports whether s is a host id: a letter or digit, then up to
// 62 letters, digits, '-' or '_'.
func ValidHost(s string) bool {
	if len(s) == 0 || len(s) > 63 || !isAlnum(s[0]) {
		return false
	}
	return tailOK(s[1:])
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func tailOK(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// IDPattern is the grammar of a msg id (and of trace, turn and request
// ids): what the gateway admits from another host. Local ones are UUIDs,
// which it holds too. No byte outside it is a shell word's.
const IDPattern = `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`

// ValidID reports whether s is in IDPattern.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

// NewGid mints a gid on host.
func NewGid(host string) string { return host + "." + envelope.NewID() }

// GidHost is the host a gid was made on ("" if s is not a gid).
func GidHost(s string) string {
	if !IsGid(s) {
		return ""
	}
	h, _, _ := strings.Cut(s, ".")
	return h
}

// NamePattern is the grammar of an entity (and group) name: a letter, then
// up to 63 letters, digits, '-' or '_'. The gateway admits no other name,
// and a name is a file name under the credentials folder, so nothing else
// may reach a path either.
const NamePattern = `^[A-Za-z][A-Za-z0-9_-]{0,63}$`

// ValidName reports whether name is a valid entity name (NamePattern).
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	if c := name[0]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
		return false
	}
	return tailOK(name[1:])
}

// CheckName returns a usage error (exit 64) unless name is a valid entity
// name.
func CheckName(name string) error {
	if !ValidName(name) {
		return fault.New(fault.Usage, fault.KindUsage,
			"%q is not a valid name (a letter, then up to 63 letters, digits, '-' or '_')", name)
	}
	return nil
}

// Group names. Each becomes a routing key, broadcast.<group>: the key a
// broadcast is published with and each member's inbox is bound by. A
// host's broker login may publish and bind such keys only in this grammar
// (broker.HostGrant), and the broker answers a publish outside it by
// closing the channel. So every entry point — a command's flag, the socket
// API, the MCP tools, a message from another host — holds a group name to
// ValidGroup before it goes anywhere.

// ValidGroup reports whether s is a group name: the grammar of entity
// names (NamePattern). "all" is one too: the group of everyone, which a
// broadcast may name and nobody joins (CheckMember).
func ValidGroup(s string) bool { return ValidName(s) }

// groupRule is the grammar of a group name in words, for errors.
const groupRule = "a letter, then up to 63 letters, digits, '-' or '_'"

// CheckGroup returns a usage error (exit 64) unless group is a group name
// a broadcast may go to ("" is everyone).
func CheckGroup(group string) error {
	if group == "" || ValidGroup(group) {
		return nil
	}
	return fault.New(fault.Usage, fault.KindUsage, "%q is not a valid group name (%s)", group, groupRule).
		WithHint("fleet-roster lists each entity's groups")
}

// CheckMember returns a usage error (exit 64) unless every one of groups
// is a group name an entity may join: any but "all", which everyone is in.
func CheckMember(groups []string) error {
	for _, g := range groups {
		if !ValidGroup(g) {
			return fault.New(fault.Usage, fault.KindUsage, "%q is not a valid group name (%s)", g, groupRule).
				WithHint("name a group as an entity is named, e.g. reviewers or team-2")
		}
		if g == "all" {
			return fault.New(fault.Usage, fault.KindUsage, `"all" is not a group to join: every entity is in it`).
				WithHint("a broadcast without a group reaches everyone")
		}
	}
	return nil
}

// File is where the credential of name is kept under stateDir.
func File(stateDir, name string) string {
	return filepath.Join(stateDir, "credentials", name+".token")
}

// Save writes the credential owner-only (0600 in a 0700 folder).
func Save(stateDir, name, token string) (string, error) {
	path := File(stateDir, name)
	if err := private.MakeDir(filepath.Dir(path)); err != nil {
		return "", err
	}
	return path, private.WriteFile(path, []byte(token+"\n"), 0o600)
}

// Remove deletes the credential file of name.
func Remove(stateDir, name string) {
	_ = os.Remove(File(stateDir, name))
}

// Load reads the credential of name, refusing a name that is not an entity
// name (before any file is touched) and a file others can read.
func Load(stateDir, name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	path := File(stateDir, name)
	data, err := private.ReadFile("credential file", path, true, 4096)
	if errors.Is(err, os.ErrNotExist) {
		return "", fault.New(fault.Refused, fault.KindNoCredential, "no credential for %q on this host (%s)", name, path).
			WithHint("register it with: fleet-roster join %s", name)
	}
	if fe := fault.NotPrivate(err); fe != nil {
		// a link, another user's, or readable by others: told as a bad
		// credential, the kind scripts already know
		bad := *fe
		bad.Kind = fault.KindBadCredential
		return "", &bad
	}
	if err != nil {
		return "", fault.Wrap(fault.Refused, fault.KindNoCredential, err, "credential of %q", name)
	}
	return strings.TrimSpace(string(data)), nil
}

// Describe names a credential for logs without revealing it.
func Describe(token string) string {
	gid, _, err := Parse(token)
	if err != nil {
		return "invalid"
	}
	return fmt.Sprintf("%s…", gid)
}
