package envelope

import (
	"encoding/hex"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// uuidV7 is the text form of an RFC 9562 version 7 UUID.
var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestNewIDIsUUIDv7: version 7, the RFC variant, and the Unix milliseconds
// of its making in the first 48 bits.
func TestNewIDIsUUIDv7(t *testing.T) {
	before := time.Now().UnixMilli()
	id := NewID()
	after := time.Now().UnixMilli()
	if !uuidV7.MatchString(id) {
		t.Fatalf("%q is not a UUIDv7", id)
	}
	b, err := hex.DecodeString(strings.ReplaceAll(id, "-", "")[:12])
	if err != nil {
		t.Fatal(err)
	}
	var ms int64
	for _, x := range b {
		ms = ms<<8 | int64(x)
	}
	// the count may run ahead of the clock by at most what it was bumped
	if ms < before || ms > after+1 {
		t.Fatalf("%q says %d ms, made between %d and %d", id, ms, before, after)
	}
}

// TestNewIDIncreases: ids made in a row, from several goroutines at once,
// are all different, and each goroutine's are in increasing order (as
// strings, the order the store keeps them in).
func TestNewIDIncreases(t *testing.T) {
	const workers, each = 4, 5000
	ids := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				ids[w] = append(ids[w], NewID())
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, list := range ids {
		for i, id := range list {
			if seen[id] {
				t.Fatalf("%q made twice", id)
			}
			seen[id] = true
			if !uuidV7.MatchString(id) {
				t.Fatalf("%q is not a UUIDv7", id)
			}
			if i > 0 && id <= list[i-1] {
				t.Fatalf("%q made after %q", id, list[i-1])
			}
		}
	}
}
