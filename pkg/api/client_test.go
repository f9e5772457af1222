package api

import (
	"net"
	"path/filepath"
	"reflect"
	"testing"

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

// TestDialFailures: no socket is "no gateway" (69); a folder in its place
// fails to connect, unavailable too.
func TestDialFailures(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.sock")
	_, err := Dial(missing)
	if fault.CodeOf(err) != fault.Unavailable || fault.KindOf(err) != fault.KindNoGateway {
		t.Fatalf("missing socket: %v (code %d kind %q)", err, fault.CodeOf(err), fault.KindOf(err))
	}
	if _, err := Dial(dir); fault.CodeOf(err) != fault.Unavailable {
		t.Fatalf("a folder in the socket's place: %v (code %d)", err, fault.CodeOf(err))
	}
}
