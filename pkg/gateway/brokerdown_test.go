package gateway_test

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// downBroker is a broker URL nothing listens on: a gateway configured
// with it runs with its broker unreachable the whole time (no broker is
// needed to run these tests).
const downBroker = "amqp://guest:guest@127.0.0.1:1/"

// startDown starts a gateway whose broker is configured but unreachable.
func startDown(t *testing.T, set settings) *testGW {
	t.Helper()
	if set == nil {
		set = settings{}
	}
	set["broker"] = downBroker
	g := startGW(t, t.TempDir(), "h1", set)
	g.waitLog(`"msg":"broker unreachable"`)
	return g
}

// With the broker unreachable, everything on this host keeps working:
// sends, replies, asks, rendezvous, recv, delivery, groups.
func TestLocalBrokerDownLocalWorks(t *testing.T) {
	g := startDown(t, nil)
	alice, bob := g.join("alice"), g.join("bob")
	s := alice.mustSend("bob", "local while the broker is down")
	if s.State != "accepted" || s.Recipient != "bob@h1" {
		t.Fatalf("sent %+v", s)
	}
	bob.collect("local while the broker is down")
	r := bob.reply(s.MsgID, "still local")
	if r.Recipient != "alice@h1" {
		t.Fatalf("reply %+v", r)
	}
	alice.collect("still local")

	c, ask := alice.ask("bob", "q?", "", 10_000)
	bob.collect("q?")
	if a, err := bob.answer(ask.MsgID, "a!"); err != nil || a.State != "answered" {
		t.Fatalf("answer: %+v %v", a, err)
	}
	if a, err := second(t, c); err != nil || a.Body != "a!" {
		t.Fatalf("alice got %+v %v", a, err)
	}

	row, err := g.groups("bob", []string{"ops"}, nil)
	if err != nil || !slices.Equal(row.Groups, []string{"ops"}) {
		t.Fatalf("groups: %+v %v", row, err)
	}
	g.waitLog(`"msg":"inbox not rebound now; it will be on the next connection"`)
	rows := g.must("", &api.RosterRequest{}).Entities
	if len(rows) != 2 {
		t.Fatalf("roster %+v", rows)
	}
	setStatus(t, bob, "busy")
	setStatus(t, bob, "idle")
}

// What needs the broker says so with 69 and leaves nothing half done: a
// send or ask to another host's gid, a spawn on another host, a name not
// known here (it may be on a trusted host this gateway cannot hear); a
// name of this host that is not here, or on a host not trusted, is 67.
func TestLocalBrokerDownRemoteRefused(t *testing.T) {
	dir := t.TempDir()
	g := &testGW{t: t, Host: "h1", Cfg: newConfig(t, dir, "h1", settings{"broker": downBroker}), logs: &syncBuffer{}}
	enrol(t, g, &testGW{t: t, Host: "h2", Cfg: newConfig(t, dir, "h2", settings{"broker": downBroker}), logs: &syncBuffer{}})
	g.start()
	t.Cleanup(g.stop)
	g.waitLog(`"msg":"broker unreachable"`)
	alice, bob := g.join("alice"), g.join("bob")
	const remote = "h2.01a22a93-8b62-7719-997e-dae6eae12382"
	_, err := alice.send(remote, "to another host")
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != "broker_down" || !strings.Contains(fe.Hint, "local sends keep working") {
		t.Fatalf("send to a remote gid: %v (%s, hint %q)", fe, fe.Kind, fe.Hint)
	}
	_, err = alice.send("carol@h2", "by name") // never heard of, and h2 cannot be heard
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != "broker_down" {
		t.Fatalf("send to an unknown name with the broker down: %v (%s)", fe, fe.Kind)
	}
	_, err = alice.send("carol@h1", "this host's name") // exact
	faultOf(t, err, fault.NoRecipient)
	_, err = alice.send("carol@h9", "a host not trusted") // never heard
	faultOf(t, err, fault.NoRecipient)
	_, _, err = g.open(alice.Token, &api.AskRequest{To: remote, Body: "q", TimeoutMS: 1000})
	faultOf(t, err, fault.Unavailable)
	_, err = g.call(alice.Token, &api.SpawnRequest{Name: "w", Host: "h2", TimeoutMS: 1000})
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != "broker_down" {
		t.Fatalf("spawn on h2: %v (%s)", fe, fe.Kind)
	}
	_, err = alice.stopEntity(remote)
	faultOf(t, err, fault.NoRecipient) // not in the view
	_, err = g.call(alice.Token, &api.SendRequest{To: remote, Body: "x", Wait: true, TimeoutMS: 1000})
	faultOf(t, err, fault.Unavailable)
	// nothing of these reached bob, and alice's inbox is clean
	bob.empty(alice)
	alice.empty(bob)
}

// fleet-bcast with the broker down: this host's members get theirs, and
// the command exits 12 (local_only, not the cause's 69: a retry would
// give them a second copy) saying which part failed, with the msg id.
func TestLocalBrokerDownBroadcast(t *testing.T) {
	g := startDown(t, nil)
	main := g.join("main")
	r1 := g.join("r1", api.JoinRequest{Mode: "pull", Groups: []string{"reviewers"}})
	r2 := g.join("r2")
	resp, err := main.bcast("", "to all")
	fe := faultOf(t, err, fault.Partial)
	if fe.Kind != fault.KindLocalOnly || !strings.Contains(fe.Msg, "delivered to 2 member(s) on this host; other hosts not reached: broker") ||
		!strings.Contains(fe.Hint, "do not run fleet-bcast again") {
		t.Fatalf("bcast with the broker down: %v (%s, hint %q)", fe, fe.Kind, fe.Hint)
	}
	if resp == nil || resp.Sent == nil || resp.Sent.MsgID == "" || resp.Count != 2 {
		t.Fatalf("bcast with the broker down answered %+v: want the msg id and 2 local members with the failure", resp)
	}
	r1.collect("to all")
	r2.collect("to all")
	main.empty(r1)
	// no member here: only the broker could have reached anyone
	_, err = r1.bcast("reviewers", "only me here")
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != "broker_down" {
		t.Fatalf("bcast to a group with no other member here: %v (%s)", fe, fe.Kind)
	}
}

// fleet-roster leave and fleet-stop with the broker configured but
// unreachable are refused (69): the entity's inbox queue must go with it.
// The entity stays, with its mail and credential.
func TestLocalBrokerDownLeaveRefused(t *testing.T) {
	g := startDown(t, nil)
	alice, bob := g.join("alice"), g.join("bob")
	alice.mustSend("bob", "still here")
	_, err := g.call("", &api.LeaveRequest{Name: "bob"})
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != "broker_down" || !strings.Contains(fe.Hint, "once the broker is back") {
		t.Fatalf("leave: %v (%s, hint %q)", fe, fe.Kind, fe.Hint)
	}
	_, err = alice.stopEntity("bob")
	faultOf(t, err, fault.Unavailable)
	if resp, err := g.call(bob.Token, &api.WhoamiRequest{}); err != nil || resp.Entity.Gid != bob.Gid {
		t.Fatalf("bob after the refused leave: %+v %v", resp, err)
	}
	bob.collect("still here")
	if r, ok := g.rosterRow("bob"); !ok || r.Dead != 0 {
		t.Fatalf("bob row %+v %v", r, ok)
	}
}

// A plain amqp:// broker URI to an address that is not this machine is
// said loudly at start: the login and every message's routing would cross
// the network in clear (the text is sealed).
// (Here one of this machine's own non-loopback addresses, on a closed
// port, stands for "another machine"; a loopback URI, as every other test
// uses, is not warned about.)
func TestLocalBrokerInClearWarned(t *testing.T) {
	var ip net.IP
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("this machine has no non-loopback IPv4 address")
	}
	ln, err := net.Listen("tcp", ip.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a closed port: refused at once
	g := startGW(t, t.TempDir(), "h1", settings{"broker": "amqp://u:p@" + addr + "/"})
	g.waitLog(`"level":"WARN","msg":"the broker URI is amqp://, not amqps://: the broker login's password, entity names, ids and routing cross the network to ` + ip.String() + ` in clear`)
	down := startDown(t, nil)
	if strings.Contains(down.logs.String(), "in clear") {
		t.Error("a loopback broker URI was warned about")
	}
}
