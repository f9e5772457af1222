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

// Text is what an injected message looks like in a terminal: one header
// line naming the sender and how to reply, then the body.
func Text(env *envelope.Envelope) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[fleet %s from %s · msg %s", strings.ToLower(string(env.Kind)), env.Sender, env.MsgID)
	switch env.Kind {
	case envelope.Send, envelope.Broadcast:
		fmt.Fprintf(&b, " · reply: fleet-send --reply-to %s TEXT", env.MsgID)
	case envelope.Reply:
		if env.InReplyTo != "" {
			fmt.Fprintf(&b, " · re %s", env.InReplyTo)
		}
	case envelope.Ask:
		fmt.Fprintf(&b, " · answer by %s: fleet-send --answer %s TEXT", env.Expires.Local().Format("15:04:05"), env.MsgID)
	}
	b.WriteString("]\n")
	b.WriteString(strings.TrimRight(env.Body, "\n"))
	return b.String()
}
