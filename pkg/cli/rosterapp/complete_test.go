package rosterapp

import (
	"slices"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
)

// The completions' values from the roster view: each once, sorted; a host
// that is not trusted here lends only its host id, for fleet-gw trust add.
func TestCompletions(t *testing.T) {
	rows := []api.EntityRow{
		{Name: "bob", Host: "h1", Groups: []string{"ops", "crew"}, Status: "idle"},
		{Name: "bob", Host: "h2", Groups: []string{"crew"}, Status: "stale"},
		{Name: "alice", Host: "h1", Status: "busy"},
		{Name: "mallory", Host: "evil", Groups: []string{"admins"}, Status: "untrusted"},
	}
	for kind, want := range map[string][]string{
		"entities":        {"alice", "alice@h1", "bob", "bob@h1", "bob@h2"},
		"hosts":           {"h1", "h2"},
		"groups":          {"crew", "ops"},
		"untrusted-hosts": {"evil"},
	} {
		if got := completions(kind, rows); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", kind, got, want)
		}
	}
}
