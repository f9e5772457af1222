package deliver

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// The frame: how a message from another entity is handed to a model
// through its agent CLI's hooks (fleet-recv --hook), the same in every
// CLI. It says whose words these are — another fleet entity's, never the
// user's or the system's — and how to answer:
//
//	[fleet message from alice@h1 · msg 01J… · send]
//	│ the body, every line behind a bar
//	[end of fleet message 01J… · reply: fleet-send --reply-to 01J… TEXT]
//
// An ASK's header carries its deadline (· ask · answer by 2026-12-01T14:30:05Z)
// and its end line the answer command (fleet-send --answer ID TEXT); a
// REPLY's header the message it answers (· reply · re ID). The body is
// inert (Inert, newlines and tabs kept; U+2028 and U+2029 written as
// ⟨U+2028⟩, ⟨U+2029⟩) and every one of its lines starts
// with FrameBar, so no line of it can open or close a frame: only the
// frame's own first and last lines start with "[". A body over the
// hook's budget is not in the frame; one line says its size and the
// command that shows it whole.
const (
	FrameOpen = "[fleet message from "
	FrameEnd  = "[end of fleet message "
	FrameBar  = "│ "
)

// Frame is env framed for a model, the body in full.
func Frame(env *envelope.Envelope) string { return frame(env, "") }

// FramePointer is env framed with show, the command that shows its body,
// in place of the body.
func FramePointer(env *envelope.Envelope, show string) string {
	return frame(env, fmt.Sprintf("(a body of %d bytes, too long for this hook: read it with %s)", len(env.Body), show))
}

// lineSeps are the Unicode line and paragraph separators, which a reader
// may take for a line break (a line the bar does not start), written in
// Inert's notation.
var lineSeps = strings.NewReplacer("\u2028", "⟨U+2028⟩", "\u2029", "⟨U+2029⟩")

func frame(env *envelope.Envelope, pointer string) string {
	var b strings.Builder
	id := Inert(env.MsgID, false)
	kind := Inert(strings.ToLower(string(env.Kind)), false)
	if env.Urgent {
		kind = "urgent " + kind // it went ahead of normal mail (gateway/urgent.go)
	}
	fmt.Fprintf(&b, "%s%s · msg %s · %s", FrameOpen, Inert(env.Sender.String(), false), id, kind)
	answer := "reply: fleet-send --reply-to " + id + " TEXT"
	switch env.Kind {
	case envelope.Ask:
		if !env.Expires.IsZero() {
			fmt.Fprintf(&b, " · answer by %s", env.Expires.UTC().Format(time.RFC3339))
		}
		answer = "answer: fleet-send --answer " + id + " TEXT"
	case envelope.Reply:
		if env.InReplyTo != "" {
			fmt.Fprintf(&b, " · re %s", Inert(env.InReplyTo, false))
		}
	case envelope.Broadcast:
		if g := env.Recipient.Group; g != "" {
			fmt.Fprintf(&b, " to group %s", Inert(g, false))
		}
	}
	b.WriteString("]\n")
	body := pointer
	if body == "" {
		body = lineSeps.Replace(Inert(strings.TrimRight(env.Body, "\n"), true))
	}
	for _, line := range strings.Split(body, "\n") {
		b.WriteString(FrameBar)
		b.WriteString(line)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s%s · %s]", FrameEnd, id, answer)
	return b.String()
}
