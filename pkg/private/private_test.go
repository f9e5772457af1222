package private

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
