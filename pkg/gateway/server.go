package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"runtime/debug"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet/internal/jsonw"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
	"github.com/fleetd/fleet/pkg/version"
	"golang.org/x/sys/unix"
)

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

// guard holds the socket's bounds on local resources: the connection
// slots, the frame deadline, and the floods a misbehaving client can
// cause, each logged once per burst (a WARN when it starts, an INFO with
// the count when it is over).
type guard struct {
	slots        *slots
	frameTimeout time.Duration

	refused *flood // connections over the cap
	stalled *flood // frames begun and not finished in time
	silent  *flood // connections that sent no complete frame in time
	evicted *flood // connections that had sent nothing, cut to make room at the cap
}

// floodQuiet is how long a burst of refusals or stalled frames must stay
// quiet to be over.
const floodQuiet = 2 * time.Second

func newGuard(cfg *config.Config, log *slog.Logger) *guard {
	gd := &guard{
		slots:        newSlots(cfg.MaxConnections, cfg.FrameTimeout),
		frameTimeout: cfg.FrameTimeout,
		refused: &flood{log: log, quiet: floodQuiet,
			msg: "connection cap reached: refusing new connections", args: []any{"max_connections", cfg.MaxConnections}},
		stalled: &flood{log: log, quiet: floodQuiet,
			msg: "clients stalled in the middle of a request: closing their connections", args: []any{"frame_timeout", cfg.FrameTimeout},
			// what their frames held is garbage now: hand it back to the
			// system at once rather than over the scavenger's minutes
			onEnd: debug.FreeOSMemory},
		silent: &flood{log: log, quiet: floodQuiet,
			msg: "connections sent no request within the frame timeout: closing them", args: []any{"frame_timeout", cfg.FrameTimeout}},
		evicted: &flood{log: log, quiet: floodQuiet,
			msg: "at the connection cap: closing connections that sent no request, oldest first, to admit new ones", args: []any{"max_connections", cfg.MaxConnections}},
	}
	gd.slots.onTimeout = func() { gd.silent.hit() }
	gd.slots.onEvict = func() { gd.evicted.hit() }
	return gd
}

// refuse tells a connection over the cap why, in one error frame (the
// client reads it as its hello's answer), and closes it.
func (gd *guard) refuse(uc *net.UnixConn, why error) {
	gd.refused.hit("holders", gd.slots.holders())
	uc.SetWriteDeadline(time.Now().Add(time.Second))
	api.WriteFrame(uc, &api.Response{Error: api.FromFault(why)})
	uc.Close()
}

// flood logs an event that can come by the hundred as one WARN when a
// burst of it starts and one INFO with the count once the burst has been
// quiet for quiet; then onEnd, if set, runs.
type flood struct {
	log   *slog.Logger
	msg   string
	args  []any
	quiet time.Duration
	onEnd func()

	mu   sync.Mutex
	n    int       // events in this burst; 0: none going on
	last time.Time // the latest event
}

// hit counts one event; args (the first event's) go with the WARN.
func (f *flood) hit(args ...any) {
	f.mu.Lock()
	f.n++
	f.last = time.Now()
	first := f.n == 1
	if first {
		time.AfterFunc(f.quiet, f.check)
	}
	f.mu.Unlock()
	if first {
		f.log.Warn(f.msg, append(args, f.args...)...)
	}
}

// check ends the burst once it has been quiet long enough; one check is
// pending per burst.
func (f *flood) check() {
	f.mu.Lock()
	if wait := f.quiet - time.Since(f.last); wait > 0 {
		time.AfterFunc(wait, f.check)
		f.mu.Unlock()
		return
	}
	n := f.n
	f.n = 0
	f.mu.Unlock()
	f.log.Info(f.msg+": burst over", append([]any{"count", n}, f.args...)...)
	if f.onEnd != nil {
		f.onEnd()
	}
}

// conn is one client connection.
type conn struct {
	c       *net.UnixConn
	fr      *frameReader
	gd      *guard
	max     int
	pid     int32
	good    bool // said hello
	stalled bool // a frame did not finish within the frame deadline
}

func (c *conn) reply(resp *api.Response) error {
	return api.WriteFrame(c.c, resp)
}

func (c *conn) fail(err error) error {
	return c.reply(&api.Response{Error: api.FromFault(err)})
}

// read returns the next request. A malformed, truncated or oversized frame,
// or one not finished within the frame deadline, is a fault.Data error:
// the caller replies with it and closes. At most aheadSize bytes are read
// ahead (frameReader): the buffer of a frame is the frame's own, and
// grows only as its bytes arrive.
func (c *conn) read() (*api.Request, error) {
	data, err := api.ReadFrame(c.fr, c.max)
	if c.fr.end() && errors.Is(err, os.ErrDeadlineExceeded) {
		c.stalled = true
		c.gd.stalled.hit("pid", c.pid)
		return nil, fault.New(fault.Data, fault.KindBadFrame,
			"request frame not finished within %v (frame-timeout)", c.fr.timeout)
	}
	if err != nil {
		return nil, err
	}
	if !utf8.Valid(data) {
		return nil, fault.New(fault.Data, fault.KindBadUTF8, "request is not valid UTF-8")
	}
	return decodeRequest(data)
}

// decodeRequest is api.DecodeRequest (TestDecodeRequestAsAPI), with a
// request of string and string-list fields — a send, an ack — read by a
// scanner instead of encoding/json's reflection; any other request, or
// one written otherwise than json.Marshal writes it, goes to
// api.DecodeRequest.
func decodeRequest(data []byte) (*api.Request, error) {
	var r api.Request
	sc := jsonw.NewScanner(data)
	sc.Open()
	for first := true; sc.More(first); first = false {
		var str *string
		var list *[]string
		switch sc.Key() {
		case "op":
			str = &r.Op
		case "token":
			str = &r.Token
		case "to":
			str = &r.To
		case "body":
			str = &r.Body
		case "reply_to":
			str = &r.ReplyTo
		case "name":
			str = &r.Name
		case "mode":
			str = &r.Mode
		case "tmux_target":
			str = &r.TmuxTarget
		case "exec":
			str = &r.Exec
		case "nudge":
			str = &r.Nudge
		case "group":
			str = &r.Group
		case "turn_id":
			str = &r.TurnID
		case "answer_to":
			str = &r.AnswerTo
		case "host":
			str = &r.Host
		case "profile":
			str = &r.Profile
		case "request_id":
			str = &r.RequestID
		case "target":
			str = &r.Target
		case "status":
			str = &r.Status
		case "trace_id":
			str = &r.TraceID
		case "msg_id":
			str = &r.MsgID
		case "until":
			str = &r.Until
		case "signed_by":
			str = &r.SignedBy
		case "acks":
			list = &r.Acks
		case "groups":
			list = &r.Groups
		case "add":
			list = &r.Add
		case "remove":
			list = &r.Remove
		case "msg_ids":
			list = &r.MsgIDs
		default:
			sc.Fail() // numbers, booleans, bytes, and what is not a field
		}
		switch {
		case str != nil:
			*str = sc.String()
		case list != nil:
			*list = sc.Strings()
		}
	}
	if !sc.Done() || r.Op == "" {
		return api.DecodeRequest(data)
	}
	return &r, nil
}

// frameReader reads a connection, and bounds each frame: a frame must be
// finished within frame-timeout of its first byte. A frame's first read
// takes in up to aheadSize bytes, so that an ordinary request costs one
// read system call, header and all (readAhead); nothing more is buffered. Between
// frames there is no deadline — a fleet-recv --follow or a fleet-send
// --wait waits as long as it likes — except the drain bound at shutdown,
// which applies to both. (Before its first frame is whole, a connection
// is bounded by the slots instead: it must finish that frame within
// frame-timeout of connecting.)
//
// The frame deadline is armed only when a read inside a frame would
// block: a frame that is all there when its first bytes are (nearly every
// one) costs no deadline at all. Arming one is not free: a deadline
// earlier than the poller's sleep wakes the poller thread (an eventfd
// write and a context switch), once per request.
type frameReader struct {
	c       *net.UnixConn
	raw     syscall.RawConn // for the non-blocking first try inside a frame
	timeout time.Duration

	// read ahead of the current frame (readAhead), and the buffer that
	// holds it; only the reading goroutine touches them
	ahead []byte
	buf   *[aheadSize]byte

	mu      sync.Mutex
	started time.Time // the current frame's first byte; zero between frames
	frameAt time.Time // the frame deadline, once armed; zero otherwise
	drainAt time.Time // the shutdown deadline; zero until shutdown
}

func newFrameReader(c *net.UnixConn, timeout time.Duration) *frameReader {
	r := &frameReader{c: c, timeout: timeout}
	r.raw, _ = c.SyscallConn() // nil on error: every read then arms the deadline
	return r
}

func (r *frameReader) Read(p []byte) (int, error) {
	if len(r.ahead) > 0 {
		return r.fromAhead(p), nil
	}
	r.mu.Lock()
	started := !r.started.IsZero()
	inFrame := started && r.frameAt.IsZero()
	r.mu.Unlock()
	if inFrame && len(p) > 0 {
		if n, ok := r.tryRead(p); ok {
			return n, nil
		}
		r.arm() // the rest of the frame is not there yet: bound the wait
	}
	if !started && len(p) < aheadSize && r.raw != nil {
		return r.readAhead(p)
	}
	n, err := r.c.Read(p)
	if n > 0 {
		r.begin()
	}
	return n, err
}

// aheadSize is how much a frame's first read takes in: a frame's header
// and, in the same system call, as much of what follows as is there —
// the whole of an ordinary request.
const aheadSize = 4 << 10

var aheadPool = sync.Pool{New: func() any { return new([aheadSize]byte) }}

// readAhead is the first read of a frame (p is its header): it waits for
// the connection as the plain read does, then reads up to aheadSize bytes,
// gives p its share and keeps the rest for the reads that follow. The
// buffer is taken only for the read itself and kept only while it holds
// bytes not yet read: an idle connection holds none, and a frame that
// stalls holds at most aheadSize of it.
func (r *frameReader) readAhead(p []byte) (int, error) {
	var buf *[aheadSize]byte
	var n int
	var rerr error
	err := r.raw.Read(func(fd uintptr) bool {
		buf = aheadPool.Get().(*[aheadSize]byte)
		for {
			n, rerr = unix.Read(int(fd), buf[:])
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			aheadPool.Put(buf)
			buf = nil
			return false // wait until there is something to read
		}
		return true
	})
	if err == nil && rerr != nil {
		err = &net.OpError{Op: "read", Net: "unix", Source: r.c.LocalAddr(), Addr: r.c.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	}
	if err != nil || n <= 0 {
		if buf != nil {
			aheadPool.Put(buf)
		}
		if err == nil {
			err = io.EOF // the peer closed
		}
		return 0, err
	}
	r.begin()
	k := copy(p, buf[:n])
	if k == n {
		aheadPool.Put(buf)
		return k, nil
	}
	r.buf, r.ahead = buf, buf[k:n]
	return k, nil
}

// fromAhead gives p what readAhead kept, and lets the buffer go once it
// is all read.
func (r *frameReader) fromAhead(p []byte) int {
	r.begin() // the next frame's first bytes may be among them
	k := copy(p, r.ahead)
	r.ahead = r.ahead[k:]
	if len(r.ahead) == 0 {
		aheadPool.Put(r.buf)
		r.buf, r.ahead = nil, nil
	}
	return k
}

// tryRead reads what is there without waiting; ok is false when nothing
// is (or the try failed: the blocking read then says why).
func (r *frameReader) tryRead(p []byte) (n int, ok bool) {
	if r.raw == nil {
		return 0, false
	}
	var err error
	if cerr := r.raw.Read(func(fd uintptr) bool {
		n, err = unix.Read(int(fd), p)
		return true // one try, never a wait
	}); cerr != nil || err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// begin notes a frame's first byte.
func (r *frameReader) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started.IsZero() {
		r.started = time.Now()
	}
}

// arm sets the frame deadline, frame-timeout after the frame's first byte.
func (r *frameReader) arm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.frameAt.IsZero() {
		r.frameAt = r.started.Add(r.timeout)
		r.c.SetReadDeadline(earliest(r.frameAt, r.drainAt))
	}
}

// end closes the frame and disarms its deadline; it reports whether the
// frame deadline (not the drain bound) had passed.
func (r *frameReader) end() (expired bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = time.Time{}
	if r.frameAt.IsZero() {
		return false // never armed: the frame never waited
	}
	now := time.Now()
	expired = !now.Before(r.frameAt) && (r.drainAt.IsZero() || r.frameAt.Before(r.drainAt))
	r.frameAt = time.Time{}
	r.c.SetReadDeadline(r.drainAt)
	return expired
}

// drain sets the shutdown bound: a frame under way may finish within it,
// an idle connection wakes up at it.
func (r *frameReader) drain(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drainAt = at
	r.c.SetReadDeadline(earliest(r.frameAt, at))
}

// earliest is the earlier of two deadlines, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// handle serves one connection: a peer-credential check, hello, then
// requests until the client closes or sends something malformed.
func (g *Gateway) handle(uc *net.UnixConn, gd *guard, sl *slot) {
	defer uc.Close()
	c := &conn{c: uc, fr: newFrameReader(uc, gd.frameTimeout), gd: gd, max: api.MaxFrame(g.cfg.MaxBody)}
	if err := g.checkPeer(c); err != nil {
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
		if !c.good && req.Op != api.OpHello {
			c.fail(fault.New(fault.Data, fault.KindProtocol, "first request must be hello"))
			return
		}
		if holdsOpen(req) {
			sl.set(holdStream) // its place is kept however long it waits
		} else {
			sl.set(holdBusy)
		}
		if req.Op == api.OpRecv {
			g.recv(c, req)
			return
		}
		if req.Op == api.OpAsk {
			g.ask(c, req)
			return
		}
		if req.Op == api.OpSend && req.Wait {
			g.sendWait(c, req)
			return
		}
		if req.Op == api.OpWaitReply {
			g.waitReply(c, req)
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
func holdsOpen(req *api.Request) bool {
	switch req.Op {
	case api.OpRecv, api.OpAsk, api.OpWaitReply, api.OpWait:
		return true
	}
	return req.Op == api.OpSend && req.Wait
}

// checkPeer admits only processes of the gateway's own user (the socket's
// mode already says so; this holds even if the mode is loosened).
func (g *Gateway) checkPeer(c *conn) error {
	raw, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return fault.Wrap(fault.Refused, fault.KindPeer, cerr, "cannot read peer credentials")
	}
	c.pid = cred.Pid
	if int(cred.Uid) != os.Getuid() {
		return fault.New(fault.Refused, fault.KindPeer, "uid %d may not use the gateway of uid %d", cred.Uid, os.Getuid())
	}
	return nil
}

func (g *Gateway) dispatch(c *conn, req *api.Request) (*api.Response, error) {
	if g.runCtx.Err() != nil {
		return nil, fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down")
	}
	switch req.Op {
	case api.OpHello:
		if req.Proto != api.Proto {
			return nil, fault.New(fault.Data, fault.KindProtocol,
				"client speaks socket protocol %d, this gateway speaks %d", req.Proto, api.Proto).
				WithHint("use the fleet commands of the same release as fleet-gw")
		}
		c.good = true
		return &api.Response{Hello: &api.Hello{
			Proto: api.Proto, Host: g.cfg.Host, Version: version.Version,
			MaxBody: g.cfg.MaxBody, Pid: os.Getpid(),
		}}, nil
	case api.OpJoin:
		return g.join(req)
	case api.OpLeave:
		return g.leave(req)
	case api.OpRoster:
		return g.roster()
	case api.OpWhoami:
		b, err := g.caller(req)
		if err != nil {
			return nil, err
		}
		row := g.row(b.snapshot(), nil)
		// live asks are not in the store's pending count; fleet-mcp's
		// new-mail check must see them too
		row.Asks = len(b.liveHead(time.Now()))
		return &api.Response{Entity: &row}, nil
	case api.OpStatus:
		return g.setStatus(c.pid, req)
	case api.OpGatewayStatus:
		return g.gatewayStatus()
	case api.OpSend:
		if req.AnswerTo != "" {
			return g.answer(req)
		}
		return g.send(req)
	case api.OpLookup:
		return g.lookup(req)
	case api.OpWait:
		return g.waitState(req)
	case api.OpBcast:
		return g.broadcast(req)
	case api.OpGroups:
		return g.setGroups(req)
	case api.OpSpawn: // control.go
		return g.spawn(req)
	case api.OpStop: // control.go
		return g.stop(req)
	case api.OpDead:
		return g.dead(req)
	case api.OpReplay: // dlq.go
		return g.replay(req)
	case api.OpPurgeDead:
		return g.purgeDead(req)
	case api.OpTrace: // trace.go
		return g.trace(req)
	case api.OpAck:
		return nil, fault.New(fault.Data, fault.KindProtocol, "ack outside recv")
	}
	return nil, fault.New(fault.Data, fault.KindProtocol, "unknown op %q", req.Op).
		WithHint("use the fleet commands of the same release as fleet-gw")
}

// caller returns the entity whose credential the request presents.
func (g *Gateway) caller(req *api.Request) (*mailbox, error) {
	if req.Token == "" {
		return nil, fault.New(fault.Refused, fault.KindNoCredential, "no credential: this command acts as an entity").
			WithHint("set FLEET_TOKEN, or pass --as NAME for an entity registered on this host")
	}
	gid, secret, err := ident.Parse(req.Token)
	if err != nil {
		return nil, err
	}
	if h := ident.GidHost(gid); h != g.cfg.Host {
		// the credential names its host: say so, rather than "not valid"
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "the credential is one of host %s, not of this host (%s)", h, g.cfg.Host).
			WithHint("run the command on %s, where its entity lives; here, use a credential fleet-roster join printed on %s (or --as NAME)", h, g.cfg.Host)
	}
	b := g.reg.Get(gid)
	if b == nil || !ident.Check(secret, b.snapshot().TokenHash) {
		return nil, fault.New(fault.Refused, fault.KindBadCredential, "credential is not valid on this gateway").
			WithHint("a credential is issued by fleet-roster join and dies with fleet-roster leave")
	}
	return b, nil
}

// nameRE is the grammar of entity names (ident.NamePattern); group names
// are held to ident.ValidGroup.
var nameRE = regexp.MustCompile(ident.NamePattern)

func (g *Gateway) join(req *api.Request) (*api.Response, error) {
	e := &store.Entity{
		Name: req.Name, Mode: req.Mode,
		TmuxTarget: req.TmuxTarget, Exec: req.Exec, Nudge: req.Nudge, Groups: req.Groups,
		Program: req.Program, Turns: req.Turns, Paste: req.Paste, Header: req.Header, IdleScreen: req.IdleScreenMS,
	}
	token, path, err := g.register(e)
	if err != nil {
		return nil, err
	}
	row := g.row(*e, nil)
	return &api.Response{Entity: &row, Token: token, CredFile: path}, nil
}

// checkEntity validates a new entity's name, groups, mode and targets.
func checkEntity(e *store.Entity) error {
	if err := ident.CheckName(e.Name); err != nil {
		return err
	}
	if err := ident.CheckMember(e.Groups); err != nil {
		return err
	}
	switch e.Mode {
	case "pull":
		if e.TmuxTarget != "" || e.Exec != "" {
			return fault.New(fault.Usage, fault.KindUsage, "a pull entity takes no --tmux-target or --exec")
		}
	case "hook":
		// held as for pull; the agent CLI's own hooks take it (fleet-recv
		// --hook). With a pane, the gateway types a wake notice there
		// (wake.go) — never a message — when its agent idles with mail
		if e.Exec != "" || e.Nudge != "" {
			return fault.New(fault.Usage, fault.KindUsage, "a hook entity takes no --exec or --nudge: its agent's hooks run fleet-recv --hook")
		}
		if e.Turns == turnsNone {
			return fault.New(fault.Usage, fault.KindUsage, "a hook entity's agent runs turn hooks: --turns none is for inject entities")
		}
	case "inject":
		if (e.TmuxTarget == "") == (e.Exec == "") {
			return fault.New(fault.Usage, fault.KindUsage, "an inject entity needs exactly one of --tmux-target or --exec")
		}
		if e.Nudge != "" {
			return fault.New(fault.Usage, fault.KindUsage, "--nudge is for pull entities")
		}
	default:
		return fault.New(fault.Usage, fault.KindUsage, "mode must be pull, inject or hook, not %q", e.Mode)
	}
	return checkPane(e)
}

// register validates e and registers it as a local entity: the one path of
// fleet-roster join and fleet-spawn. It fills in the gid (unless preset),
// host, credential hash, status and times; issues the credential and saves
// it owner-only; starts delivery and announces the entity.
func (g *Gateway) register(e *store.Entity) (token, credFile string, err error) {
	if err := checkEntity(e); err != nil {
		return "", "", err
	}
	if g.br != nil { // a name is one entity across the trusted hosts (names.go)
		now := time.Now()
		away := func(host string) string {
			state, heard := g.peers.HostState(host, now, g.br.Connected(), g.cfg.PresenceTTL)
			return hostAway(host, state, heard, now)
		}
		if err := g.names.Free(e.Name, g.peers.ByName(e.Name, "", g.admit.trusted), away); err != nil {
			return "", "", err
		}
	}
	if e.Gid == "" {
		e.Gid = ident.NewGid(g.cfg.Host)
	}
	gid := e.Gid
	token, hash := ident.Issue(gid)
	now := time.Now().UTC()
	e.Host, e.TokenHash, e.Status, e.StatusAt, e.Created = g.cfg.Host, hash, stIdle, now, now
	if e.TmuxTarget != "" {
		// its pane and program, and starting until its agent's first hook
		if err := bindPane(g.runCtx, e); err != nil {
			return "", "", err
		}
		if other := paneTaken(g.reg, e.PaneID); other != "" {
			return "", "", fault.New(fault.Usage, fault.KindNameTaken, "tmux pane %s is %s's already", e.TmuxTarget, other).
				WithHint("one entity per pane: fleet-roster leave %s first", other)
		}
	}
	// With a broker, the inbox is declared, bound and consumed while the
	// store records the entity (both must succeed before join does; what
	// one made is undone when the other fails).
	var inbox chan error
	if g.br != nil {
		inbox = make(chan error, 1)
		go func() { inbox <- g.br.AddInbox(gid, e.Groups) }()
	}
	undoInbox := func() {
		if inbox != nil && <-inbox == nil {
			if err := g.br.RemoveInbox(gid, e.Groups); err != nil {
				g.log.Warn("removing the inbox of a registration that failed", "gid", gid, "err", err)
			}
		}
	}
	if err := g.st.CreateEntity(e); err != nil {
		undoInbox()
		if errors.Is(err, store.ErrNameTaken) {
			return "", "", fault.New(fault.Usage, fault.KindNameTaken, "%s is already registered on this host", e.Name).
				WithHint("choose another name, or remove it with: fleet-roster leave %s", e.Name)
		}
		return "", "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot register %s", e.Name)
	}
	if inbox != nil {
		if err := <-inbox; err != nil {
			g.st.DeleteEntity(gid, "registration failed")
			return "", "", err
		}
	}
	g.addBox(e)
	// the credential file last: a spawned command waits for it and acts at
	// once, so the entity must be live before it exists
	path, err := ident.Save(g.cfg.StateDir, e.Name, token)
	if err != nil {
		// undone as a leave is: the inbox first, then the mailbox, then
		// the entity (what reached it meanwhile is dead-lettered, told)
		if _, uerr := g.unregister(gid, e.Name); uerr != nil {
			g.log.Error("undoing a registration whose credential could not be saved", "entity", e.Name, "err", uerr)
		}
		if fe := fault.NotPrivate(err); fe != nil {
			return "", "", fe
		}
		return "", "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot store the credential of %s", e.Name)
	}
	g.said.Change(gid)
	if g.br != nil { // heard of another one since it was checked: told at once
		g.names.Tell(g.cfg.Host, e.Name, append(g.peers.ByName(e.Name, "", g.admit.trusted), api.EntityRow{Name: e.Name, Host: e.Host, Gid: gid}))
	}
	g.audit.Write(audit.Line{Event: "joined", Entity: e.Name, Recipient: gid})
	g.log.Info("entity joined", "entity", e.Name, "gid", gid, "mode", e.Mode)
	return token, path, nil
}

func (g *Gateway) leave(req *api.Request) (*api.Response, error) {
	gid, ok := g.reg.Named(req.Name)
	if !ok {
		return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name).
			WithHint("list them with: fleet-roster")
	}
	n, err := g.unregister(gid, req.Name)
	if err != nil {
		return nil, err
	}
	return &api.Response{Count: n}, nil
}

// unregister removes local entity gid: the one path of fleet-roster leave
// and fleet-stop. Its broker inbox stops receiving and what is queued there
// is taken in; then everything waiting for it is dead-lettered ("recipient
// left the fleet") and its credential dies. It returns how many messages
// were dead-lettered.
func (g *Gateway) unregister(gid, name string) (int, error) {
	var groups []string
	if b := g.reg.Get(gid); b != nil {
		groups = b.snapshot().Groups
	}
	if g.onBroker(gid) {
		// stop routing to it, take in what is queued, delete the queue.
		// Without the broker that cannot be done, and a queue left behind
		// would swallow mail nobody reads: refuse, and keep the entity.
		if err := g.br.RemoveInbox(gid, groups); err != nil {
			g.br.KeepInbox(gid, groups) // still ours: consumed again on reconnect
			return 0, fault.Wrap(fault.Unavailable, fault.KindBrokerDown, err, "cannot remove %s now: its inbox queue on the broker must go with it", name).
				WithHint("try again once the broker is back")
		}
	}
	g.removeBox(gid)
	g.follow.Forget(gid)
	// what waits is dead-lettered: each sender hears why (bounce or receipt)
	waiting, _ := g.st.Head(gid, 0, 1<<30)
	n, err := g.st.DeleteEntity(gid, "recipient left the fleet")
	if err != nil {
		return 0, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot remove %s", name)
	}
	for _, it := range waiting {
		g.rcpt.Settled(it.Env, store.Dead, "recipient left the fleet", 0)
	}
	ident.Remove(g.cfg.StateDir, name)
	if err := g.st.DeleteLaunched(gid); err != nil { // spawned: how it was started (control.go)
		g.log.Warn("forgetting how an entity was launched", "entity", name, "gid", gid, "err", err)
	}
	g.said.Change(gid) // announcer.go: in the chain's turn
	g.audit.Write(audit.Line{Event: "left", Entity: name, Recipient: gid})
	g.log.Info("entity left", "entity", name, "gid", gid, "dead_lettered", n)
	return n, nil
}

func (g *Gateway) row(e store.Entity, dead map[string]int) api.EntityRow {
	groups := e.Groups
	if groups == nil {
		groups = []string{}
	}
	target := e.TmuxTarget
	if target == "" {
		target = e.Exec
	}
	status := e.Status
	if status == "idle" && g.asks.Asking(e.Gid) {
		status = "waiting" // on an ask of its own (U2)
	}
	return api.EntityRow{
		Name: e.Name, Gid: e.Gid, Host: e.Host, Mode: e.Mode, Target: target, Groups: groups,
		Status: status, StatusReason: e.StatusReason, Program: e.Program,
		Pending: g.st.Pending(e.Gid), Dead: dead[e.Gid], LastDelivery: e.LastDelivery,
	}
}

// localRows is this host's entities, exact.
func (g *Gateway) localRows() ([]api.EntityRow, error) {
	ents, err := g.st.Entities()
	if err != nil {
		return nil, err
	}
	dead := g.st.DeadCounts()
	rows := make([]api.EntityRow, 0, len(ents))
	for _, e := range ents {
		rows = append(rows, g.row(*e, dead))
	}
	return rows, nil
}

// roster is the union view: this host's entities, exact, and every other
// host's as last heard.
func (g *Gateway) roster() (*api.Response, error) {
	rows, err := g.localRows()
	if err != nil {
		return nil, err
	}
	rows = append(rows, g.remoteRows()...)
	mark(rows) // a name more than one trusted host has (names.go)
	return &api.Response{Entities: rows}, nil
}

// setStatus is an agent's turn hook: busy or idle, from the entity whose
// credential the request presents or, with Pane, whose tmux pane the
// calling process runs in (agent.go: agentOf).
func (g *Gateway) setStatus(pid int32, req *api.Request) (*api.Response, error) {
	var b *mailbox
	agent := 0
	if req.Pane {
		if b, agent = agentOf(g.reg, int(pid)); b == nil {
			return nil, fault.New(fault.Refused, fault.KindNotAgent, "this process runs in no inject entity's tmux pane on this host").
				WithHint("join the pane first: fleet-roster join NAME --mode inject|hook --tmux-target \"$TMUX_PANE\"")
		}
	} else {
		var err error
		if b, err = g.caller(req); err != nil {
			return nil, err
		}
	}
	if req.Status != stBusy && req.Status != stIdle {
		return nil, fault.New(fault.Usage, fault.KindUsage, "status must be busy or idle, not %q", req.Status)
	}
	ent := b.snapshot()
	program := ""
	if ent.TmuxTarget != "" && ent.Program == "" {
		// an agent started from the pane's shell: its program is what the
		// pane runs while its hook runs
		if p, err := deliver.Probe(g.runCtx, ent.PaneTarget()); err == nil && agentInFront(p) {
			program = p.Command
		}
	}
	e, err := b.putStatus(g.st, req.Status, "", true, program)
	if err == nil && agent != 0 {
		// the hook's own agent process: the one the pane must have in front
		e, err = b.bindAgent(g.st, agent)
	}
	if err != nil {
		return nil, fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the status")
	}
	if program != "" {
		g.log.Info("agent's program learnt from its first hook", "entity", e.Name, "program", program)
	}
	g.said.Change(e.Gid)
	row := g.row(*e, nil)
	return &api.Response{Entity: &row}, nil
}

func (g *Gateway) dead(req *api.Request) (*api.Response, error) {
	gid := ""
	if req.Name != "" {
		var ok bool
		gid, ok = g.reg.Named(req.Name)
		if !ok {
			return nil, fault.New(fault.NoRecipient, fault.KindUnknownEntity, "no entity named %s on this host", req.Name)
		}
	}
	list, err := g.st.DeadLetters(gid)
	if err != nil {
		return nil, err
	}
	out := make([]api.DeadLetter, 0, len(list))
	for _, d := range list {
		var env *envelope.Envelope
		if len(d.Envelope) > 0 {
			env, _ = envelope.Decode(d.Envelope, 1<<30)
		}
		out = append(out, api.DeadLetter{Record: g.apiRecord(&d.Record), Envelope: env})
	}
	return &api.Response{Dead: out}, nil
}
