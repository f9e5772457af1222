package broker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// The transport's pure parts; its network paths are exercised against the
// private node by pkg/gateway's TestCross… tests (go test -coverpkg
// ./pkg/broker ./pkg/gateway measures them).

func TestRedactDropsCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"amqps://gw-a:s3cret@broker:5671/fleet": "amqps://broker:5671/fleet",
		"amqp://127.0.0.1:5672/":                "amqp://127.0.0.1:5672/",
		"::not a url":                           "(unparsable broker URL)",
	} {
		if got := Redact(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInboxArgsNeverDropMail(t *testing.T) {
	a := inboxArgs(Limits{MaxLength: 10, TTL: 2 * time.Second})
	// no dead-letter key: a dead letter keeps the keys it was published
	// with, the sender's among them (SenderKey)
	if a["x-overflow"] != "reject-publish" || a["x-queue-type"] != "classic" || a["x-dead-letter-exchange"] != ExDead ||
		a["x-dead-letter-routing-key"] != nil {
		t.Errorf("inbox arguments %v", a)
	}
	if a["x-max-length"] != int64(10) || a["x-message-ttl"] != int64(2000) {
		t.Errorf("limits %v", a)
	}
	if b := inboxArgs(Limits{}); b["x-max-length"] != nil || b["x-message-ttl"] != nil {
		t.Errorf("no limits configured, yet %v", b)
	}
	keys := InboxKeys("g1", []string{"ops", "ci"})
	if strings.Join(keys, " ") != "g1 broadcast.all broadcast.ops broadcast.ci" {
		t.Errorf("keys %v", keys)
	}
}

// A decode failure is refused as what it is: a newer schema by its kind,
// anything else as the fallback; a verifier's own refusal keeps its reason.
func TestRefusalReasons(t *testing.T) {
	_, err := envelope.Decode([]byte(`{"v":"9.0"}`), 0)
	if r := asRefusal(err, ReasonMalformed); r.Reason != ReasonNewerSchema {
		t.Errorf("newer schema refused as %s", r.Reason)
	}
	_, err = envelope.Decode([]byte(`not json`), 0)
	if r := asRefusal(err, ReasonMalformed); r.Reason != ReasonMalformed {
		t.Errorf("garbage refused as %s", r.Reason)
	}
	own := Refuse(ReasonReplay, "old: %d", 7)
	if r := asRefusal(own, ReasonForged); r != own || r.Error() != "replay: old: 7" {
		t.Errorf("a refusal rewrapped: %v", r)
	}
	if r := asRefusal(errors.New("x"), ReasonForged); r.Reason != ReasonForged {
		t.Errorf("a plain error refused as %s", r.Reason)
	}
	if r := asRefusal(fault.New(fault.Data, fault.KindBadEnvelope, "bad"), ReasonMalformed); r.Reason != ReasonMalformed {
		t.Errorf("a bad envelope refused as %s", r.Reason)
	}
	if clip(strings.Repeat("é", 400), 501) != strings.Repeat("é", 250) {
		t.Errorf("clip cut a rune in half")
	}
}

func TestItoa(t *testing.T) {
	for n, want := range map[int64]string{0: "1", -5: "1", 1: "1", 42: "42", 1234567890: "1234567890"} {
		if got := itoa(n); got != want {
			t.Errorf("itoa(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestNodeURLsShareTheFirstLogin(t *testing.T) {
	got := nodeURLs("amqps://u:p@n1:5671/f, amqps://n2:5671/f,amqps://v:q@n3:5671/f")
	want := []string{"amqps://u:p@n1:5671/f", "amqps://u:p@n2:5671/f", "amqps://v:q@n3:5671/f"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("nodeURLs = %v, want %v", got, want)
	}
	if r := RedactAll("amqps://u:p@n1:5671/f,amqps://n2:5671/f"); strings.Contains(r, "p@") || !strings.Contains(r, "n2") {
		t.Errorf("RedactAll = %s", r)
	}
}
