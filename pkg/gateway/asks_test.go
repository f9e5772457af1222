package gateway

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Prune forgets asks past their grace, walking the maps at most once a
// pruneEvery: not on every ask.
func TestAsksPruneSpaced(t *testing.T) {
	a := newAsks()
	t0 := time.Now()
	ask := func() *envelope.Envelope {
		e := envelope.New(envelope.Ask, envelope.Party{Gid: "h1.a", Host: "h1"}, envelope.Party{Gid: "h2.b", Host: "h2"}, "?")
		e.Expires = t0.Add(-askGrace - time.Minute) // long gone
		return e
	}
	old := ask()
	a.See(old)
	a.Prune(t0)
	if _, ok := a.Seen(old.MsgID); ok {
		t.Fatal("an ask past its grace was kept")
	}
	later := ask()
	a.See(later)
	a.Prune(t0.Add(pruneEvery / 2))
	if _, ok := a.Seen(later.MsgID); !ok {
		t.Fatal("Prune walked again within pruneEvery")
	}
	a.Prune(t0.Add(pruneEvery))
	if _, ok := a.Seen(later.MsgID); ok {
		t.Fatal("Prune did not walk after pruneEvery")
	}
}
