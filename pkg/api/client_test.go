package api

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// TestShortResponseMatches: each member CallShort decodes is Response's,
// same name, type and tag, so both read a frame the same way.
func TestShortResponseMatches(t *testing.T) {
	full := reflect.TypeOf(Response{})
	short := reflect.TypeOf(shortResponse{})
	for i := 0; i < short.NumField(); i++ {
		s := short.Field(i)
		f, ok := full.FieldByName(s.Name)
		if !ok {
			t.Errorf("shortResponse.%s is not in Response", s.Name)
			continue
		}
		if f.Type != s.Type || f.Tag != s.Tag {
			t.Errorf("shortResponse.%s is %s %q, Response's %s %q", s.Name, s.Type, s.Tag, f.Type, f.Tag)
		}
	}
}

// listen returns a unix socket in a fresh folder, the peer of one
// connection at a time.
func listen(t *testing.T) (string, net.Listener) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gw.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return path, l
}

// TestConnErrorsReadAsNet: the client's connection words its failures as a
// net.Conn on the same socket does (a timed-out read, a write to a closed
// peer, a read after Close), and keeps them comparable with errors.Is.
func TestConnErrorsReadAsNet(t *testing.T) {
	path, l := listen(t)
	type conn interface {
		Read([]byte) (int, error)
		Write([]byte) (int, error)
		SetReadDeadline(time.Time) error
		Close() error
	}
	failures := func(c conn) []error {
		peer, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		var errs []error
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		errs = append(errs, err)
		peer.Close()
		c.SetReadDeadline(time.Time{})
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("read from a closed peer: no error")
		}
		_, err = c.Write([]byte("x"))
		errs = append(errs, err)
		c.Close()
		_, err = c.Read(make([]byte, 1))
		return append(errs, err)
	}
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	want := failures(nc)
	uc, err := dialUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	got := failures(uc)
	for i := range want {
		if got[i] == nil || got[i].Error() != want[i].Error() {
			t.Errorf("failure %d: %v, net's %v", i, got[i], want[i])
		}
	}
	if !errors.Is(got[0], os.ErrDeadlineExceeded) {
		t.Errorf("timed-out read %v is not os.ErrDeadlineExceeded", got[0])
	}
}

// TestDialFailures: no socket is "no gateway" (69), naming the socket as
// net.Dial did; a folder in its place fails to connect the same way.
func TestDialFailures(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.sock")
	_, err := Dial(missing)
	if fault.CodeOf(err) != fault.Unavailable || fault.KindOf(err) != fault.KindNoGateway {
		t.Fatalf("missing socket: %v (code %d kind %q)", err, fault.CodeOf(err), fault.KindOf(err))
	}
	for _, path := range []string{missing, dir} {
		_, nerr := net.Dial("unix", path)
		_, uerr := dialUnix(path)
		if nerr == nil || uerr == nil || uerr.Error() != nerr.Error() {
			t.Errorf("dial %s: %v, net's %v", path, uerr, nerr)
		}
	}
}
