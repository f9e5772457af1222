package gateway

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
)

// Identity across hosts (design decision 6). Each gateway has an Ed25519
// key in its state folder (host.key, 0600) and signs the exact bytes it
// publishes. A receiver admits a message only when it is signed by a host
// in its trust file (lines "HOST BASE64-PUBLIC-KEY"; `fleet-gw key` prints
// this host's line) and the message's sender claims that same host — and,
// when the roster view knows the sender's gid, lives there. Unsigned,
// forged, wrong-host and too-old messages are rejected to bridge.dlq with a
// loud log line; replays of a known msg id are dropped by the dedup.
// Without a trust file the gateway still signs, but admits what it cannot
// check, and says so loudly at start.

// HostKey returns this host's signing key, creating it on first use.
func HostKey(cfg *config.Config) (ed25519.PrivateKey, error) {
	path := filepath.Join(cfg.StateDir, "host.key")
	data, err := os.ReadFile(path)
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
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(base64.StdEncoding.EncodeToString(priv.Seed())+"\n"), 0o600); err != nil {
		return nil, err
	}
	return priv, os.Rename(tmp, path)
}

// TrustLine is this host's line for the trust files of the others.
func TrustLine(host string, priv ed25519.PrivateKey) string {
	return host + " " + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
}

// trust is the trust file, reread when it changes.
type trust struct {
	path  string
	mu    sync.Mutex
	mod   time.Time
	size  int64 // with mod: a line appended within one timestamp tick is still seen
	keys  map[string]ed25519.PublicKey
	found bool
}

func (t *trust) load() (map[string]ed25519.PublicKey, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		t.keys, t.found = nil, false
		return nil, false
	}
	if t.found && fi.ModTime().Equal(t.mod) && fi.Size() == t.size {
		return t.keys, true
	}
	f, err := os.Open(t.path)
	if err != nil {
		return t.keys, t.found
	}
	defer f.Close()
	keys := map[string]ed25519.PublicKey{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		host, k, ok := strings.Cut(line, " ")
		pub, err := base64.StdEncoding.DecodeString(strings.TrimSpace(k))
		if ok && err == nil && len(pub) == ed25519.PublicKeySize {
			keys[host] = pub
		}
	}
	t.keys, t.mod, t.size, t.found = keys, fi.ModTime(), fi.Size(), true
	return keys, true
}

// setupAuth gives the broker this gateway's signer and verifier.
func (g *Gateway) setupAuth() error {
	priv, err := HostKey(g.cfg)
	if err != nil {
		return err
	}
	t := &trust{path: g.cfg.TrustFile}
	if _, ok := t.load(); !ok {
		g.log.Warn("no trust file: messages from other hosts are admitted without checking who sent them",
			"trust_file", g.cfg.TrustFile, "fix", "collect every host's `fleet-gw key` line into it")
	}
	own := priv.Public().(ed25519.PublicKey)
	ok := newVerified(1024)
	g.br.SetAuth(
		func(body []byte) []byte { return ed25519.Sign(priv, body) },
		func(host string, body, sig []byte, env *envelope.Envelope) error {
			keys, enforced := t.load()
			if !enforced {
				return nil
			}
			if host == "" || len(sig) == 0 {
				return broker.ErrUnsigned
			}
			pub := keys[host]
			if host == g.cfg.Host {
				pub = own
			}
			if pub == nil {
				return fmt.Errorf("host %q is not in the trust file", host)
			}
			if !ok.check(pub, body, sig) {
				return fmt.Errorf("bad signature for host %q: forged or altered", host)
			}
			if env.Sender.Host != "" && env.Sender.Host != host {
				return fmt.Errorf("sender claims host %q but %q signed it", env.Sender.Host, host)
			}
			if env.Sender.Gid != "" && host != g.cfg.Host {
				if at := g.remoteHostOf(env.Sender.Gid); at != "" && at != host {
					return fmt.Errorf("sender %s lives on %q in the roster, not on %q", env.Sender.Gid, at, host)
				}
			}
			if env.Kind != envelope.Presence && time.Since(env.Created) > g.cfg.DedupWindow {
				return fmt.Errorf("created %s, older than the dedup window: a replay", env.Created.Format(time.RFC3339))
			}
			return nil
		})
	return nil
}

// verified remembers the (key, bytes, signature) triples that verified,
// most recent first, so the copies of one broadcast that reach this host
// (one per member inbox, the same bytes each time) cost one Ed25519
// verification, not one each. Only exact repeats match: any other bytes,
// signature or key are verified afresh.
type verified struct {
	mu    sync.Mutex
	seen  map[[32]byte]struct{}
	order [][32]byte
	next  int
}

func newVerified(n int) *verified {
	return &verified{seen: make(map[[32]byte]struct{}, n), order: make([][32]byte, n)}
}

// check reports whether sig is pub's signature of body.
func (v *verified) check(pub ed25519.PublicKey, body, sig []byte) bool {
	h := sha256.New()
	for _, part := range [][]byte{pub, sig, body} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	var key [32]byte
	h.Sum(key[:0])
	v.mu.Lock()
	_, hit := v.seen[key]
	v.mu.Unlock()
	if hit {
		return true
	}
	if !ed25519.Verify(pub, body, sig) {
		return false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, dup := v.seen[key]; !dup {
		delete(v.seen, v.order[v.next])
		v.order[v.next] = key
		v.seen[key] = struct{}{}
		v.next = (v.next + 1) % len(v.order)
	}
	return true
}
