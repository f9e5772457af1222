package gateway

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"golang.org/x/sys/unix"
)

// The socket: connections accepted into their slots, and each request
// handed to its verb (dispatch, server.go; the stream verbs from handle).
// A connection's framing, bounds and peer check are conn.go's.

// serve accepts connections, at most max-connections at once (slots): one
// over the cap is told so, and what holds the slots, in one error frame
// and closed.
func (g *Gateway) serve() error {
	gd := newGuard(g.cfg, g.log)
	for {
		c, err := g.ln.Accept()
		if err != nil {
			if g.runCtx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		uc := c.(*net.UnixConn)
		sl, err := gd.slots.admit(func() { uc.CloseRead() }, func() bool { return unread(uc) })
		if err != nil {
			gd.refuse(uc, err)
			continue
		}
		g.conns.Add(1)
		go func() {
			defer g.conns.Done()
			defer sl.leave()
			g.handle(uc, gd, sl)
		}()
	}
}

// unread reports whether bytes the gateway has not read yet wait on uc.
func unread(uc *net.UnixConn) bool {
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}

// handle serves one connection: a peer-credential check, hello, then
// requests until the client closes or sends something malformed.
func (g *Gateway) handle(uc *net.UnixConn, gd *guard, sl *slot) {
	defer uc.Close()
	c := &conn{c: uc, fr: newFrameReader(uc, gd.frameTimeout), gd: gd, max: api.MaxFrame(g.cfg.MaxBody)}
	if err := c.checkPeer(); err != nil {
		g.log.Warn("refused a connection", "err", err)
		c.fail(err)
		return
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-g.runCtx.Done():
			// let a request in progress finish; idle connections wake up
			c.fr.drain(time.Now().Add(g.cfg.DrainTimeout))
		case <-stop:
		}
	}()
	for {
		req, err := c.read()
		if cut := sl.spoke(); cut != nil {
			// it sent no complete frame in time, or lost its place to a
			// newcomer (slots): logged once per burst there
			uc.SetWriteDeadline(time.Now().Add(time.Second))
			c.fail(cut)
			return
		}
		if err != nil {
			if errors.Is(err, io.EOF) || g.runCtx.Err() != nil {
				return
			}
			if c.stalled {
				// logged once per burst (guard.stalled); a client that
				// stalls does not read either: do not wait on it
				uc.SetWriteDeadline(time.Now().Add(time.Second))
				c.fail(err)
				return
			}
			if fault.CodeOf(err) == fault.Data {
				g.log.Warn("bad frame from client: closing its connection", "pid", c.pid, "err", err)
				c.fail(err)
			}
			return
		}
		if _, hello := req.(*api.HelloRequest); !c.good && !hello {
			c.fail(fault.New(fault.Data, fault.KindProtocol, "first request must be hello"))
			return
		}
		if holdsOpen(req) {
			sl.set(holdStream) // its place is kept however long it waits
		} else {
			sl.set(holdBusy)
		}
		switch req := req.(type) {
		case *api.RecvRequest:
			g.recv(c, req)
			return
		case *api.AskRequest:
			g.ask(c, req)
			return
		case *api.SendRequest:
			if req.Wait {
				g.sendWait(c, req)
				return
			}
		case *api.WaitReplyRequest:
			g.waitReply(c, req)
			return
		case *api.WatchRequest: // watch.go
			own := ""
			if req.Text { // the text of its own inbox's mail: the caller's credential
				b, err := g.caller(req.Token)
				if err != nil {
					c.reply(&api.Response{Error: api.FromFault(err)})
					return
				}
				own = b.snapshot().Gid
			}
			g.watch.Serve(c, g.runCtx.Done(), own)
			return
		}
		resp, err := g.dispatch(c, req)
		sl.set(holdIdle)
		if err != nil {
			if resp != nil && resp.Sent != nil {
				// done in part (a broadcast delivered here, not
				// published): the client hears what was sent with
				// the failure, and a retry can be scoped
				resp.Error = api.FromFault(err)
				if c.reply(resp) != nil {
					return
				}
				continue
			}
			if c.fail(err) != nil {
				return
			}
			if fault.KindOf(err) == fault.KindProtocol {
				return
			}
			continue
		}
		resp.OK = true
		if c.reply(resp) != nil {
			return
		}
	}
}

// holdsOpen reports whether req holds its connection for as long as it waits:
// a stream, or a wait for an answer or a state.
func holdsOpen(req api.Request) bool {
	switch req := req.(type) {
	case *api.RecvRequest, *api.AskRequest, *api.WaitReplyRequest, *api.WaitRequest, *api.WatchRequest:
		return true
	case *api.SendRequest:
		return req.Wait
	}
	return false
}
