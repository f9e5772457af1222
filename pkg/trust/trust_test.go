package trust

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func line(t *testing.T, host string) Entry {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(nil)
	e, err := ParseLine(Line(host, pub))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// add, replace, remove and list, atomically and owner-only; a running
// reader sees each change at its next call, even one of the same size.
func TestTrustFileEdits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trust")
	f := Open(path)
	if n := f.Count(); n != 0 {
		t.Fatalf("a missing file trusts %d hosts", n)
	}
	h1, h2 := line(t, "h1"), line(t, "h2")
	for _, e := range []Entry{h2, h1} {
		if changed, err := Add(path, e); err != nil || !changed {
			t.Fatalf("add %s: %v %v", e.Host, changed, err)
		}
	}
	if changed, _ := Add(path, h1); changed {
		t.Error("adding the same line again changed the file")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("trust file mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := Read(path)
	if err != nil || len(got) != 2 || got[0] != h1 || got[1] != h2 {
		t.Fatalf("read %+v %v", got, err)
	}
	if _, ok := f.Key("h2"); !ok {
		t.Fatal("h2 not trusted")
	}
	// a new key for h2: same size, so only the inode tells
	h2b := line(t, "h2")
	if _, err := Add(path, h2b); err != nil {
		t.Fatal(err)
	}
	if k, _ := f.Key("h2"); Line("h2", k) != h2b.Host+" "+h2b.Key {
		t.Error("the replaced key of h2 was not seen")
	}
	if was, err := Remove(path, "h2"); err != nil || !was {
		t.Fatalf("remove: %v %v", was, err)
	}
	if _, ok := f.Key("h2"); ok {
		t.Error("h2 still trusted after removal")
	}
	if was, _ := Remove(path, "h2"); was {
		t.Error("removing an absent host reported it there")
	}
}

// A broken line distrusts everyone and says where; bad input is refused.
func TestTrustFileRefusesBadLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trust")
	h1 := line(t, "h1")
	if err := os.WriteFile(path, []byte(h1.Host+" "+h1.Key+"\nh2 not-a-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "trust:2:") {
		t.Errorf("read of a broken file: %v", err)
	}
	f := Open(path)
	if _, err := f.Keys(); err == nil || f.Count() != 0 {
		t.Errorf("a broken file trusts %d hosts (err %v)", f.Count(), err)
	}
	for _, bad := range []string{"h1", "h1 a b", "h.1 " + h1.Key, "-h " + h1.Key, "h1 " + h1.Key[:40]} {
		if _, err := ParseLine(bad); err == nil {
			t.Errorf("%q accepted as a trust line", bad)
		}
	}
}
