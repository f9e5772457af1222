package gateway_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/gateway"
)

// runOnce runs a gateway on g's configuration that is expected not to
// start, and returns what Run returned (nil if it started after all: then
// it is stopped at once).
func runOnce(g *testGW) error {
	g.t.Helper()
	gw := gateway.New(g.Cfg, slog.New(slog.NewJSONHandler(g.logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-gw.Ready():
		cancel()
		<-done
		return nil
	case <-time.After(30 * time.Second):
		g.t.Fatal("Run neither failed nor started within 30s")
		return nil
	}
}

// rawConn is a socket connection below pkg/api's client, for what that
// client never sends.
type rawConn struct {
	t testing.TB
	c net.Conn
}

func dialRaw(t testing.TB, g *testGW) *rawConn {
	t.Helper()
	c, err := net.Dial("unix", g.Cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c}
}

func (r *rawConn) write(v any) {
	r.t.Helper()
	if err := api.WriteFrame(r.c, v); err != nil {
		r.t.Fatal(err)
	}
}

// writeBytes writes data as one frame's body.
func (r *rawConn) writeBytes(data []byte) {
	r.t.Helper()
	buf := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
	if _, err := r.c.Write(append(buf, data...)); err != nil {
		r.t.Fatal(err)
	}
}

// read returns the next response frame.
func (r *rawConn) read() *api.Response {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	data, err := api.ReadFrame(r.c, 1<<20)
	if err != nil {
		r.t.Fatalf("reading a response: %v", err)
	}
	var resp api.Response
	if err := json.Unmarshal(data, &resp); err != nil {
		r.t.Fatal(err)
	}
	return &resp
}

// closed reports whether the gateway closed the connection.
func (r *rawConn) closed() bool {
	r.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, err := api.ReadFrame(r.c, 1<<20)
	return err != nil
}

func wantError(t testing.TB, resp *api.Response, exit int, kind fault.Kind) {
	t.Helper()
	if resp.Error == nil || resp.Error.Exit != exit || (kind != "" && resp.Error.Kind != kind) {
		t.Fatalf("want error %d %s, got %+v (error %+v)", exit, kind, resp, resp.Error)
	}
}

// The socket protocol: hello first, in this release's version; malformed
// frames are answered with 65 and the connection is closed.
func TestLocalProtocol(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)

	r := dialRaw(t, g)
	r.write(&api.WhoamiRequest{})
	wantError(t, r.read(), 65, fault.KindProtocol)
	if !r.closed() {
		t.Error("a connection without hello stays open")
	}

	r = dialRaw(t, g)
	r.write(&api.HelloRequest{Proto: api.Proto + 1})
	wantError(t, r.read(), 65, fault.KindProtocol)
	if !r.closed() {
		t.Error("a connection of another protocol version stays open")
	}

	r = dialRaw(t, g)
	r.write(&api.HelloRequest{Proto: api.Proto})
	if h := r.read(); !h.OK || h.Hello == nil || h.Hello.Host != "h1" || h.Hello.MaxBody != g.Cfg.MaxBody || h.Hello.Pid != os.Getpid() {
		t.Fatalf("hello %+v", h)
	}
	r.write(&api.AckRequest{})
	wantError(t, r.read(), 65, fault.KindProtocol) // ack outside recv
	if !r.closed() {
		t.Error("a connection that sent a protocol error stays open")
	}

	for name, frame := range map[string][]byte{
		"invalid UTF-8": []byte("{\"op\":\"hello\",\"token\":\"\xff\"}"),
		"not JSON":      []byte("hello"),
		"no op":         []byte(`{"proto":1}`),
	} {
		r = dialRaw(t, g)
		r.writeBytes(frame)
		wantError(t, r.read(), 65, "")
		if !r.closed() {
			t.Errorf("%s: connection stays open", name)
		}
	}
	g.waitLog(`"msg":"bad frame from client: closing its connection"`)

	r = dialRaw(t, g)
	r.c.Write([]byte{0xff, 0xff, 0xff, 0xff}) // a frame over the limit
	wantError(t, r.read(), 65, fault.KindBadFrame)
}

// A request frame begun and not finished within frame-timeout is refused
// and its connection closed; an idle connection between frames is not.
func TestLocalFrameTimeout(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"frame-timeout": "100ms"})
	alice := g.join("alice")
	idle := g.dial(alice.Token)
	r := dialRaw(t, g)
	r.write(&api.HelloRequest{Proto: api.Proto})
	r.read()
	r.c.Write([]byte{0, 0, 0, 10, '{'}) // 1 of 10 bytes, then nothing
	resp := r.read()
	wantError(t, resp, 65, fault.KindBadFrame)
	if !strings.Contains(resp.Error.Message, "frame-timeout") {
		t.Errorf("stalled frame: %+v", resp.Error)
	}
	g.waitLog(`"msg":"clients stalled in the middle of a request: closing their connections"`)
	// the idle connection, older than the stall, still works
	if resp, err := idle.Call(&api.WhoamiRequest{}); err != nil || resp.Entity.Name != "alice" {
		t.Fatalf("idle connection: %+v %v", resp, err)
	}
	g.waitLog(`"msg":"clients stalled in the middle of a request: closing their connections: burst over"`)
}

// Over max-connections, a connection gets one 75 and is closed; the cap
// frees up as connections end. The burst is logged once, then its end.
func TestLocalConnectionCap(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"max-connections": "2"})
	c1 := g.dial("")
	g.dial("")
	for range 3 {
		_, err := api.Dial(g.Cfg.Socket)
		if fe := faultOf(t, err, fault.TempFail); fe.Kind != "too_many_connections" {
			t.Fatalf("over the cap: %v (%s)", fe, fe.Kind)
		}
	}
	if n := g.logCount(`"msg":"connection cap reached: refusing new connections"`); n != 1 {
		t.Errorf("cap logged %d times in one burst, want 1", n)
	}
	c1.Close()
	eventually(t, "a connection once one ended", func() error {
		c, err := api.Dial(g.Cfg.Socket)
		if err == nil {
			c.Close()
		}
		return err
	})
	// one line for the whole burst: 3 refusals, and any the loop above met
	const over = `"msg":"connection cap reached: refusing new connections: burst over","host":"h1","count":`
	g.waitLog(over)
	logs := g.logs.String()
	n, _ := strconv.Atoi(strings.TrimRightFunc(strings.SplitN(logs[strings.Index(logs, over)+len(over):], ",", 2)[0], func(r rune) bool { return r < '0' || r > '9' }))
	if n < 3 {
		t.Errorf("burst over with count %d, want at least the 3 refused above", n)
	}
}

// A gateway does not start where another holds the socket, on a state
// folder of another host, or where the state folder cannot be made.
func TestLocalGatewayRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "h1", nil)

	taken := &testGW{t: t, Host: "h2", Cfg: newConfig(t, dir, "h2", settings{"socket": g.Cfg.Socket}), logs: &syncBuffer{}}
	if err := runOnce(taken); codeOf(err) != fault.Conflict || fault.KindOf(err) != fault.KindGatewayLocked {
		t.Errorf("on a socket in use: %v", err)
	}
	// the running gateway kept its socket
	if _, err := g.call("", &api.RosterRequest{}); err != nil {
		t.Fatalf("the first gateway after the refusal: %v", err)
	}

	g.stop()
	wrongHost := &testGW{t: t, Host: "h3", Cfg: newConfig(t, dir, "h3", settings{"state-dir": g.Cfg.StateDir}), logs: &syncBuffer{}}
	if err := runOnce(wrongHost); codeOf(err) != fault.Usage || !strings.Contains(err.Error(), `belongs to host "h1"`) {
		t.Errorf("on another host's state folder: %v", err)
	}

	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, nil, 0o600)
	noDir := &testGW{t: t, Host: "h4", Cfg: newConfig(t, dir, "h4", settings{"state-dir": filepath.Join(file, "state")}), logs: &syncBuffer{}}
	if err := runOnce(noDir); codeOf(err) != fault.CantCreate {
		t.Errorf("state folder under a file: %v", err)
	}
}

// Connections that never send a frame cannot keep a client out: at the
// cap, a new connection takes the place of the oldest that has sent
// nothing (which hears why), and a client that said hello keeps its
// place. Over a cap held by clients that spoke, the refusal names them.
func TestLocalSilentConnectionsMakeRoom(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"max-connections": "3", "frame-timeout": "1h"})
	idle := g.dial("")
	first, second := dialRaw(t, g), dialRaw(t, g) // admitted in this order
	c1 := g.dial("")                              // the cap is reached: first makes room
	wantRoomMade := func(r *rawConn, who string) {
		t.Helper()
		resp := r.read()
		wantError(t, resp, 75, fault.KindTooManyConnections)
		if !strings.Contains(resp.Error.Message, "closed to make room") {
			t.Errorf("%s: %+v", who, resp.Error)
		}
		if !r.closed() {
			t.Errorf("%s stays open", who)
		}
	}
	wantRoomMade(first, "the oldest silent connection")
	c2 := g.dial("") // then second
	wantRoomMade(second, "the other silent connection")
	g.waitLog(`"msg":"at the connection cap: closing connections that sent no request, oldest first, to admit new ones"`)
	for i, c := range []*api.Client{idle, c1, c2} {
		if _, err := c.Call(&api.RosterRequest{}); err != nil {
			t.Fatalf("client %d, after the room was made: %v", i, err)
		}
	}
	// every place is a client's now
	_, err := api.Dial(g.Cfg.Socket)
	fe := faultOf(t, err, fault.TempFail)
	if fe.Kind != fault.KindTooManyConnections || fe.Msg != "the gateway is serving its limit of 3 connections: 3 idle between requests" ||
		!strings.Contains(fe.Hint, "fleet-recv --follow") {
		t.Fatalf("over a cap held by clients: %v (%s; hint %q)", fe, fe.Kind, fe.Hint)
	}
	g.waitLog(`"holders":"3 idle between requests"`)
}

// A connection that has not sent a complete first frame within
// frame-timeout of connecting is closed, with one error frame, whether
// it sent nothing or half a frame; one that said hello may idle on.
func TestLocalSilentConnectionsTimeOut(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"frame-timeout": "200ms"})
	idle := g.dial("")
	mute, half := dialRaw(t, g), dialRaw(t, g)
	half.c.Write([]byte{0, 0, 0, 40, '{', '"'}) // 2 of 40 bytes of a hello, then nothing
	resp := mute.read()
	wantError(t, resp, 65, fault.KindBadFrame)
	if !strings.Contains(resp.Error.Message, "no complete request frame within 200ms of connecting (frame-timeout)") {
		t.Errorf("a connection that sent nothing: %+v", resp.Error)
	}
	if !mute.closed() {
		t.Error("a connection that sent nothing stays open")
	}
	wantError(t, half.read(), 65, fault.KindBadFrame) // its own frame deadline may come first
	if !half.closed() {
		t.Error("a connection that sent half a first frame stays open")
	}
	g.waitLog(`"msg":"connections sent no request within the frame timeout: closing them"`)
	if _, err := idle.Call(&api.RosterRequest{}); err != nil {
		t.Fatalf("the client that said hello, idle meanwhile: %v", err)
	}
	g.waitLog(`"msg":"connections sent no request within the frame timeout: closing them: burst over"`)
}
