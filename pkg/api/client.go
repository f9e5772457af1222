package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/private"
)

// Client is one connection to the local gateway.
type Client struct {
	conn  *net.UnixConn
	r     *bufio.Reader
	Hello Hello
	Token string // sent with every request
}

// Dial connects to the gateway at socket and says hello. A missing or dead
// socket is fault.Unavailable with a hint naming the command that starts a
// gateway.
func Dial(socket string) (*Client, error) {
	if err := checkServer(socket, -1); err != nil {
		return nil, err
	}
	conn, err := dialUnix(socket)
	if fe := (*fault.Error)(nil); errors.As(err, &fe) {
		return nil, fe // served by another user
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, fault.New(fault.Unavailable, fault.KindNoGateway, "no gateway running at %s", socket).
				WithHint("start one with: fleet-gw run")
		}
		if errors.Is(err, os.ErrPermission) {
			if !othersSocket(socket) {
				// the socket is this user's: what refused is the process's
				// own confinement (an agent CLI's sandbox: seccomp, Landlock)
				return nil, fault.Wrap(fault.Refused, fault.KindSandboxed, err, "this process may not connect to the gateway's socket %s: a sandbox refused it", socket).
					WithHint("fleet commands cannot run inside an agent's sandbox: let the agent run them unsandboxed (Codex: sandbox_mode = \"danger-full-access\"), or from its hooks, which run outside it")
			}
			return nil, fault.New(fault.Refused, fault.KindPeer, "the gateway at %s belongs to another user", socket).
				WithHint("run as the gateway's user, or start your own: fleet-gw run")
		}
		return nil, fault.Wrap(fault.Unavailable, fault.KindNoGateway, err, "cannot reach the gateway at %s", socket).
			WithHint("start one with: fleet-gw run")
	}
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	resp, err := c.Call(&HelloRequest{Proto: Proto})
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.Hello == nil {
		conn.Close()
		return nil, fault.New(fault.Unavailable, fault.KindProtocol, "gateway at %s sent no greeting", socket)
	}
	c.Hello = *resp.Hello
	return c, nil
}

// dialUnix connects to the gateway's socket and checks who listens on
// it. It was once written without the net package (a short command that
// linked net paid for it at every start); fleet-send links net anyway
// since envelope takes its UUIDv7s from github.com/google/uuid, and the
// hand-written dial was no faster beside it in the same runs
// (scripts/bench-libs.sh, 2026-12-02: net.Dial and the same peer check
// took 0.81-1.08x its time, medians of three sets of 3-5 runs, each
// ~30-60 µs), so this is net.Dial.
func dialUnix(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// who listens is what counts, whatever the file's owner says now:
	// the peer's credentials, from the kernel
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = checkServer(path, int(fd)) }); err != nil {
		cerr = err
	}
	if cerr != nil {
		c.Close()
		return nil, cerr
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and reads one response. A gateway error comes back
// as a *fault.Error.
func (c *Client) Call(req Request) (*Response, error) {
	if err := c.write(req); err != nil {
		// the gateway may have said why before it closed (a refused peer)
		c.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, rerr := c.Read(); fault.KindOf(rerr) != fault.KindNoGateway && rerr != nil {
			return nil, rerr
		}
		return nil, c.lost(err)
	}
	return c.Read()
}

// Send writes a request without reading a response (recv's acks are
// answered by the next batch).
func (c *Client) Send(req Request) error {
	if err := c.write(req); err != nil {
		return c.lost(err)
	}
	return nil
}

// write sends req with the client's credential unless it carries its
// own (WriteFrame fills in its op).
func (c *Client) write(req Request) error {
	if h := req.head(); h.Token == "" {
		h.Token = c.Token
	}
	return WriteFrame(c.conn, req)
}

// Read reads one response frame.
func (c *Client) Read() (*Response, error) {
	var resp Response
	if err := c.readInto(&resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		fe := resp.Error.Fault()
		return partial(&resp), fe
	}
	return &resp, nil
}

// partial is the answer that came with a failure when it tells what was
// done all the same (a broadcast delivered on this host, not published):
// resp when it names a sent message, else nil, as for any failure.
func partial(resp *Response) *Response {
	if resp.Sent == nil {
		return nil
	}
	resp.Error = nil
	return resp
}

func (c *Client) readInto(v any) error {
	data, err := ReadFrame(c.r, 1<<30)
	if err != nil {
		return c.lost(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fault.Wrap(fault.Unavailable, fault.KindProtocol, err, "bad response from the gateway")
	}
	return nil
}

func (c *Client) lost(err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return err
	}
	return fault.Wrap(fault.Unavailable, fault.KindNoGateway, err, "lost the gateway").
		WithHint("check that fleet-gw is still running")
}

// checkServer refuses a gateway socket that is not this user's, before a
// credential or a byte of text is sent: a socket in a shared state folder
// or /tmp could be anyone's, and root's commands could connect to it. With
// fd < 0 it judges the file at path (a missing one is left to the dial);
// with a connected fd, the uid of the process that listens (SO_PEERCRED).
func checkServer(path string, fd int) error {
	var uid uint32
	if fd < 0 {
		var st syscall.Stat_t
		if err := syscall.Stat(path, &st); err != nil {
			return nil
		}
		uid = st.Uid
	} else {
		cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err != nil {
			return fault.Wrap(fault.Refused, fault.KindPeer, err, "cannot tell who serves the socket %s", path)
		}
		uid = cred.Uid
	}
	if int(uid) == os.Getuid() {
		return nil
	}
	what := "belongs to"
	if fd >= 0 {
		what = "is served by a process of"
	}
	return fault.New(fault.Refused, fault.KindPeer, "the socket %s %s %s, not this user: it is not your gateway, and nothing was sent to it",
		path, what, private.Owner(uid)).
		WithHint("run as that user, or start a gateway of your own (fleet-gw run) and point at it with FLEET_SOCKET")
}

// othersSocket says whether the socket at path is another user's (or
// cannot be looked at, which is the same to the caller).
func othersSocket(path string) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return !errors.Is(err, syscall.ENOENT)
	}
	return int(st.Uid) != os.Getuid()
}
