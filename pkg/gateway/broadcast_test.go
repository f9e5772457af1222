package gateway_test

import (
	"slices"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// bcast is fleet-bcast as e.
func (e entity) bcast(group, body string) (*api.Response, error) {
	return e.gw.call(e.Token, &api.BcastRequest{Group: group, Body: body})
}

// groups is fleet-roster group NAME --add/--remove.
func (g *testGW) groups(name string, add, remove []string) (*api.EntityRow, error) {
	resp, err := g.call("", &api.GroupsRequest{Name: name, Add: add, Remove: remove})
	if err != nil {
		return nil, err
	}
	return resp.Entity, nil
}

// A broadcast on one host: every member gets one copy, the sender none; a
// group reaches its members only; membership changes apply to what is
// broadcast after; a reply to a broadcast is an ordinary reply.
func TestLocalBroadcast(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	main := g.join("main")
	r1 := g.join("r1", api.JoinRequest{Mode: "pull", Groups: []string{"reviewers"}})
	r2 := g.join("r2", api.JoinRequest{Mode: "pull", Groups: []string{"reviewers", "ci"}})
	other := g.join("other")

	resp, err := main.bcast("", "everyone: report")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 3 || resp.Sent.Recipient != "broadcast.all" || resp.Sent.State != "accepted" {
		t.Fatalf("bcast all: count %d, %+v", resp.Count, resp.Sent)
	}
	for _, e := range []entity{r1, r2, other} {
		got := e.collect("everyone: report")[0].Envelope
		if got.Kind != envelope.Broadcast || got.MsgID != resp.Sent.MsgID || got.Recipient.Group != "all" ||
			got.Recipient.Gid != e.Gid || got.Sender.Gid != main.Gid {
			t.Fatalf("%s got %+v", e.Name, got)
		}
	}
	main.empty(other) // not to the sender

	resp, err = r1.bcast("reviewers", "PR 42 is ready")
	if err != nil || resp.Count != 1 || resp.Sent.Recipient != "broadcast.reviewers" {
		t.Fatalf("bcast reviewers: %+v %v", resp, err)
	}
	r2.collect("PR 42 is ready")
	r1.empty(main)
	other.empty(main)

	// a reply to a broadcast goes to its sender, in its trace
	rep, err := g.call(r2.Token, &api.SendRequest{ReplyTo: resp.Sent.MsgID, Body: "on it"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent.Recipient != "r1@h1" || rep.Sent.TraceID != resp.Sent.TraceID {
		t.Fatalf("reply to a broadcast: %+v", rep.Sent)
	}
	if got := r1.collect("on it")[0].Envelope; got.Kind != envelope.Reply || got.InReplyTo != resp.Sent.MsgID {
		t.Fatalf("r1 got %+v", got)
	}

	row, err := g.groups("other", []string{"reviewers", "reviewers"}, nil)
	if err != nil || !slices.Equal(row.Groups, []string{"reviewers"}) {
		t.Fatalf("other joins reviewers: %+v %v", row, err)
	}
	row, err = g.groups("r1", nil, []string{"reviewers"})
	if err != nil || len(row.Groups) != 0 || row.Groups == nil {
		t.Fatalf("r1 leaves reviewers: %+v %v", row, err)
	}
	if r, _ := g.rosterRow("r2"); !slices.Equal(r.Groups, []string{"reviewers", "ci"}) {
		t.Fatalf("r2 row %+v", r)
	}
	resp, err = main.bcast("reviewers", "round two")
	if err != nil || resp.Count != 2 {
		t.Fatalf("bcast reviewers again: %+v %v", resp, err)
	}
	r2.collect("round two")
	other.collect("round two")
	r1.empty(main)

	// the groups survive a restart
	g.restart()
	if r, _ := g.rosterRow("other"); !slices.Equal(r.Groups, []string{"reviewers"}) {
		t.Fatalf("other row after restart %+v", r)
	}
	if resp, err := main.bcast("ci", "ci only"); err != nil || resp.Count != 1 {
		t.Fatalf("bcast ci: %+v %v", resp, err)
	}
	r2.collect("ci only")
}

// Refusals: a group nobody is in (67), a group with the sender as its
// only member (67), bad bodies and groups.
func TestLocalBroadcastRefusals(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"max-body": "32"})
	solo := g.join("solo", api.JoinRequest{Mode: "pull", Groups: []string{"lonely"}})
	other := g.join("other")
	for _, c := range []struct {
		name        string
		tok         string
		group, body string
		exit        fault.Code
	}{
		{"no members", solo.Token, "nobody", "hello", fault.NoRecipient},
		{"only the sender", solo.Token, "lonely", "hello", fault.NoRecipient},
		{"empty body", solo.Token, "", " ", fault.Data},
		{"oversized body", solo.Token, "", "0123456789012345678901234567890123", fault.Data},
		{"no credential", "", "", "hello", fault.Refused},
	} {
		_, err := g.call(c.tok, &api.BcastRequest{Group: c.group, Body: c.body})
		if codeOf(err) != c.exit {
			t.Errorf("%s: %v, want exit %d", c.name, err, c.exit)
		}
	}
	for _, c := range []struct {
		name, who   string
		add, remove []string
		exit        fault.Code
	}{
		{"unknown entity", "nobody", []string{"x"}, nil, fault.NoRecipient},
		{"group all", "other", []string{"all"}, nil, fault.Usage},
		{"bad group", "other", []string{"a b"}, nil, fault.Usage},
	} {
		_, err := g.groups(c.who, c.add, c.remove)
		if codeOf(err) != c.exit {
			t.Errorf("%s: %v, want exit %d", c.name, err, c.exit)
		}
	}
	if r, _ := g.rosterRow("other"); len(r.Groups) != 0 {
		t.Errorf("refused group changes left %v", r.Groups)
	}
	other.empty(solo)
}
