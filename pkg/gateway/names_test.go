package gateway

import (
	"errors"
	"testing"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// The broker's inbox-full error knows only the routing key (a gid): the
// gateway names the recipient as it knows it, and keeps kind, code and
// hint; with no name known it is left as it is.
func TestNamedFaultNamesTheRecipient(t *testing.T) {
	gid := "h2.01a2340c-fa15-73c4-abea-be52ee43b9dd"
	orig := fault.New(fault.TempFail, fault.KindInboxFull, "the inbox of %s is full: the broker refused the message", gid).WithHint("h")
	err := namedFault(orig, envelope.Party{Gid: gid, Name: "carl", Host: "h2"})
	var fe *fault.Error
	if !errors.As(err, &fe) || fe.Msg != "the inbox of carl@h2 is full: the broker refused the message" ||
		fe.Kind != fault.KindInboxFull || fe.Code != fault.TempFail || fe.Hint != "h" {
		t.Errorf("named: %#v", err)
	}
	if orig.Msg == fe.Msg {
		t.Errorf("the broker's error was changed in place")
	}
	if got := namedFault(orig, envelope.Party{Gid: gid}); got != error(orig) {
		t.Errorf("unnamed: %v, want the error as it was", got)
	}
}
