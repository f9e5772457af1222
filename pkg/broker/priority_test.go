package broker

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// On the private node (FLEET_TEST_BROKER, which make test sets): an inbox
// made before urgent mail had a priority at the broker (no x-max-priority)
// is kept as it is and said, not refused and not redeclared in a loop; a
// new inbox gets the priority, and urgent mail it holds goes out first.
func TestInboxPriorityAndOlderInbox(t *testing.T) {
	url := strings.TrimSpace(os.Getenv("FLEET_TEST_BROKER"))
	if url == "" {
		t.Skip("FLEET_TEST_BROKER is not set (make test sets it)")
	}
	b, logs := runConnected(t, Config{URL: url, Host: "hprio", Heartbeat: 2 * time.Second})
	deadline := time.Now().Add(30 * time.Second)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()

	old := "hprio." + envelope.NewID()
	defer ch.QueueDelete(InboxQueue(old), false, false, false)
	if _, err := ch.QueueDeclare(InboxQueue(old), true, false, false, false, inboxArgsBeforeUrgent(Limits{})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.declare(gen, old, nil); err != nil {
		t.Fatalf("an older inbox was refused: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "inbox made before urgent mail had a priority at the broker") {
		t.Fatalf("the older inbox was not said:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "other arguments than configured") {
		t.Fatalf("an older inbox said as a misconfiguration:\n%s", logs.String())
	}

	fresh := "hprio." + envelope.NewID()
	defer ch.QueueDelete(InboxQueue(fresh), false, false, false)
	if _, err := b.declare(gen, fresh, nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []amqp.Publishing{{Body: []byte("n1")}, {Body: []byte("n2")}, {Body: []byte("u1"), Priority: UrgentPriority}, {Body: []byte("n3")}} {
		if err := ch.Publish("", InboxQueue(fresh), false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for len(got) < 4 && time.Now().Before(deadline) {
		d, ok, err := ch.Get(InboxQueue(fresh), true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, string(d.Body))
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if strings.Join(got, " ") != "u1 n1 n2 n3" {
		t.Fatalf("a new inbox gave %q, want urgent first, then FIFO", got)
	}
}
