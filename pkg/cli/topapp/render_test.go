package topapp

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// BenchmarkRender is one frame of the bench-top fleet: 1,000 entities on
// 10 hosts, a full flow, 120x40, in colour.
func BenchmarkRender(b *testing.B) {
	now := time.Now()
	snap := &snapshot{Status: &api.GatewayStatus{Host: "h1"}, HasAsks: true}
	for i := range 1000 {
		h := fmt.Sprintf("h%d", i%10+1)
		snap.Rows = append(snap.Rows, api.EntityRow{Name: fmt.Sprintf("e-%s-%d", h, i), Host: h, Gid: fmt.Sprintf("%s.%08d", h, i),
			Status: "idle", StatusSince: now.Add(-time.Minute), Pending: i % 3, LastDelivery: now})
	}
	m := newModel(&source{}, &stream{ch: make(chan api.WatchEvent)}, snap, palette{color: true})
	m.w, m.h = 120, 40
	for i := range maxEvents {
		m.events = append(m.events, api.WatchEvent{Time: now, Host: "h1", Event: "accepted", Kind: "SEND", MsgID: fmt.Sprintf("%032d", i),
			Sender: "h1.00000001", Recipient: "h2.00000002", Size: 512})
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.render()
	}
}
