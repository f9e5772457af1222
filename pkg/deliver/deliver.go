// Package deliver hands a message to an inject-mode entity: the tmux adapter
// pastes it into a terminal pane, the exec adapter runs a command with the
// message JSON on stdin. An adapter returns nil only when the entity has the
// message; the gateway records the outcome and retries or dead-letters.
package deliver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Adapter delivers one message.
type Adapter interface {
	Deliver(ctx context.Context, env *envelope.Envelope) error
}

// ErrUncertain marks a failure after part of the delivery may have reached
// the entity (the text was pasted, Enter failed). Retrying could deliver it
// twice, so the gateway dead-letters it as uncertain instead.
var ErrUncertain = errors.New("delivery uncertain")

// Where the header goes, beside the body (a per-entity setting).
const (
	HeaderBefore = "before" // the default: who sent it and how to reply, then the body
	HeaderAfter  = "after"  // the body, then the header
	HeaderOff    = "off"    // the body alone
)

// Text is what an injected message looks like in a terminal that takes it
// as one bracketed paste: one header line naming the sender and how to
// reply, then the body. Every header field is Inert without newlines (the
// header is one line), the body Inert with its newlines and tabs, which
// inside a bracketed paste are text, not keys.
func Text(env *envelope.Envelope) string { return Format(env, HeaderBefore, true) }

// Line is the message as one line, for a terminal that may take pasted
// text as typed keys: the header, a space, then the body with its newlines
// and tabs neutralised too (␊, ␉). It holds no control character at all, so
// only the Enter the adapter presses after it can submit anything.
func Line(env *envelope.Envelope) string { return Format(env, HeaderBefore, false) }

// Format is the message with its header where where says (HeaderBefore,
// HeaderAfter, HeaderOff), as lines (Text: the body keeps its newlines and
// tabs, the header is its own line) or as one line (Line). Nothing in it
// is a control character but the newlines and tabs of the lines form.
func Format(env *envelope.Envelope, where string, lines bool) string {
	body := Inert(strings.TrimRight(env.Body, "\n"), lines)
	sep := " "
	if lines {
		sep = "\n"
	}
	switch where {
	case HeaderOff:
		return body
	case HeaderAfter:
		return body + sep + header(env)
	}
	return header(env) + sep + body
}

func header(env *envelope.Envelope) string {
	var b strings.Builder
	id := Inert(env.MsgID, false)
	urgent := ""
	if env.Urgent {
		urgent = "urgent " // it went ahead of normal mail (gateway/urgent.go)
	}
	fmt.Fprintf(&b, "[fleet %s%s from %s · msg %s", urgent, Inert(strings.ToLower(string(env.Kind)), false),
		Inert(env.Sender.String(), false), id)
	switch env.Kind {
	case envelope.Send, envelope.Broadcast:
		fmt.Fprintf(&b, " · reply: fleet-send --reply-to %s TEXT", id)
	case envelope.Reply:
		if env.InReplyTo != "" {
			fmt.Fprintf(&b, " · re %s", Inert(env.InReplyTo, false))
		}
	case envelope.Ask:
		fmt.Fprintf(&b, " · answer by %s: fleet-send --answer %s TEXT", env.Expires.Local().Format("15:04:05"), id)
	}
	b.WriteString("]")
	return b.String()
}
