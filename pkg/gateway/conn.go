package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/fault"
	"golang.org/x/sys/unix"
)

// One client connection (conn): its peer check, the framing of its
// requests (frameReader) and the bounds the socket holds connections to
// (guard). socket.go accepts connections and hands their requests to the
// verbs; the stream verbs (recv.go, ask.go, rendezvous.go) read and
// answer their connection here.

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
func (c *conn) read() (api.Request, error) {
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
	return api.DecodeRequest(data)
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

// checkPeer admits only processes of the gateway's own user (the socket's
// mode already says so; this holds even if the mode is loosened).
func (c *conn) checkPeer() error {
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
