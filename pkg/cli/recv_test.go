package cli

import (
	"errors"
	"strconv"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
)

// A follower remembers the newest msg ids it wrote out, and no more.
func TestRecentKeepsTheNewest(t *testing.T) {
	s := newRecent(3)
	for i := range 5 {
		s.add("m" + strconv.Itoa(i))
	}
	s.add("m4") // again: no room taken
	for i, want := range []bool{false, false, true, true, true} {
		if got := s.has("m" + strconv.Itoa(i)); got != want {
			t.Errorf("has(m%d) = %v, want %v", i, got, want)
		}
	}
	if len(s.ids) != 3 {
		t.Errorf("%d ids kept, want 3", len(s.ids))
	}
}

// A follower waits for a gateway that went away; it ends on what waiting
// will not mend.
func TestComesBack(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fault.New(fault.Unavailable, fault.KindShuttingDown, "the gateway is shutting down"), true},
		{fault.Wrap(fault.Unavailable, fault.KindNoGateway, errors.New("EOF"), "lost the gateway"), true},
		{fault.New(fault.TempFail, fault.KindTooManyConnections, "limit"), true},
		{fault.New(fault.TempFail, fault.KindInboxBusy, "another fleet-recv is draining bob"), false},
		{fault.New(fault.Refused, fault.KindBadCredential, "credential is not valid on this gateway"), false},
		{fault.New(fault.CantCreate, fault.KindOutput, "writing the message out"), false},
	} {
		if got := comesBack(tc.err); got != tc.want {
			t.Errorf("comesBack(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
