package gateway_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// rowOf returns g's roster row for name@host, or nil.
func (g *testGW) rowOf(name, host string) *api.EntityRow {
	g.t.Helper()
	resp := g.must("", &api.Request{Op: api.OpRoster})
	for _, r := range resp.Entities {
		if r.Name == name && r.Host == host {
			return &r
		}
	}
	return nil
}

// Presence (U5) across hosts: an entity that joins is in the other host's
// view with its groups and status; a status change follows; one that
// leaves is gone at once (its gone notice), and so is a host that stops
// cleanly (its leaving notice) — names no longer resolve to it. The same
// name on two hosts is ambiguous (64).
func TestCrossHostPresence(t *testing.T) {
	h1, h2 := twoHosts(t)
	bob := h2.join("bob", api.Request{Mode: "pull", Groups: []string{"ops"}})
	h1.resolves("bob@h2")
	if r := h1.rowOf("bob", "h2"); r.Gid != bob.Gid || len(r.Groups) != 1 || r.Groups[0] != "ops" || r.Status != "idle" || r.LastSeen.IsZero() {
		t.Fatalf("bob as h1 sees him: %+v", r)
	}
	h2.must(bob.Token, &api.Request{Op: api.OpStatus, Status: "busy"})
	eventually(t, "h1 sees bob busy", func() error {
		if r := h1.rowOf("bob", "h2"); r == nil || r.Status != "busy" {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	// the same name on both hosts
	h1.join("bob")
	carol := h1.join("carol")
	_, err := carol.send("bob", "which one?")
	faultOf(t, err, fault.Usage)
	carol.mustSend("bob@h2", "this one")
	// bob@h2 leaves: gone from h1's view at once
	h2.must("", &api.Request{Op: api.OpLeave, Name: "bob"})
	eventually(t, "h1 drops bob@h2", func() error {
		if r := h1.rowOf("bob", "h2"); r != nil {
			return errors.New("still there")
		}
		return nil
	})
	if s := carol.mustSend("bob", "now only one"); s.Recipient != "bob@h1" {
		t.Errorf("bob resolved to %s", s.Recipient)
	}
	// h2 stops cleanly: h1 drops the host at once, not after the TTL
	h2.join("dave")
	h1.resolves("dave@h2")
	h2.stop()
	h1.waitLog(`"msg":"host left the view: it stopped","host":"h1","peer":"h2"`)
	if r := h1.rowOf("dave", "h2"); r != nil {
		t.Errorf("dave@h2 still in h1's view after h2 left: %+v", r)
	}
	_, err = carol.send("dave", "anyone?")
	faultOf(t, err, fault.NoRecipient)
}
