package gateway_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// twoHosts starts h1 and h2 on the private broker, enrolled with each other.
func twoHosts(t *testing.T) (*testGW, *testGW) {
	t.Helper()
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := newConfigOnly(t, dir, "h1", url)
	h2 := newConfigOnly(t, dir, "h2", url)
	enrol(t, h1, h2)
	for _, g := range []*testGW{h1, h2} {
		g.start()
		t.Cleanup(func() {
			g.stop()
			g.noPermissionErrors()
		})
	}
	return h1, h2
}

// newConfigOnly prepares a gateway without starting it.
func newConfigOnly(t *testing.T, dir, host, url string) *testGW {
	return &testGW{t: t, Host: host, Cfg: newConfig(t, dir, host, settings{"broker": url}), logs: &syncBuffer{}}
}

// resolves waits until g's roster view resolves name.
func (g *testGW) resolves(name string) {
	g.t.Helper()
	eventually(g.t, "roster of "+g.Host+" has "+name, func() error {
		resp, err := g.call("", &api.RosterRequest{})
		if err != nil {
			return err
		}
		for _, r := range resp.Entities {
			if r.Name+"@"+r.Host == name {
				return nil
			}
		}
		return errors.New("not yet")
	})
}

// Across hosts through the broker: by name once presence has it, a reply
// back along the same trace, and the sender's record told by a receipt.
func TestCrossHostConversation(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, bob := h1.join("alice"), h2.join("bob")
	h1.resolves("bob@h2")
	s := alice.mustSend("bob", "across")
	if s.Recipient != "bob@h2" || s.Gid != bob.Gid {
		t.Fatalf("sent: %+v", s)
	}
	var got []api.Delivery
	eventually(t, "bob has the message", func() error {
		got = append(got, bob.recv()...)
		if len(got) == 0 {
			return errors.New("nothing yet")
		}
		return nil
	})
	if b := bodies(got); !slices.Equal(b, []string{"across"}) || got[0].Envelope.Sender.String() != "alice@h1" {
		t.Fatalf("bob got %v from %v", b, got[0].Envelope.Sender)
	}
	eventually(t, "the receipt reaches h1", func() error {
		resp, err := h1.call(alice.Token, &api.LookupRequest{MsgID: s.MsgID})
		if err != nil {
			return err
		}
		if resp.Record.State != "delivered" {
			return errors.New(resp.Record.State)
		}
		return nil
	})
	r, err := h2.call(bob.Token, &api.SendRequest{ReplyTo: s.MsgID, Body: "back"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Sent.TraceID != s.TraceID {
		t.Errorf("reply trace %s, want the send's %s", r.Sent.TraceID, s.TraceID)
	}
	eventually(t, "alice has the reply", func() error {
		if b := bodies(alice.recv()); len(b) == 0 {
			return errors.New("nothing yet")
		} else if b[0] != "back" {
			t.Fatalf("alice got %v", b)
		}
		return nil
	})
	_, err = alice.send("h2.01a22a93-8b62-7719-997e-dae6eae12382", "to nobody")
	faultOf(t, err, fault.NoRecipient)
}

// An untrusted host's messages are refused: without enrolment, h2 admits
// nothing from h1, lists h1 as untrusted, and bob gets nothing.
func TestCrossHostUntrustedRefused(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := startGW(t, dir, "h1", settings{"broker": url})
	h2 := startGW(t, dir, "h2", settings{"broker": url})
	alice, bob := h1.join("alice"), h2.join("bob")
	h2.waitLog(`"msg":"no host is trusted`)
	alice.mustSend(bob.Gid, "not admitted")
	h2.waitLog(`"msg":"message refused: untrusted_host; sent to bridge.dlq"`)
	if got := bob.recv(); len(got) != 0 {
		t.Fatalf("bob got %v from an untrusted host", bodies(got))
	}
	eventually(t, "h2 lists h1 as untrusted", func() error {
		resp, err := h2.call("", &api.RosterRequest{})
		if err != nil {
			return err
		}
		for _, r := range resp.Entities {
			if r.Host == "h1" && r.Status == "untrusted" && r.Name == "" {
				return nil
			}
			if r.Host == "h1" && r.Name != "" {
				t.Fatalf("an entity of untrusted h1 in the view: %+v", r)
			}
		}
		return errors.New("not listed")
	})
	if strings.Contains(h2.logs.String(), `"entity":"alice"`) {
		t.Error("h2 logged alice, an entity it should not believe")
	}
}
