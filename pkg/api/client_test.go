package api

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
)

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

// TestDialOwnSocket: a socket this user listens on passes the peer check
// (SO_PEERCRED, through net's connection) and connects.
func TestDialOwnSocket(t *testing.T) {
	path, l := listen(t)
	c, err := dialUnix(path)
	if err != nil {
		t.Fatalf("dial own socket: %v", err)
	}
	defer c.Close()
	peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	peer.Close()
}
