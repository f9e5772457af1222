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

// Write appends one line. Lines without a trace id (registry events) carry
// "-" so every line has the key.
func (l *Log) Write(line Line) {
	if l == nil {
		return
	}
	if line.Time.IsZero() {
		line.Time = time.Now().UTC()
	}
	if line.TraceID == "" {
		line.TraceID = "-"
	}
	line.Host = l.host
	data, err := json.Marshal(line)
	if err != nil {
		return
	}
	data = append(data, '\n')
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
