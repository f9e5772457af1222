package dlqapp

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/envelope"
)

func deadEnv(id, recipient, senderHost string, kind envelope.Kind) *envelope.Envelope {
	return &envelope.Envelope{MsgID: id, Kind: kind,
		Sender:    envelope.Party{Gid: senderHost + ".01a233c4-f8ce-72df-a558-aa7704cf0d08", Host: senderHost},
		Recipient: envelope.Party{Gid: recipient}}
}

func copyOf(where string, env *envelope.Envelope, reason, host string, index int) *Entry {
	e := &Entry{MsgID: env.MsgID, Kind: string(env.Kind), Reason: reason, Where: where, Host: host, Envelope: env, index: index,
		Sender: fleetcli.PartyFrom(env.Sender), Recipient: fleetcli.PartyFrom(env.Recipient)}
	return e
}

func join(copies ...*Entry) []*letter { return group(copies) }

// A death in this host's store and its copy in bridge.dlq are one letter
// with both sources; the same msg id from another host, or to another
// recipient, is another; a copy that is no envelope is a letter alone.
func TestOneRowPerLetter(t *testing.T) {
	bob := "h2.01a233c5-3295-7a3e-9767-16cb1d5365f3"
	carol := "h2.01a233c5-3306-7534-ad56-0520f372c380"
	env := deadEnv("01a233c5-3446-752d-af6f-b75df85f1568", bob, "h1", envelope.Send)
	stored := copyOf(whereStore, env, "expired in the broker: the recipient's gateway did not take it within inbox-ttl", "h2", 0)
	inDLQ := copyOf(whereDLQ, deadEnv(env.MsgID, bob, "h1", envelope.Send), "expired in the broker", "h2", 0)
	otherHost := copyOf(whereDLQ, deadEnv(env.MsgID, bob, "h3", envelope.Send), "not authentic: untrusted host", "h2", 1)
	otherRecipient := copyOf(whereDLQ, deadEnv(env.MsgID, carol, "h1", envelope.Send), "expired in the broker", "h2", 2)
	poison1 := &Entry{MsgID: "raw", Where: whereDLQ, Raw: "x", index: 3}
	poison2 := &Entry{MsgID: "raw", Where: whereDLQ, Raw: "x", index: 4}
	letters := join(stored, inDLQ, otherHost, otherRecipient, poison1, poison2)
	if len(letters) != 5 {
		t.Fatalf("%d letters, want 5", len(letters))
	}
	row := letters[0].row(false)
	if !slices.Equal(row.Sources, []string{whereStore, whereDLQ}) || row.Where != whereStore || row.Reason != stored.Reason ||
		row.Envelope != nil || row.Host != "h2" {
		t.Fatalf("row %+v", row)
	}
	if full := letters[0].row(true); full.Envelope == nil {
		t.Fatal("show's row has no envelope")
	}
	// a filter matches either copy's words
	if !letters[0].selected(&filter{reason: "EXPIRED IN THE BROKER: THE"}) || !letters[0].selected(&filter{reason: "in the broker"}) {
		t.Fatal("a reason filter missed a copy's words")
	}
	if letters[0].selected(&filter{kind: "presence"}) || !letters[0].selected(&filter{kind: "send"}) {
		t.Fatal("the kind filter")
	}
	if !letters[0].selected(&filter{ids: map[string]bool{env.MsgID: true}}) || letters[0].selected(&filter{ids: map[string]bool{"x": true}}) {
		t.Fatal("the id filter")
	}
	if letters[0].stored() != stored || letters[1].stored() != nil {
		t.Fatal("stored copy")
	}
	if row := letters[1].row(false); !slices.Equal(row.Sources, []string{whereDLQ}) || row.Where != whereDLQ {
		t.Fatalf("bridge.dlq-only row %+v", row)
	}
}

// --as: only what the proven entity sent or was sent.
func TestMine(t *testing.T) {
	env := deadEnv("01a233c5-3446-752d-af6f-b75df85f1568", "h2.01a233c5-3295-7a3e-9767-16cb1d5365f3", "h1", envelope.Send)
	l := join(copyOf(whereStore, env, "r", "h2", 0))[0]
	for _, c := range []struct {
		gid  string
		want bool
	}{{env.Sender.Gid, true}, {env.Recipient.Gid, true}, {"h1.01a233d7-5dd4-7d2c-a673-857347faf342", false}} {
		s := &sources{as: &api.EntityRow{Gid: c.gid}}
		if s.mine(l) != c.want {
			t.Errorf("mine for %s: %v", c.gid, !c.want)
		}
	}
	if !(&sources{}).mine(l) {
		t.Error("without --as every letter is shown")
	}
}

func TestBrokerDeathHost(t *testing.T) {
	for reason, want := range map[string]bool{
		"expired in the broker: the recipient's gateway did not take it within inbox-ttl": true,
		"dropped by the broker: the inbox was full":                                       true,
		"inbox full: the broker refused it":                                               false,
		"delivery failed 1 times":                                                         false,
	} {
		if brokerDeath(reason) != want {
			t.Errorf("%q: %v", reason, !want)
		}
	}
}

// A sealed copy read without a gateway to open it: its metadata, marked
// sealed and not readable, never its sealed bytes; --json says so.
func TestSealedCopyWithoutGateway(t *testing.T) {
	env := deadEnv("01a233c5-3446-752d-af6f-b75df85f1568", "h2.01a233c5-3295-7a3e-9767-16cb1d5365f3", "h1", envelope.Send)
	env.Sealed = []byte("fsl1 sealed bytes")
	e := copyOf(whereDLQ, env, "expired in the broker", "h2", 0)
	(&sources{}).unseal(e, nil)
	if !e.Sealed || e.Readable == nil || *e.Readable || e.Envelope.Sealed != nil || e.Envelope.Body != "" ||
		!strings.Contains(e.Note, "text not readable here") {
		t.Fatalf("a sealed copy without a gateway: %+v", e)
	}
	var out bytes.Buffer
	if err := fleetcli.PrintJSON(&out, join(e)[0].row(false)); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, `"sealed":true`) || !strings.Contains(s, `"readable":false`) {
		t.Fatalf("--json: %s", s)
	}
	plain := copyOf(whereDLQ, deadEnv("01a233c5-3446-752d-af6f-b75df85f1569", "h2.01a233c5-3295-7a3e-9767-16cb1d5365f3", "h1", envelope.Send), "r", "h2", 1)
	(&sources{}).unseal(plain, nil)
	if plain.Sealed || plain.Readable != nil || plain.Note != "" {
		t.Fatalf("a plain copy: %+v", plain)
	}
}
