package broker

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
	amqp "github.com/rabbitmq/amqp091-go"
)

// On the private cluster (FLEET_TEST_CLUSTER, which make test sets; the
// cluster tests proper are in pkg/gateway): a gateway that finds itself a
// silent standby on a quorum inbox — another consumer active, mail ready,
// nothing coming to it — says so in an ERROR line. The race that makes a
// gateway a standby (another consumer between its check and its consume)
// cannot be staged from outside, so the standby is made here: the other
// consumer holds the queue, and the check runs as after a consume.
func TestClusterStandbySaidLoudly(t *testing.T) {
	raw := SplitURLs(strings.TrimSpace(os.Getenv("FLEET_TEST_CLUSTER")))
	if len(raw) == 0 {
		t.Skip("FLEET_TEST_CLUSTER is not set (make test sets it)")
	}
	node := strings.TrimSuffix(raw[0], "/") + "/"
	b, logs := runConnected(t, Config{URL: node, Host: "hstandby", Heartbeat: 2 * time.Second, Limits: Limits{QueueType: "quorum"}})
	gid := "hstandby." + envelope.NewID()
	q := InboxQueue(gid)
	conn, err := amqp.Dial(node)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.QueueDelete(q, false, false, false)
	if _, err := ch.QueueDeclare(q, true, false, false, false, inboxArgs(Limits{QueueType: "quorum"})); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(q, "the-other", false, false, false, false, nil); err != nil { // active, never acks
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	b.standbyCheck(gen, gid, &opened{})
	if !strings.Contains(logs.String(), "this gateway is a silent standby on its inbox") {
		t.Fatalf("no standby error:\n%s", logs.String())
	}
	// one that gets its mail is no standby
	logs.Reset()
	o := &opened{}
	o.got.Store(true)
	b.standbyCheck(gen, gid, o)
	if strings.Contains(logs.String(), "standby") {
		t.Fatalf("a consumer that got mail called itself a standby:\n%s", logs.String())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuf) Reset() {
	s.mu.Lock()
	s.b.Reset()
	s.mu.Unlock()
}

// runConnected runs a Broker of cfg, its log in the buffer it returns,
// until the test ends; it returns once it is connected.
func runConnected(t *testing.T, cfg Config) (*Broker, *syncBuf) {
	t.Helper()
	logs := &syncBuf{}
	b := New(cfg, slog.New(slog.NewJSONHandler(logs, nil)), func(*envelope.Envelope) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { b.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(30 * time.Second)
	for !b.Connected() {
		if time.Now().After(deadline) {
			t.Fatalf("not connected:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return b, logs
}
