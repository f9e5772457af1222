// Package audit writes the gateway's audit log: one JSON object per line,
// the trace id on every line, and never message text — only its size and
// sha256. The log is rotated by size (audit.log, audit.log.1 … audit.log.N,
// oldest last) and Search reads every file of it.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fleetd/fleet/internal/jsonw"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/private"
)

// Defaults of Options.
const (
	DefaultMaxSize = 64 << 20 // bytes of audit.log before it is rotated
	DefaultFiles   = 5        // rotated files kept: audit.log.1 … audit.log.5
)

// Options bound the log on disk: at most (Files+1) × MaxSize bytes.
type Options struct {
	MaxSize int64 // rotate audit.log when a write would take it past this; 0: DefaultMaxSize
	Files   int   // rotated files kept; 0: DefaultFiles
}

// Log appends audit lines to a file, rotating it by size. Writers and
// searches may run at once: a write holds mu; a rotation also holds rot,
// which a search holds only while it opens the files (an open file is read
// to its end whatever is renamed meanwhile).
type Log struct {
	mu   sync.Mutex
	f    *os.File // nil once closed
	size int64
	host string
	path string
	opt  Options

	rot sync.RWMutex // the set of file names: renamed under Lock, opened for a search under RLock

	tap Tap // set once, before the first write (SetTap)
}

// Tap is told every line as it is written: the gateway's watch stream.
// It must not block.
type Tap interface{ Tap(Line) }

// SetTap has every line from now on told to t too. Call it before the
// log is shared.
func (l *Log) SetTap(t Tap) { l.tap = t }

// Open opens (creating 0600) the audit log at path for appending.
func Open(path, host string, opt Options) (*Log, error) {
	if opt.MaxSize <= 0 {
		opt.MaxSize = DefaultMaxSize
	}
	if opt.Files <= 0 {
		opt.Files = DefaultFiles
	}
	f, err := private.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Log{f: f, size: fi.Size(), host: host, path: path, opt: opt}, nil
}

// Line is one audit record.
type Line struct {
	Time      time.Time `json:"time"`
	Host      string    `json:"host"`
	Event     string    `json:"event"`
	TraceID   string    `json:"trace_id"`
	MsgID     string    `json:"msg_id,omitempty"`
	Kind      string    `json:"kind,omitempty"`
	Sender    string    `json:"sender,omitempty"`
	Recipient string    `json:"recipient,omitempty"`
	Size      int       `json:"size,omitempty"`
	SHA256    string    `json:"sha256,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Entity    string    `json:"entity,omitempty"`
}

// Message records an event about env. The line names the entity of this
// host the event concerns: for what a sender does (asked, replied,
// published, confirmed, unconfirmed, not_sent) the sender when it lives
// here, else the recipient when it does; for the rest the other way round.
func (l *Log) Message(event string, env *envelope.Envelope, attempt int, reason string) {
	if l == nil {
		return
	}
	line := l.messageLine(event, env, attempt, reason)
	l.write(l.appendLine(nil, line))
	if l.tap != nil {
		l.tap.Tap(line)
	}
}

// Messages records one event about each of envs, with one write.
func (l *Log) Messages(event string, envs []*envelope.Envelope, attempt int, reason string) {
	if l == nil || len(envs) == 0 {
		return
	}
	var data []byte
	for _, env := range envs {
		line := l.messageLine(event, env, attempt, reason)
		data = l.appendLine(data, line)
		if l.tap != nil {
			l.tap.Tap(line)
		}
	}
	l.write(data)
}

func (l *Log) messageLine(event string, env *envelope.Envelope, attempt int, reason string) Line {
	size, sum := env.Digest()
	return Line{
		Event: event, TraceID: env.TraceID, MsgID: env.MsgID, Kind: string(env.Kind),
		Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Size: size, SHA256: sum,
		Attempt: attempt, Reason: reason, Entity: l.entity(event, env),
	}
}

// senderEvents are what a sender does; every other event happens to a
// message's recipient.
var senderEvents = map[string]bool{
	"asked": true, "replied": true, "published": true, "confirmed": true, "unconfirmed": true, "not_sent": true,
}

// entity is the name (else the gid) of the party of env that lives on
// this host and that event concerns.
func (l *Log) entity(event string, env *envelope.Envelope) string {
	parties := []envelope.Party{env.Recipient, env.Sender}
	if senderEvents[event] {
		parties[0], parties[1] = parties[1], parties[0]
	}
	for _, p := range parties {
		if p.Gid != "" && ident.GidHost(p.Gid) == l.host {
			if p.Name != "" {
				return p.Name
			}
			return p.Gid
		}
	}
	if env.Sender.Name != "" {
		return env.Sender.Name
	}
	return env.Sender.Gid
}

// Write appends one line. Lines without a trace id (registry events) carry
// "-" so every line has the key.
func (l *Log) Write(line Line) {
	if l == nil {
		return
	}
	l.write(l.appendLine(nil, line))
	if l.tap != nil {
		l.tap.Tap(line)
	}
}

func (l *Log) appendLine(dst []byte, line Line) []byte {
	if line.Time.IsZero() {
		line.Time = time.Now().UTC()
	}
	if line.TraceID == "" {
		line.TraceID = "-"
	}
	line.Host = l.host
	n := len(dst)
	if dst = line.appendJSON(dst); len(dst) == n {
		return dst // not encodable: no line
	}
	return append(dst, '\n')
}

// appendJSON appends line as json.Marshal encodes it (TestLineAsEncodingJSON),
// without its reflection: one line per message event.
func (line *Line) appendJSON(dst []byte) []byte {
	b, ok := jsonw.Time(append(dst, `{"time":`...), line.Time)
	if !ok {
		data, err := json.Marshal(line)
		if err != nil {
			return dst
		}
		return append(dst, data...)
	}
	str := func(key, v string, omitEmpty bool) {
		if v == "" && omitEmpty {
			return
		}
		b = append(b, `,"`...)
		b = append(b, key...)
		b = append(b, `":`...)
		b = jsonw.String(b, v)
	}
	num := func(key string, v int) {
		if v == 0 {
			return
		}
		b = append(b, `,"`...)
		b = append(b, key...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, int64(v), 10)
	}
	str("host", line.Host, false)
	str("event", line.Event, false)
	str("trace_id", line.TraceID, false)
	str("msg_id", line.MsgID, true)
	str("kind", line.Kind, true)
	str("sender", line.Sender, true)
	str("recipient", line.Recipient, true)
	num("size", line.Size)
	str("sha256", line.SHA256, true)
	num("attempt", line.Attempt)
	str("reason", line.Reason, true)
	str("entity", line.Entity, true)
	return append(b, '}')
}

func (l *Log) write(data []byte) {
	if len(data) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return // closed
	}
	if l.size > 0 && l.size+int64(len(data)) > l.opt.MaxSize {
		l.rotate()
		if l.f == nil {
			return
		}
	}
	n, _ := l.f.Write(data)
	l.size += int64(n)
}

// name is the file of generation i: audit.log for 0, audit.log.i after.
func (l *Log) name(i int) string {
	if i == 0 {
		return l.path
	}
	return fmt.Sprintf("%s.%d", l.path, i)
}

// rotate shifts audit.log.i to audit.log.i+1 (the oldest is removed),
// audit.log to audit.log.1, and starts a new audit.log; l.mu is held. If
// a step fails, writing goes on in whatever audit.log is then.
func (l *Log) rotate() {
	l.rot.Lock()
	defer l.rot.Unlock()
	l.f.Close()
	_ = os.Remove(l.name(l.opt.Files))
	failed := false
	for i := l.opt.Files - 1; i >= 0; i-- {
		if err := os.Rename(l.name(i), l.name(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			failed = true
			break
		}
	}
	f, err := private.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		l.f = nil
		return
	}
	l.f, l.size = f, 0
	if fi, err := f.Stat(); err == nil && !failed {
		l.size = fi.Size()
	}
	// a failed rename left audit.log as it was: counted from zero, the
	// next try comes after another max-size of lines, not at the next
	// write (each try removes the oldest file first)
}

// Close closes the file; later writes are dropped.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Found is what Search found.
type Found struct {
	Lines     []Line
	Truncated bool // more lines matched than the limit; the first ones are kept
}

// maxLine is the longest line Search reads; a longer one is skipped.
const maxLine = 64 << 10

// Search returns the lines of trace, oldest first, from every file of the
// log (the rotated ones too), at most limit of them. Lines that are not
// JSON, or do not carry exactly that trace id, are skipped.
func (l *Log) Search(trace string, limit int) (Found, error) {
	var out Found
	if l == nil || trace == "" || trace == "-" {
		return out, nil
	}
	var files []*os.File
	l.rot.RLock()
	for i := l.opt.Files; i >= 0; i-- {
		f, err := os.Open(l.name(i))
		if err != nil {
			continue
		}
		files = append(files, f)
	}
	l.rot.RUnlock()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	needle := []byte(`"trace_id":"` + trace + `"`)
	for _, f := range files {
		if err := scan(f, needle, trace, limit, &out); err != nil {
			return out, fmt.Errorf("reading %s: %w", f.Name(), err)
		}
		if out.Truncated {
			break
		}
	}
	return out, nil
}

func scan(f io.Reader, needle []byte, trace string, limit int, out *Found) error {
	r := bufio.NewReaderSize(f, maxLine)
	long := false // inside a line longer than the buffer: skip to its end
	for {
		line, err := r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			long = true
			continue
		case long:
			long = false
		case bytes.Contains(line, needle):
			var ln Line
			if json.Unmarshal(line, &ln) == nil && ln.TraceID == trace {
				if len(out.Lines) >= limit {
					out.Truncated = true
					return nil
				}
				out.Lines = append(out.Lines, ln)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
