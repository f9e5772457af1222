package gateway_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// fleet-roster leave: what waits is dead-lettered ("recipient left the
// fleet") and each sender gets a BOUNCE; the credential and its file die.
func TestLocalLeave(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	cred := filepath.Join(g.Cfg.StateDir, "credentials", "bob.token")
	if _, err := os.Stat(cred); err != nil {
		t.Fatalf("credential file: %v", err)
	}
	s1 := alice.mustSend("bob", "one")
	s2 := alice.mustSend("bob", "two")
	resp := g.must("", &api.LeaveRequest{Name: "bob"})
	if resp.Count != 2 {
		t.Fatalf("leave dead-lettered %d, want 2", resp.Count)
	}
	got := alice.collect(
		"your message "+s1.MsgID+" to bob@h1 was dead-lettered: recipient left the fleet",
		"your message "+s2.MsgID+" to bob@h1 was dead-lettered: recipient left the fleet")
	for i, s := range []*api.Sent{s1, s2} {
		if b := got[i].Envelope; b.Kind != envelope.Bounce || b.InReplyTo != s.MsgID {
			t.Fatalf("bounce %d: %+v", i, b)
		}
		if rec := alice.record(s.MsgID); rec.State != "dead" || rec.Reason != "recipient left the fleet" {
			t.Fatalf("record %d: %+v", i, rec)
		}
	}
	dead := g.must("", &api.DeadRequest{})
	var ids []string
	for _, d := range dead.Dead {
		ids = append(ids, d.Record.MsgID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{s1.MsgID, s2.MsgID}) {
		t.Fatalf("dead letters %v", ids)
	}
	_, err := g.call(bob.Token, &api.WhoamiRequest{})
	faultOf(t, err, fault.Refused)
	if _, err := os.Stat(cred); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("credential file after leave: %v", err)
	}
	if _, ok := g.rosterRow("bob"); ok {
		t.Error("bob still in the roster")
	}
	_, err = alice.send("bob", "after")
	faultOf(t, err, fault.NoRecipient)
	_, err = g.call("", &api.LeaveRequest{Name: "bob"})
	faultOf(t, err, fault.NoRecipient)
	// the name is free again, with a new gid
	bob2 := g.join("bob")
	if bob2.Gid == bob.Gid {
		t.Fatal("a rejoined name kept its gid")
	}
	bob2.empty(alice)
}

// whoami and the roster: the caller's row, and every entity's exact row.
func TestLocalWhoamiRoster(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "h1", nil)
	alice := g.join("alice", api.JoinRequest{Mode: "pull", Groups: []string{"a", "b"}, Nudge: "true"})
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat > /dev/null"})
	resp := g.must(alice.Token, &api.WhoamiRequest{})
	if w := resp.Entity; w.Name != "alice" || w.Gid != alice.Gid || w.Host != "h1" || w.Mode != "pull" ||
		!slices.Equal(w.Groups, []string{"a", "b"}) || w.Status != "idle" {
		t.Fatalf("whoami %+v", w)
	}
	_, err := g.call("", &api.WhoamiRequest{})
	faultOf(t, err, fault.Refused)
	_, err = g.call("not-a-token", &api.WhoamiRequest{})
	faultOf(t, err, fault.Refused)

	setStatus(t, hook, "busy")
	hook.mustSend("alice", "x")
	hook.mustSend("alice", "y")
	alice.mustSend("hook", "held")
	rows := g.must("", &api.RosterRequest{}).Entities
	if len(rows) != 2 {
		t.Fatalf("roster %+v", rows)
	}
	byName := map[string]api.EntityRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	if a := byName["alice"]; a.Gid != alice.Gid || a.Pending != 2 || a.Status != "idle" || a.Target != "" || a.Host != "h1" {
		t.Errorf("alice row %+v", a)
	}
	if h := byName["hook"]; h.Gid != hook.Gid || h.Pending != 1 || h.Status != "busy" || h.Target != "cat > /dev/null" ||
		h.Mode != "inject" || h.Groups == nil || len(h.Groups) != 0 {
		t.Errorf("hook row %+v", h)
	}
	alice.collect("x", "y")
	r, _ := g.rosterRow("alice")
	if r.Pending != 0 || r.LastDelivery.IsZero() {
		t.Errorf("alice row after recv %+v", r)
	}
}

// A restart after a clean stop: entities, their credentials, waiting mail
// (pull and inject), dead letters and records are all still there, once;
// nothing is reported uncertain.
func TestLocalRestartRecovery(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", settings{"delivery-attempts": "1"})
	alice, bob := g.join("alice"), g.join("bob")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out})
	broken := g.join("broken", api.JoinRequest{Mode: "inject", Exec: "exit 1"})
	setStatus(t, hook, "busy")
	s1 := alice.mustSend("bob", "for bob")
	alice.mustSend("hook", "for hook")
	sd := alice.mustSend("broken", "dies")
	alice.waitState(sd.MsgID, "dead")
	g.restart()
	for _, e := range []entity{alice, bob, hook, broken} {
		resp, err := g.call(e.Token, &api.WhoamiRequest{})
		if err != nil || resp.Entity.Gid != e.Gid {
			t.Fatalf("%s after restart: %+v %v", e.Name, resp, err)
		}
	}
	bob.collect("for bob")
	setStatus(t, hook, "idle")
	if b := envBodies(waitLines(t, out, 1)); !slices.Equal(b, []string{"for hook"}) {
		t.Fatalf("hook got %q", b)
	}
	if rec := alice.waitState(s1.MsgID, "delivered"); rec.Attempts != 1 {
		t.Errorf("record %+v", rec)
	}
	if d := g.must("", &api.DeadRequest{}).Dead; len(d) != 1 || d[0].Record.MsgID != sd.MsgID {
		t.Fatalf("dead letters after restart %+v", d)
	}
	// the bounce from before the restart, once
	alice.collect("your message " + sd.MsgID + " to broken@h1 was dead-lettered: delivery failed 1 times: exec adapter: exit status 1 (no stderr)")
	if strings.Contains(g.logs.String(), "uncertain") {
		t.Error("a clean restart reported uncertain deliveries")
	}
	// a second gateway on the same state folder is refused while this runs
	other := &testGW{t: t, Host: "h1", Cfg: newConfig(t, dir, "h1", settings{"socket": filepath.Join(dir, "other.sock")}), logs: &syncBuffer{}}
	other.Cfg.StateDir = g.Cfg.StateDir
	if err := runOnce(other); codeOf(err) != fault.Conflict || fault.KindOf(err) != fault.KindGatewayLocked {
		t.Fatalf("second gateway on the same state folder: %v", err)
	}
}
