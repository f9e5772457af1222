package cli

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
)

// A text line names a recipient NAME@HOST; a gid only when no name is
// known, and then it says so rather than inventing one.
func TestNamedSaysWhenOnlyAGidIsKnown(t *testing.T) {
	gid := "h2.01a2340c-fa15-73c4-abea-be52ee43b9dd"
	for in, want := range map[string]string{
		"bob@h2":        "bob@h2",
		"broadcast.ops": "broadcast.ops",
		gid:             gid + " (name not known here)",
	} {
		if got := named(in); got != want {
			t.Errorf("named(%q) = %q, want %q", in, got, want)
		}
	}
}

// In JSON a record's recipient is an entity: its name and host from
// NAME@HOST, its gid alongside; a gid alone still names its host.
func TestRecordOutNamesTheRecipient(t *testing.T) {
	gid := "h2.01a2340c-fa15-73c4-abea-be52ee43b9dd"
	got := recordOut(&api.Record{MsgID: "m", Recipient: "bob@h2", Gid: gid}).Recipient
	if *got != (Party{Gid: gid, Name: "bob", Host: "h2"}) {
		t.Errorf("named: %+v", got)
	}
	got = recordOut(&api.Record{MsgID: "m", Recipient: gid, Gid: gid}).Recipient
	if *got != (Party{Gid: gid, Host: "h2"}) || strings.Contains(got.Name, ".") {
		t.Errorf("unnamed: %+v", got)
	}
}
