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
)

// Client is one connection to the local gateway.
type Client struct {
	conn  net.Conn
	r     *bufio.Reader
	Hello Hello
	Token string // sent with every request
}

// Dial connects to the gateway at socket and says hello. A missing or dead
// socket is fault.Unavailable with a hint naming the command that starts a
// gateway.
func Dial(socket string) (*Client, error) {
	conn, err := net.DialTimeout("unix", socket, 2*time.Second)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, fault.New(fault.Unavailable, fault.KindNoGateway, "no gateway running at %s", socket).
				WithHint("start one with: fleet-gw run")
		}
		if errors.Is(err, os.ErrPermission) {
			return nil, fault.New(fault.Refused, fault.KindPeer, "the gateway at %s belongs to another user", socket).
				WithHint("run as the gateway's user, or start your own: fleet-gw run")
		}
		return nil, fault.Wrap(fault.Unavailable, fault.KindNoGateway, err, "cannot reach the gateway at %s", socket).
			WithHint("start one with: fleet-gw run")
	}
	c := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	resp, err := c.Call(&Request{Op: OpHello, Proto: Proto})
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

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and reads one response. A gateway error comes back
// as a *fault.Error.
func (c *Client) Call(req *Request) (*Response, error) {
	if req.Token == "" {
		req.Token = c.Token
	}
	if err := WriteFrame(c.conn, req); err != nil {
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
func (c *Client) Send(req *Request) error {
	if req.Token == "" {
		req.Token = c.Token
	}
	if err := WriteFrame(c.conn, req); err != nil {
		return c.lost(err)
	}
	return nil
}

// Read reads one response frame.
func (c *Client) Read() (*Response, error) {
	data, err := ReadFrame(c.r, 1<<30)
	if err != nil {
		return nil, c.lost(err)
	}
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, fault.Wrap(fault.Unavailable, fault.KindProtocol, err, "bad response from the gateway")
	}
	if resp.Error != nil {
		return nil, resp.Error.Fault()
	}
	return &resp, nil
}

func (c *Client) lost(err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return err
	}
	return fault.Wrap(fault.Unavailable, fault.KindNoGateway, err, "lost the gateway").
		WithHint("check that fleet-gw is still running")
}
