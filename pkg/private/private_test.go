package private

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

func TestDir(t *testing.T) {
	base := t.TempDir()
	ok := filepath.Join(base, "ok")
	if err := MakeDir(ok); err != nil {
		t.Fatalf("MakeDir: %v", err)
	}
	if fi, _ := os.Stat(ok); fi.Mode().Perm() != 0o700 {
		t.Errorf("made %v, want 0700", fi.Mode().Perm())
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	err := MakeDir(open)
	if fault.KindOf(err) != fault.KindNotPrivate || fault.CodeOf(err) != fault.Refused ||
		!strings.Contains(err.Error(), "may be written by others") || !strings.Contains(err.Error(), "mode 0777") ||
		fault.HintOf(err) != "chmod 700 "+open {
		t.Errorf("a folder others may write: %v (hint %q)", err, fault.HintOf(err))
	}
	if err := Dir(filepath.Join(base, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing folder: %v, want ErrNotExist", err)
	}
	// a link to a private folder of this user's is judged by the folder
	link := filepath.Join(base, "link")
	os.Symlink(ok, link)
	if err := Dir(link); err != nil {
		t.Errorf("a link to a private folder: %v", err)
	}
	if os.Getuid() == 0 {
		other := filepath.Join(base, "other")
		os.Mkdir(other, 0o700)
		os.Chown(other, 65534, 65534)
		if err := Dir(other); fault.KindOf(err) != fault.KindNotPrivate || !strings.Contains(err.Error(), "belongs to another user") ||
			!strings.Contains(err.Error(), "uid 65534") {
			t.Errorf("another user's folder: %v", err)
		}
	}
}

func TestNoWriteThroughLinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	link := filepath.Join(dir, "gw.lock")
	os.Symlink(victim, link)
	if f, err := OpenFile(link, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600); err == nil {
		f.Close()
		t.Fatal("opened a link")
	} else if fault.KindOf(err) != fault.KindNotPrivate || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Errorf("a link: %v", err)
	}
	// WriteFile replaces the link, never writes through it
	if err := WriteFile(link, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
	fi, _ := os.Lstat(link)
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("after WriteFile: %v, want a regular 0600 file", fi.Mode())
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
	// ReadFile and CheckFile refuse a link too
	os.Remove(link)
	os.Symlink(victim, link)
	if _, err := ReadFile("host key", link, true, 100); !errors.Is(err, syscall.ELOOP) && fault.KindOf(err) != fault.KindNotPrivate {
		t.Errorf("ReadFile of a link: %v", err)
	}
	if err := CheckFile("host key", link, true); fault.KindOf(err) != fault.KindNotPrivate {
		t.Errorf("CheckFile of a link: %v", err)
	}
}

func TestReadFileModes(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("x"), 0o600)
	for _, c := range []struct {
		mode   os.FileMode
		secret bool
		want   string // "" = read
	}{
		{0o600, true, ""},
		{0o644, true, "may be read by others"},
		{0o620, true, "may be written by others"},
		{0o644, false, ""},
		{0o664, false, "may be written by others"},
		{0o602, false, "may be written by others"},
	} {
		os.Chmod(p, c.mode)
		b, err := ReadFile("trust file", p, c.secret, 100)
		switch {
		case c.want == "" && (err != nil || string(b) != "x"):
			t.Errorf("mode %v secret %v: %q, %v", c.mode, c.secret, b, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("mode %v secret %v: %v, want %q", c.mode, c.secret, err, c.want)
		}
	}
}

// Prune removes old regular files only, never through a link: not the
// target of a link inside, not the files of a folder a link at dir points
// to; fresh files stay; a missing folder is nothing to do.
func TestPrune(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "d")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{dir, outside, filepath.Join(dir, "sub")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-48 * time.Hour)
	write := func(path string, when time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, when, when); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "old1"), old)
	write(filepath.Join(dir, ".old.tmp-1"), old)
	write(filepath.Join(dir, "fresh"), time.Now())
	write(filepath.Join(dir, "sub", "old-in-sub"), old)
	write(filepath.Join(outside, "victim"), old)
	os.Symlink(filepath.Join(outside, "victim"), filepath.Join(dir, "link"))
	os.Chtimes(filepath.Join(dir, "sub"), old, old)

	n, err := Prune(dir, time.Now().Add(-24*time.Hour), 100)
	if err != nil || n != 2 {
		t.Fatalf("Prune: %d removed, %v; want 2", n, err)
	}
	for _, gone := range []string{"old1", ".old.tmp-1"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not removed: %v", gone, err)
		}
	}
	for _, kept := range []string{filepath.Join(dir, "fresh"), filepath.Join(dir, "sub", "old-in-sub"), filepath.Join(dir, "link"), filepath.Join(outside, "victim")} {
		if _, err := os.Lstat(kept); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}

	// a link at dir itself: refused, the folder it names untouched
	link := filepath.Join(base, "linkdir")
	os.Symlink(outside, link)
	if n, err := Prune(link, time.Now(), 100); n != 0 || fault.KindOf(err) != fault.KindNotPrivate || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Prune through a link: %d, %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "victim")); err != nil {
		t.Errorf("the victim went: %v", err)
	}
	if n, err := Prune(filepath.Join(base, "missing"), time.Now(), 100); n != 0 || err != nil {
		t.Errorf("a missing folder: %d, %v", n, err)
	}

	// bounded: at most max entries looked at
	many := filepath.Join(base, "many")
	os.Mkdir(many, 0o700)
	for i := 0; i < 10; i++ {
		write(filepath.Join(many, fmt.Sprint(i)), old)
	}
	if n, err := Prune(many, time.Now(), 4); n != 4 || err != nil {
		t.Errorf("Prune with max 4: %d, %v", n, err)
	}
}
