package gateway

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// A host reads live, then stale past two of its intervals, then gone
// past the TTL; gone at once when it leaves; unknown when never heard or
// while cut off from the broker. Peers lists trusted and heard hosts.
func TestPeerViewHostState(t *testing.T) {
	const iv = time.Second
	const ttl = 5 * time.Second
	v := newPeerView(iv, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	row := api.EntityRow{Name: "bob", Host: "h2", Gid: "h2.x", Mode: "pull", Groups: []string{}}
	if err := v.Page("h2", 1, 0, iv, 1, 0, 1, []api.EntityRow{row}, t0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at        time.Duration
		connected bool
		want      string
	}{
		{0, true, hostLive}, {2 * iv, true, hostLive}, {2*iv + 1, true, hostStale},
		{ttl, true, hostStale}, {ttl + 1, true, hostGone}, {ttl + 1, false, hostUnknown},
	} {
		got, heard := v.HostState("h2", t0.Add(c.at), c.connected, ttl)
		if got != c.want || !heard.Equal(t0) {
			t.Errorf("at +%v (connected %v): %s heard %v, want %s heard %v", c.at, c.connected, got, heard, c.want, t0)
		}
	}
	if got, heard := v.HostState("h3", t0, true, ttl); got != hostUnknown || !heard.IsZero() {
		t.Errorf("a host never heard: %s %v, want unknown, never", got, heard)
	}

	peers := v.Peers(t0.Add(3*iv), true, ttl, []string{"h3", "h2"}, []api.EntityRow{{Host: "h9", LastSeen: t0}})
	want := []api.PeerStatus{
		{Host: "h2", Trusted: true, LastHeard: t0, State: hostStale},
		{Host: "h3", Trusted: true, State: hostUnknown},
		{Host: "h9", LastHeard: t0, State: hostUntrusted},
	}
	if len(peers) != len(want) {
		t.Fatalf("peers %+v, want %+v", peers, want)
	}
	for i := range want {
		if peers[i] != want[i] {
			t.Errorf("peer %d: %+v, want %+v", i, peers[i], want[i])
		}
	}
	// trusted no more: still heard, so listed, as untrusted
	if p := v.Peers(t0, true, ttl, nil, nil); len(p) != 1 || p[0].State != hostUntrusted || p[0].Trusted {
		t.Errorf("a heard host not in the trust file: %+v", p)
	}

	// a clean stop: gone at once, since when it was last heard
	if err := v.Leave("h2", 2); err != nil {
		t.Fatal(err)
	}
	if got, heard := v.HostState("h2", t0.Add(iv/2), true, ttl); got != hostGone || !heard.Equal(t0) {
		t.Errorf("after leaving: %s %v, want gone %v", got, heard, t0)
	}
	if got, _ := v.HostState("h2", t0.Add(iv/2), false, ttl); got != hostUnknown {
		t.Errorf("after leaving, cut off: %s, want unknown", got)
	}
}

func TestHostAway(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if s := hostAway("h2", hostLive, t0, t0); s != "" {
		t.Errorf("live: %q", s)
	}
	if s := hostAway("h2", hostUnknown, time.Time{}, t0); s != "" {
		t.Errorf("unknown: %q", s)
	}
	s := hostAway("h2", hostGone, t0, t0.Add(90*time.Second))
	if want := "host h2 is gone: last heard 1m30s ago (2026-01-02T03:04:05Z)"; s != want {
		t.Errorf("gone: %q, want %q", s, want)
	}
	if s := hostAway("h2", hostStale, time.Time{}, t0); !strings.Contains(s, "host h2 is stale: not heard since") {
		t.Errorf("stale, never heard: %q", s)
	}
}
