package gateway

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"sync"
)

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
