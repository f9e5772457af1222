package gateway_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// badGroups are group names outside the grammar, each a routing key a
// host's own broker login may not publish or bind (broker.HostGrant).
var badGroups = []string{"x y", "#", "*", "ops.*", "broadcast.ops", "a.b", "-ops", "9ops", "ops\n", strings.Repeat("g", 65)}

// The socket API holds every group name to the grammar, as the commands
// do: a broadcast, a join, a group change and a spawn naming a bad one are
// usage errors (64), and nothing is registered, bound or sent.
func TestGroupNamesRefusedAtTheSocket(t *testing.T) {
	h1 := startGW(t, t.TempDir(), "h1", nil)
	alice := h1.join("alice", api.Request{Mode: "pull", Groups: []string{"ops"}})
	usage := func(what string, req *api.Request) {
		t.Helper()
		_, err := h1.call(alice.Token, req)
		if fe := faultOf(t, err, fault.Usage); fe.Kind != fault.KindUsage || !strings.Contains(fe.Msg, "not a valid group name") {
			t.Errorf("%s: %v (%s), want a usage error naming the group", what, fe, fe.Kind)
		}
	}
	for _, g := range badGroups {
		usage("broadcast to "+g, &api.Request{Op: api.OpBcast, Group: g, Body: "hello"})
		usage("join with "+g, &api.Request{Op: api.OpJoin, Name: "carol", Mode: "pull", Groups: []string{"ops", g}})
		usage("group --add "+g, &api.Request{Op: api.OpGroups, Name: "alice", Add: []string{g}})
		usage("spawn with "+g, &api.Request{Op: api.OpSpawn, Name: "carol", Host: "h2", Groups: []string{g}})
	}
	if _, err := h1.call("", &api.Request{Op: api.OpJoin, Name: "carol", Mode: "pull", Groups: []string{"all"}}); codeOf(err) != fault.Usage {
		t.Errorf("join with group all: %v, want 64", err)
	}
	if r := h1.rowOf("carol", "h1"); r != nil {
		t.Errorf("carol registered by a refused join: %+v", r)
	}
	if r := h1.rowOf("alice", "h1"); r == nil || strings.Join(r.Groups, ",") != "ops" {
		t.Errorf("alice after refused group changes: %+v", r)
	}
}
