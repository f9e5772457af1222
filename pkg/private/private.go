// Package private is how fleet touches its state folder: a folder and
// files this user owns and nobody else may write, opened without following
// a link, and written through a new file renamed into place.
//
// The state folder holds what makes a host itself: its signing key, its
// trust file, its entities' credentials, its store and its audit log. A
// folder another user made (a shared /tmp, a /var/lib set up carelessly)
// or may write lets that user plant a key of theirs, a trust line for
// their host, or a link that turns the gateway's next write onto a file
// of the victim's. So every command and the gateway refuse a folder that
// is not this user's, or that group or others may write (Dir); every file
// read for a key, a trust or a credential is checked the same way
// (ReadFile); every file written is opened with O_NOFOLLOW (OpenFile), a
// whole file is written through an exclusive temporary file and a rename
// (WriteFile), so a planted link is an error or is replaced, never written
// through.
package private

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	"golang.org/x/sys/unix"
)

// Error is a path refused for its owner or mode: a fault.Refused (77)
// naming the path, its owner and its mode, with the fix.
func refuse(what, path string, st *syscall.Stat_t, why, fix string) error {
	return fault.New(fault.Refused, fault.KindNotPrivate, "%s %s %s (owner %s, mode %04o)",
		what, path, why, Owner(st.Uid), st.Mode&0o7777).WithHint("%s", fix)
}

// Owner names a uid as "name (uid N)", or "uid N" when it has no name.
func Owner(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username + " (uid " + id + ")"
	}
	return "uid " + id
}

// Dir refuses dir unless it is a folder of this user's that group and
// others may not write. It follows a link at dir itself (a state folder
// may be a link to another disk) but judges the folder it reaches. A
// missing folder is the os error (errors.Is os.ErrNotExist).
func Dir(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFDIR:
		return fault.New(fault.Usage, fault.KindStateDir, "state folder %s is not a folder", dir).
			WithHint("choose another with --state-dir or FLEET_STATE_DIR")
	case int(st.Uid) != os.Getuid():
		return refuse("state folder", dir, &st, "belongs to another user: whoever owns it can plant a host key, a trust line or a link in it",
			"use a folder of your own: --state-dir, FLEET_STATE_DIR, or remove it and let fleet make it")
	case st.Mode&0o022 != 0:
		return refuse("state folder", dir, &st, "may be written by others: they could plant a host key, a trust line or a link in it",
			"chmod 700 "+dir)
	}
	return nil
}

// MakeDir makes dir (0700, and any missing parent 0700) unless it exists,
// then checks it as Dir does: a folder someone else made first, at a
// predictable path in a shared place, is refused, never adopted.
func MakeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return Dir(dir)
}

// SocketDir refuses the folder of a socket the gateway listens on when
// others may write it and it is not sticky: they could swap the socket
// for one of theirs. (A sticky shared folder such as /tmp is allowed:
// nobody else may remove or rename the gateway's socket there, and the
// commands check who serves the socket they dial.)
func SocketDir(dir string) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if st.Mode&0o022 != 0 && st.Mode&syscall.S_ISVTX == 0 {
		return refuse("socket folder", dir, &st, "may be written by others: they could put a socket of theirs in the gateway's place",
			"chmod 700 "+dir+", or choose another socket with --socket or FLEET_SOCKET")
	}
	return nil
}

// OpenFile opens path as os.OpenFile does, never through a link at path
// itself: a planted link is an error (ELOOP), whatever it points to.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	return f, isLink(err, "", path, "writes")
}

// isLink words an open refused by O_NOFOLLOW (ELOOP: the file what
// names at path is a link) as the refusal; any other error is returned
// as it is.
func isLink(err error, what, path, verb string) error {
	if errors.Is(err, syscall.ELOOP) {
		return fault.New(fault.Refused, fault.KindNotPrivate,
			"%s is a symbolic link: fleet %s its own files only, never through a link", strings.TrimSpace(what+" "+path), verb).
			WithHint("remove the link (rm %s) and look at who planted it", path)
	}
	return err
}

// WriteFile replaces path with data through a new file of mode perm,
// created exclusively beside it and renamed into place, so a link or a
// file at path is replaced, never written through, and a reader sees the
// old file or the whole new one.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// ReadFile reads path, a file fleet trusts (a key, a trust file, a
// credential, a config file), refusing one that is a link, not this
// user's (or root's, unless secret), or that group or others may write;
// secret also refuses one they may read. At most max bytes are read.
func ReadFile(what, path string, secret bool, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, isLink(err, what, path, "reads")
	}
	defer f.Close()
	if err := Check(what, f, secret); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// CheckFile refuses the file at path as ReadFile would, without reading
// it; a missing file is the os error.
func CheckFile(what, path string, secret bool) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return isLink(err, what, path, "reads")
	}
	defer f.Close()
	return Check(what, f, secret)
}

// Check judges the file f has open (not the path again, which could have
// changed since) as ReadFile does: for a file that may be reached through
// a link of the user's own (a config file kept with their dotfiles).
func Check(what string, f *os.File, secret bool) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	path := f.Name()
	switch {
	case !fi.Mode().IsRegular():
		return fault.New(fault.Refused, fault.KindNotPrivate, "%s %s is not a regular file", what, path).
			WithHint("remove it and let fleet make it again")
	case int(st.Uid) != os.Getuid() && (secret || st.Uid != 0):
		// root's files are trusted to be read (a trust file an
		// administrator keeps in /etc), never a secret of root's
		return refuse(what, path, st, "belongs to another user", fmt.Sprintf("remove it, or make it yours: chown %d %s", os.Getuid(), path))
	case secret && st.Mode&0o044 != 0:
		return refuse(what, path, st, "may be read by others", "chmod 600 "+path)
	case secret && st.Mode&0o077 != 0:
		return refuse(what, path, st, "may be written by others", "chmod 600 "+path)
	case st.Mode&0o022 != 0:
		return refuse(what, path, st, "may be written by others", "chmod go-w "+path)
	}
	return nil
}

// Prune removes the regular files directly in dir last changed before
// cutoff, and returns how many it removed. It never works through a link:
// dir is opened without following one (a link there is refused, as
// OpenFile refuses one) and must be a folder of this user's; each entry is
// looked at and removed relative to that open folder, so a folder swapped
// in meanwhile is not touched, and a link, a folder or anything else
// inside is left alone. Its work is bounded: at most max entries are
// looked at. A missing dir is nothing to do.
func Prune(dir string, cutoff time.Time, max int) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return 0, nil
	case errors.Is(err, unix.ELOOP):
		return 0, isLink(err, "folder", dir, "prunes")
	case errors.Is(err, unix.ENOTDIR):
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			return 0, isLink(unix.ELOOP, "folder", dir, "prunes")
		}
		return 0, fault.New(fault.Refused, fault.KindNotPrivate, "%s is not a folder", dir).
			WithHint("remove it and let fleet make it again")
	case err != nil:
		return 0, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if int(st.Uid) != os.Getuid() {
		return 0, fault.New(fault.Refused, fault.KindNotPrivate, "folder %s belongs to %s: fleet prunes its own files only", dir, Owner(st.Uid)).
			WithHint("remove it and let fleet make it again")
	}
	names, err := f.Readdirnames(max)
	if err != nil && err != io.EOF {
		return 0, &os.PathError{Op: "readdir", Path: dir, Err: err}
	}
	removed := 0
	for _, name := range names {
		var fst unix.Stat_t
		if unix.Fstatat(fd, name, &fst, unix.AT_SYMLINK_NOFOLLOW) != nil ||
			fst.Mode&unix.S_IFMT != unix.S_IFREG || !time.Unix(fst.Mtim.Unix()).Before(cutoff) {
			continue
		}
		if unix.Unlinkat(fd, name, 0) == nil {
			removed++
		}
	}
	return removed, nil
}
