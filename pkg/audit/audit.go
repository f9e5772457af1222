// Package audit writes the gateway's audit log: one JSON object per line,
// the trace id on every line, and never message text — only its size and
// sha256.
package audit

import (
	"encoding/json"
	"os"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Log appends audit lines to a file.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	host string
}

// Open opens (creating 0600) the audit log at path for appending.
func Open(path, host string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Log{f: f, host: host}, nil
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

// Message records an event about env.
func (l *Log) Message(event string, env *envelope.Envelope, attempt int, reason string) {
	size, sum := env.Digest()
	l.Write(Line{
		Event: event, TraceID: env.TraceID, MsgID: env.MsgID, Kind: string(env.Kind),
		Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Size: size, SHA256: sum,
		Attempt: attempt, Reason: reason,
	})
}

// Messages records one event about each of envs, with one write.
func (l *Log) Messages(event string, envs []*envelope.Envelope, attempt int, reason string) {
	if l == nil || len(envs) == 0 {
		return
	}
	var data []byte
	for _, env := range envs {
		size, sum := env.Digest()
		data = l.appendLine(data, Line{
			Event: event, TraceID: env.TraceID, MsgID: env.MsgID, Kind: string(env.Kind),
			Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Size: size, SHA256: sum,
			Attempt: attempt, Reason: reason,
		})
	}
	l.write(data)
}

// Write appends one line. Lines without a trace id (registry events) carry
// "-" so every line has the key.
func (l *Log) Write(line Line) {
	if l == nil {
		return
	}
	l.write(l.appendLine(nil, line))
}

func (l *Log) appendLine(dst []byte, line Line) []byte {
	if line.Time.IsZero() {
		line.Time = time.Now().UTC()
	}
	if line.TraceID == "" {
		line.TraceID = "-"
	}
	line.Host = l.host
	data, err := json.Marshal(line)
	if err != nil {
		return dst
	}
	dst = append(dst, data...)
	return append(dst, '\n')
}

func (l *Log) write(data []byte) {
	if len(data) == 0 {
		return
	}
	l.mu.Lock()
	_, _ = l.f.Write(data)
	l.mu.Unlock()
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}
