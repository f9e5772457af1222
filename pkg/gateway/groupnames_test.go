package gateway_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
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
	alice := h1.join("alice", api.JoinRequest{Mode: "pull", Groups: []string{"ops"}})
	usage := func(what string, req api.Request) {
		t.Helper()
		_, err := h1.call(alice.Token, req)
		if fe := faultOf(t, err, fault.Usage); fe.Kind != fault.KindUsage || !strings.Contains(fe.Msg, "not a valid group name") {
			t.Errorf("%s: %v (%s), want a usage error naming the group", what, fe, fe.Kind)
		}
	}
	for _, g := range badGroups {
		usage("broadcast to "+g, &api.BcastRequest{Group: g, Body: "hello"})
		usage("join with "+g, &api.JoinRequest{Name: "carol", Mode: "pull", Groups: []string{"ops", g}})
		usage("group --add "+g, &api.GroupsRequest{Name: "alice", Add: []string{g}})
		usage("spawn with "+g, &api.SpawnRequest{Name: "carol", Host: "h2", Groups: []string{g}})
	}
	if _, err := h1.call("", &api.JoinRequest{Name: "carol", Mode: "pull", Groups: []string{"all"}}); codeOf(err) != fault.Usage {
		t.Errorf("join with group all: %v, want 64", err)
	}
	if r := h1.rowOf("carol", "h1"); r != nil {
		t.Errorf("carol registered by a refused join: %+v", r)
	}
	if r := h1.rowOf("alice", "h1"); r == nil || strings.Join(r.Groups, ",") != "ops" {
		t.Errorf("alice after refused group changes: %+v", r)
	}
}

// Defence in depth: a publish the broker refuses (here the operator took
// broadcast keys from h1's own login) costs neither the connection nor
// the other sends. The broadcast fails at once, 77, and is not tried
// again; a send to another host right after it is confirmed; the cause is
// logged once, however often the broadcast is repeated.
func TestCrossRefusedPublishKeepsTheConnection(t *testing.T) {
	h1, h2 := twoHosts(t)
	h1.refusalsExpected = true
	alice := h1.join("alice")
	bob := h2.join("bob", api.JoinRequest{Mode: "pull", Groups: []string{"ops"}})
	h1.resolves("bob@h2")
	alice.mustSend(bob.Gid, "before")

	vhost := h1.Cfg.Broker[strings.LastIndex(h1.Cfg.Broker, "/")+1:]
	own := broker.HostGrant(vhost, "h1").Topics[0]
	if own.Exchange != broker.ExMsg {
		t.Fatalf("h1's first topic grant is on %s", own.Exchange)
	}
	if out, err := testnode.Ctl("set_topic_permissions", "-p", vhost, broker.HostUser(vhost, "h1"), broker.ExMsg,
		`^(h[0-9]\.[0-9a-f-]{36}|fleet\.dead\.h1)$`, own.Read); err != nil {
		t.Fatalf("set_topic_permissions: %v\n%s", err, out)
	}

	const rounds = 4
	for i := range rounds {
		_, err := h1.call(alice.Token, &api.BcastRequest{Group: "ops", Body: "refused"})
		if fe := faultOf(t, err, fault.Refused); fe.Kind != fault.KindBrokerLogin ||
			!strings.Contains(fe.Msg, "broadcast.ops") || !strings.Contains(fe.Hint, "broker-setup --host h1") {
			t.Fatalf("round %d: the refused broadcast: %v (%s, hint %q)", i, fe, fe.Kind, fe.Hint)
		}
		if _, err := alice.send(bob.Gid, "right after"); err != nil {
			t.Fatalf("round %d: the send right after: %v\n%s", i, err, h1.logs)
		}
	}
	// all of them, in order, and not the broadcast
	bob.collect("before", "right after", "right after", "right after", "right after")
	logs := h1.logs.String()
	if n := strings.Count(logs, "the broker closed the publishing channel"); n != 1 {
		t.Errorf("the channel's close logged %d times in %d refusals, want once:\n%s", n, rounds, logs)
	}
	if !strings.Contains(logs, "ACCESS_REFUSED") || !strings.Contains(logs, "broadcast.ops") {
		t.Errorf("the log does not say what the broker refused:\n%s", logs)
	}
	if strings.Contains(logs, "broker connection lost") {
		t.Errorf("a refused publish cost the connection:\n%s", logs)
	}
}
