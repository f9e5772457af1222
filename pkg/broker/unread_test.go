package broker

import (
	"testing"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A delivery whose body this build cannot read says where a refusal
// notice may go only when its parts agree (unreadHead).
func TestUnreadHead(t *testing.T) {
	const bob = "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77"
	const alice = "h1.01a23400-3365-77d8-a646-15bd4b212402"
	id := envelope.NewID()
	q := InboxQueue(bob)
	newer := []byte(`{"v":"2.0","msg_id":"` + id + `","kind":"SEND","sender":{"gid":"` + alice + `"},"parts":[]}`)
	d := amqp.Delivery{MessageId: id, Type: "SEND", Body: newer, Headers: amqp.Table{"fleet-trace-id": "t1"}}
	env := unreadHead(d, q, "h1")
	if env == nil || env.MsgID != id || env.Kind != envelope.Send || env.Sender.Gid != alice || env.Sender.Host != "h1" || env.Recipient.Gid != bob || env.TraceID != "t1" {
		t.Fatalf("a newer schema's head: %+v", env)
	}
	// the header alone, with a body that is not JSON
	d = amqp.Delivery{MessageId: id, Type: "SEND", Body: []byte("\xff not json"), Headers: amqp.Table{"fleet-sender": alice}}
	if env := unreadHead(d, q, "h1"); env == nil || env.Sender.Gid != alice {
		t.Fatalf("the fleet-sender header: %+v", env)
	}
	for name, d := range map[string]amqp.Delivery{
		"no sender":           {MessageId: id, Type: "SEND", Body: []byte("x")},
		"not a msg id":        {MessageId: "raw", Type: "SEND", Body: []byte("x"), Headers: amqp.Table{"fleet-sender": alice}},
		"header and body":     {MessageId: id, Type: "SEND", Body: newer, Headers: amqp.Table{"fleet-sender": "h1.01a23400-3365-77d8-a646-15bd4b212403"}},
		"message id and body": {MessageId: envelope.NewID(), Type: "SEND", Body: newer},
		"not a kind":          {MessageId: id, Type: "NOPE", Body: []byte("x"), Headers: amqp.Table{"fleet-sender": alice}},
	} {
		if env := unreadHead(d, q, "h1"); env != nil {
			t.Errorf("%s: %+v, want nil", name, env)
		}
	}
	if unreadHead(amqp.Delivery{MessageId: id, Type: "SEND", Body: newer}, ControlQueue("h2"), "h1") != nil {
		t.Error("a control request's head")
	}
	if unreadHead(amqp.Delivery{MessageId: id, Type: "SEND", Body: newer}, q, "") != nil {
		t.Error("an unsigned delivery's head")
	}
}
