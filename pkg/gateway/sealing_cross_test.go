package gateway_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
)

// Issue 27 point 6 through real gateways and the private broker: a
// message signed by a trusted host but sealed to another host, one whose
// sealed bytes were altered (and signed again by the trusted key), and
// one in the clear from a host plaintext-hosts does not name are each
// refused to bridge.dlq with their reason, never delivered; a real send
// after them is sealed, opened and delivered.
func TestCrossSealedRefusals(t *testing.T) {
	da, db, dd := threeHosts(t, nil)
	alice, full := da.join("alice"), dd.join("full")
	da.resolves("full@dd")
	msg := func(body string) *envelope.Envelope {
		return envelope.New(envelope.Send, envelope.Party{Gid: alice.Gid, Name: alice.Name, Host: "da"},
			envelope.Party{Gid: full.Gid, Name: full.Name, Host: "dd"}, body)
	}

	elsewhere := msg("sealed to db, routed to dd")
	sealAs(t, da, elsewhere, db)
	raw, sig := signAs(t, da, elsewhere)
	publishBytes(t, da, full, elsewhere, raw, sig)
	dd.waitLog(`"msg":"message refused: sealed_elsewhere; sent to bridge.dlq"`)
	if c := dlqCopy(t, elsewhere.MsgID); c.Headers["fleet-reason"] != broker.ReasonSealedElsewhere || c.Headers["fleet-refused-by"] != "dd" {
		t.Fatalf("the copy in bridge.dlq: %v", c.Headers)
	}

	tampered := msg("sealed to dd, then altered")
	sealAs(t, da, tampered, dd)
	tampered.Sealed[len(tampered.Sealed)-5] ^= 0x01
	raw, sig = signAs(t, da, tampered) // signed again: authentic, but altered
	publishBytes(t, da, full, tampered, raw, sig)
	dd.waitLog(`"msg":"message refused: tampered; sent to bridge.dlq"`)
	if c := dlqCopy(t, tampered.MsgID); c.Headers["fleet-reason"] != broker.ReasonTampered {
		t.Fatalf("the copy in bridge.dlq: %v", c.Headers)
	}

	plain := msg("in the clear")
	raw, sig = signAs(t, da, plain)
	publishBytes(t, da, full, plain, raw, sig)
	dd.waitLog(`"msg":"message refused: unsealed; sent to bridge.dlq"`)
	c := dlqCopy(t, plain.MsgID)
	if c.Headers["fleet-reason"] != broker.ReasonUnsealed {
		t.Fatalf("the copy in bridge.dlq: %v", c.Headers)
	}

	alice.mustSend(full.Gid, "sealed, opened, delivered")
	got := full.collect("sealed, opened, delivered")
	for _, d := range got {
		if strings.Contains(d.Envelope.Body, "routed to dd") || strings.Contains(d.Envelope.Body, "altered") || d.Envelope.Body == "in the clear" {
			t.Fatalf("full got a refused message: %+v", d.Envelope)
		}
	}
	full.empty(alice)
}

// Issue 36: a host drops a sealed broadcast copy it cannot open only
// when the sending host's signed envelope names that very inbox in
// clear_gids (its member has a copy in the clear). Named after signing
// (the signature no longer holds), or naming another inbox, the copy is
// refused to bridge.dlq as before, loudly; a dropped copy has none.
func TestCrossSealedDropNeedsTheSignature(t *testing.T) {
	da, db, dd := threeHosts(t, nil)
	alice, full := da.join("alice"), dd.join("full")
	da.resolves("full@dd")
	bcast := func(body string, clear ...string) *envelope.Envelope {
		env := envelope.New(envelope.Broadcast, envelope.Party{Gid: alice.Gid, Name: alice.Name, Host: "da"},
			envelope.Party{Group: "all"}, body)
		sealAs(t, da, env, db) // not to dd: it cannot open it
		env.ClearGids = clear
		return env
	}

	unsigned := bcast("clear_gids added after signing")
	_, sig := signAs(t, da, unsigned)
	unsigned.ClearGids = []string{full.Gid}
	raw, err := envelope.Encode(unsigned)
	if err != nil {
		t.Fatal(err)
	}
	publishBytes(t, da, full, unsigned, raw, sig)
	dd.waitLog(`"msg":"message refused: bad_signature; sent to bridge.dlq"`)
	if c := dlqCopy(t, unsigned.MsgID); c.Headers["fleet-reason"] != broker.ReasonForged {
		t.Fatalf("the copy in bridge.dlq: %v", c.Headers)
	}

	other := bcast("another inbox named", "dd.0c0ffee0-0000-4000-8000-00000000dead")
	raw, sig = signAs(t, da, other)
	publishBytes(t, da, full, other, raw, sig)
	dd.waitLog(`"msg":"message refused: sealed_elsewhere; sent to bridge.dlq"`)
	if c := dlqCopy(t, other.MsgID); c.Headers["fleet-reason"] != broker.ReasonSealedElsewhere {
		t.Fatalf("the copy in bridge.dlq: %v", c.Headers)
	}

	named := bcast("this inbox named, signed", full.Gid)
	raw, sig = signAs(t, da, named)
	publishBytes(t, da, full, named, raw, sig)
	dd.waitLog(`"msg":"message dropped: a sealed broadcast whose sender da sends this member its copy in the clear (clear_gids)"`)

	alice.mustSend(full.Gid, "sealed, opened, delivered")
	for _, d := range full.collect("sealed, opened, delivered") {
		if d.Envelope.Kind == envelope.Broadcast {
			t.Fatalf("full got a forged broadcast: %+v", d.Envelope)
		}
	}
	if inDLQ(t, named.MsgID) {
		t.Fatal("the dropped copy is in bridge.dlq")
	}
}

// inDLQ says whether bridge.dlq holds a copy of msgID (every message
// looked at is given back).
func inDLQ(t *testing.T, msgID string) bool {
	t.Helper()
	ch, done := brokerChannel(t)
	defer done()
	for {
		d, ok, err := ch.Get(broker.QDLQ, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return false
		}
		if d.MessageId == msgID {
			return true
		}
	}
}
