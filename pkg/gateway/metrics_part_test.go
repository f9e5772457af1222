package gateway

import (
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/metrics"
)

// What one scrape reads (metrics.go scrapes.snapshot), from a real store
// in a temp folder: inbox depths by entity, local entities by status,
// other hosts by the best state of their entities.
func TestScrapeSnapshot(t *testing.T) {
	r := newIntakeRig(t)
	alice := r.entity("alice")
	r.entity("carol")
	for _, body := range []string{"1", "2"} {
		if err := r.in.Take(envelope.New(envelope.Send, ibob, envelope.Party{Gid: alice.Gid}, body)); err != nil {
			t.Fatal(err)
		}
	}
	s := &scrapes{st: r.st, reg: r.in.reg, asks: newAsks(),
		broker: func() string { return "connected" },
		remote: func() []api.EntityRow {
			return []api.EntityRow{
				{Name: "bob", Host: "h2", Status: "idle"}, {Name: "dan", Host: "h2", Status: "stale"},
				{Name: "eve", Host: "h3", Status: "gone"}, {Host: "h4", Status: "untrusted"},
			}
		}}
	snap, err := s.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap.Broker != "connected" {
		t.Errorf("broker %q", snap.Broker)
	}
	depth := map[string]int{}
	for _, in := range snap.Inboxes {
		depth[in.Entity] = in.Depth
	}
	if depth["alice"] != 2 || depth["carol"] != 0 {
		t.Errorf("inbox depths %v, want alice 2, carol 0", depth)
	}
	local := 0
	for w, n := range snap.Entities {
		if w.Where == "local" {
			local += n
		}
	}
	if local != 2 {
		t.Errorf("local entities %v, want alice and carol", snap.Entities)
	}
	if snap.Hosts["live"] != 1 || snap.Hosts["gone"] != 1 || snap.Hosts["untrusted"] != 1 {
		t.Errorf("hosts %v, want h2 live (its best), h3 gone, h4 untrusted", snap.Hosts)
	}
	if snap.Entities[metrics.Where{Where: "remote", State: "stale"}] != 1 {
		t.Errorf("remote entities %v", snap.Entities)
	}
}
