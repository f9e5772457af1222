package seal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// host is one host's keyring in a folder of its own.
func host(t testing.TB) *Keyring {
	t.Helper()
	k, err := LoadKeyring(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustSeal(t testing.TB, bind string, text []byte, to ...*Keyring) []byte {
	t.Helper()
	var rs []*Recipient
	for _, k := range to {
		rs = append(rs, k.Public())
	}
	out, err := Seal(bind, text, rs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSealOpen(t *testing.T) {
	h1, h2, h3, h4 := host(t), host(t), host(t), host(t)
	bind := Bind("SEND", "m-1", "h0")
	for _, text := range [][]byte{[]byte("x"), []byte("review PR 12 before lunch\n"), bytes.Repeat([]byte("é"), 70000), {}} {
		sealed := mustSeal(t, bind, text, h1)
		if len(text) > 8 && bytes.Contains(sealed, text[:8]) {
			t.Fatal("the text is in the sealed bytes")
		}
		got, err := Open(bind, sealed, h1)
		if err != nil || !bytes.Equal(got, text) {
			t.Fatalf("Open: %q %v", got, err)
		}
		// another host: not for it, and says so
		_, err = Open(bind, sealed, h2)
		var se *Error
		if !errors.Is(err, ErrNotForUs) || !errors.As(err, &se) || se.Reason() != "not_for_us" {
			t.Fatalf("another host's Open: %v", err)
		}
	}
	// a broadcast: sealed once, one stanza per host, each opens it
	text := []byte("all hands: freeze merges")
	b := Bind("BROADCAST", "m-2", "h0")
	sealed := mustSeal(t, b, text, h1, h2, h3, h2)
	ids, err := Recipients(sealed)
	if err != nil || len(ids) != 3 {
		t.Fatalf("recipients %v %v (a host named twice gets one stanza)", ids, err)
	}
	for i, k := range []*Keyring{h1, h2, h3} {
		if ids[i] != k.Public().ID() {
			t.Fatalf("stanza %d is %s, not %s", i, ids[i], k.Public().ID())
		}
		if got, err := Open(b, sealed, k); err != nil || !bytes.Equal(got, text) {
			t.Fatalf("host %d: %q %v", i+1, got, err)
		}
	}
	if _, err := Open(b, sealed, h4); !errors.Is(err, ErrNotForUs) {
		t.Fatalf("a host left out: %v", err)
	}
	// bound to its message: the same bytes under another id, kind or
	// signing host are refused
	for _, other := range []string{Bind("BROADCAST", "m-3", "h0"), Bind("SEND", "m-2", "h0"), Bind("BROADCAST", "m-2", "h9"), ""} {
		if _, err := Open(other, sealed, h1); !errors.Is(err, ErrTampered) || !strings.Contains(err.Error(), "another message") {
			t.Fatalf("bound to %q, opened as %q: %v", b, other, err)
		}
	}
	if _, err := Seal(b, text, nil); err == nil {
		t.Fatal("sealed to nobody")
	}
}

// Every byte altered, and every length cut, is refused: never a
// plaintext, never a panic.
func TestTampered(t *testing.T) {
	h1, h2 := host(t), host(t)
	bind := Bind("SEND", "m-1", "h0")
	text := bytes.Repeat([]byte("secret plan "), 100)
	sealed := mustSeal(t, bind, text, h2, h1)
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x20
		got, err := Open(bind, bad, h1)
		if err == nil {
			t.Fatalf("byte %d altered: opened %q", i, got)
		}
		var se *Error
		if !errors.As(err, &se) {
			t.Fatalf("byte %d: untyped error %v", i, err)
		}
		// a key id altered may hide this host's stanza (then it is not
		// for us); anything else is tampering
		if tableEnd := len(magic) + 1 + 2*8; i >= tableEnd && !errors.Is(err, ErrTampered) {
			t.Fatalf("byte %d: %v, not tampered", i, err)
		}
	}
	for n := 0; n < len(sealed); n++ {
		if _, err := Open(bind, sealed[:n], h1); !errors.Is(err, ErrTampered) {
			t.Fatalf("cut at %d: %v", n, err)
		}
	}
	if _, err := Open(bind, append(bytes.Clone(sealed), 'x'), h1); !errors.Is(err, ErrTampered) {
		t.Fatal("a byte appended was not refused")
	}
	// the key ids say h1 is stanza 0 while its stanza is 1: the stanza
	// tried is h2's, so nothing opens
	swapped := bytes.Clone(sealed)
	off := len(magic) + 1
	copy(swapped[off:], sealed[off+8:off+16])
	copy(swapped[off+8:], sealed[off:off+8])
	if _, err := Open(bind, swapped, h1); !errors.Is(err, ErrTampered) {
		t.Fatalf("swapped key ids: %v", err)
	}
	// a table naming more hosts than there are stanzas
	var more []byte
	more = append(more, magic...)
	more = binary.AppendUvarint(more, 3)
	more = append(more, sealed[off:off+16]...)
	more = append(more, h1.Public().id[:]...)
	more = append(more, sealed[off+16:]...)
	if _, err := Open(bind, more, h1); !errors.Is(err, ErrTampered) {
		t.Fatalf("a table longer than the stanzas: %v", err)
	}
	// a table claiming more entries than bytes: refused before any
	// allocation
	huge := append(append([]byte{}, magic...), binary.AppendUvarint(nil, 1<<40)...)
	if _, err := Open(bind, huge, h1); !errors.Is(err, ErrTampered) {
		t.Fatalf("huge table: %v", err)
	}
}

// A message sealed to a key that was rotated out opens within the grace,
// and not after it; after Destroy the key file is gone and the refusal
// still names the reason.
func TestRotation(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	k.now = func() time.Time { return now }
	bind := Bind("SEND", "m-1", "h0")
	old := k.Public()
	queued := mustSeal(t, bind, []byte("queued under the old key"), k)

	next, err := k.Rotate(24 * time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if next.ID() == old.ID() || k.Public().ID() != next.ID() {
		t.Fatal("Rotate kept the key")
	}
	fresh := mustSeal(t, bind, []byte("sealed to the new key"), k)
	keys := k.Keys()
	if len(keys) != 2 || !keys[0].Current || keys[0].Public != next.String() || keys[1].Public != old.String() || !keys[1].Until.Equal(now.Add(24*time.Hour)) {
		t.Fatalf("keys %+v", keys)
	}
	retiredFiles, _ := filepath.Glob(filepath.Join(dir, RetiredDir, "*.key"))
	if len(retiredFiles) != 1 || !strings.Contains(retiredFiles[0], old.ID().String()) {
		t.Fatalf("retired files %v", retiredFiles)
	}
	checkPrivate(t, retiredFiles[0])
	checkPrivate(t, filepath.Join(dir, KeyFile))

	// inside the grace: both open; nothing is destroyed yet
	now = now.Add(24*time.Hour - time.Second)
	for _, m := range [][]byte{queued, fresh} {
		if _, err := Open(bind, m, k); err != nil {
			t.Fatalf("inside the grace: %v", err)
		}
	}
	if gone, err := k.Destroy(); err != nil || len(gone) != 0 {
		t.Fatalf("destroyed %v %v inside the grace", gone, err)
	}
	// another process sees the same (it reads the files)
	k2, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2.now = k.now
	if _, err := Open(bind, queued, k2); err != nil {
		t.Fatalf("another process, inside the grace: %v", err)
	}

	// after the grace: the old key opens nothing, even before Destroy
	now = now.Add(time.Second)
	if _, err := Open(bind, queued, k); !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), "grace ended") {
		t.Fatalf("after the grace: %v", err)
	}
	gone, err := k.Destroy()
	if err != nil || len(gone) != 1 || gone[0] != old.ID() {
		t.Fatalf("Destroy: %v %v", gone, err)
	}
	if _, err := os.Stat(retiredFiles[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the retired key file is still there: %v", err)
	}
	var se *Error
	if _, err := Open(bind, queued, k); !errors.As(err, &se) || se.Kind != ErrUnknownKey || se.Reason() != "unknown_seal_key" || se.Key != old.ID().String() {
		t.Fatalf("after Destroy: %v", err)
	}
	if _, err := Open(bind, fresh, k); err != nil {
		t.Fatalf("the new key: %v", err)
	}
	// the other process reloads (the files changed) and agrees; a fresh
	// load from disk too
	k3, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, kr := range []*Keyring{k2, k3} {
		if _, err := Open(bind, queued, kr); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("keyring %d after Destroy: %v", i+2, err)
		}
		if kr.Public().ID() != next.ID() {
			t.Fatalf("keyring %d holds %s", i+2, kr.Public().ID())
		}
	}
	if _, err := k.Rotate(-time.Second); err == nil {
		t.Fatal("a negative grace was taken")
	}
}

func checkPrivate(t *testing.T, path string) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || !st.Mode().IsRegular() {
		t.Fatalf("%s is %v, not a 0600 file", path, st.Mode())
	}
}

// The key is made once, 0600, and kept: a second load is the same key; a
// key file others may read is refused; the file is an age identity file.
func TestKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, KeyFile)
	checkPrivate(t, path)
	again, err := LoadKeyring(dir)
	if err != nil || again.Public().String() != k.Public().String() {
		t.Fatalf("reloaded %v %v", again, err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "\nAGE-SECRET-KEY-1") || !strings.Contains(string(data), k.Public().String()) {
		t.Fatalf("key file:\n%s", data)
	}
	if r, err := ParseRecipient(k.Public().String()); err != nil || r.ID() != k.Public().ID() {
		t.Fatalf("ParseRecipient: %v", err)
	}
	for _, bad := range []string{"", "age1", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", strings.ToUpper(k.Public().String()[:10]) + k.Public().String()[10:],
		typo(k.Public().String())} {
		if _, err := ParseRecipient(bad); err == nil {
			t.Errorf("ParseRecipient(%q) took it", bad)
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeyring(dir); err == nil || !strings.Contains(err.Error(), "may be read by others") {
		t.Fatalf("a readable key: %v", err)
	}
	os.Chmod(path, 0o600)
}

// What age itself makes of a sealing: the age command opens a sealed
// message's age file with the host's key file. Never a quiet skip: make
// test installs age (scripts/test-deps.sh).
func TestAgeCLIOpensSealed(t *testing.T) {
	agePath, err := exec.LookPath("age")
	if err != nil {
		t.Fatalf("no age command on this machine, so the cross-check with age cannot run: run scripts/test-deps.sh (apt-get install age)")
	}
	dir := t.TempDir()
	k, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	sealed := mustSeal(t, "", []byte("hello"), k)
	_, file, _ := split(sealed)
	cmd := exec.Command(agePath, "-d", "-i", filepath.Join(dir, KeyFile))
	cmd.Stdin = bytes.NewReader(file)
	out, err := cmd.Output()
	if err != nil || !bytes.HasSuffix(out, []byte("hello")) {
		t.Fatalf("age -d: %q %v", out, err)
	}
}

func FuzzOpen(f *testing.F) {
	k := host(f)
	bind := Bind("SEND", "m-1", "h0")
	sealed := mustSeal(f, bind, []byte("fuzz me"), k)
	f.Add(sealed)
	f.Add(sealed[:40])
	f.Add([]byte("fsl1"))
	f.Add([]byte("fsl1\x01abcdefghage-encryption.org/v1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Open(bind, data, k)
		if err == nil {
			if !bytes.Equal(data, sealed) {
				// only an authentic sealing of this message opens; the
				// fuzzer cannot make one without the file key
				t.Fatalf("opened altered bytes to %q", got)
			}
			return
		}
		var se *Error
		if !errors.As(err, &se) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

func mustKeyring() *Keyring {
	dir, err := os.MkdirTemp("", "seal-example-")
	if err != nil {
		panic(err)
	}
	k, err := LoadKeyring(filepath.Join(dir, "state"))
	if err != nil {
		panic(err)
	}
	return k
}

// Another process (fleet-gw on the command line) rotates the key while
// the gateway's keyring opens messages queued under the old one: every
// one opens, before, during and after, and the gateway's ring then holds
// the new key without a restart.
func TestRotateByAnotherProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	gw, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	var queued [][]byte
	for i := range 20 {
		queued = append(queued, mustSeal(t, Bind("SEND", fmt.Sprint("m-", i), "h0"), []byte(fmt.Sprint("queued ", i)), gw))
	}
	done := make(chan error, 4)
	stop := make(chan struct{})
	for w := range 4 {
		go func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				i := (n + w) % len(queued)
				got, err := Open(Bind("SEND", fmt.Sprint("m-", i), "h0"), queued[i], gw)
				if err != nil || string(got) != fmt.Sprint("queued ", i) {
					done <- fmt.Errorf("message %d: %q %v", i, got, err)
					return
				}
			}
		}()
	}
	cli, err := LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	next, err := cli.Rotate(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if gw.Public().ID() != next.ID() {
		t.Fatalf("the gateway's ring holds %s after the rotation to %s", gw.Public().ID(), next.ID())
	}
	fresh := mustSeal(t, "b", []byte("to the new key"), gw)
	if got, err := Open("b", fresh, gw); err != nil || string(got) != "to the new key" {
		t.Fatalf("the new key: %q %v", got, err)
	}
	for i, m := range queued {
		if _, err := Open(Bind("SEND", fmt.Sprint("m-", i), "h0"), m, gw); err != nil {
			t.Fatalf("after the rotation, message %d: %v", i, err)
		}
	}
}

// typo changes the last character of s to another of Bech32's.
func typo(s string) string {
	if s[len(s)-1] == 'q' {
		return s[:len(s)-1] + "p"
	}
	return s[:len(s)-1] + "q"
}
