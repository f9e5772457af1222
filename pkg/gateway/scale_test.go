package gateway_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
)

// More entities than one AMQP connection has channels (RabbitMQ's default
// channel_max is 2,047): every join reports success only with its inbox
// declared, bound and consumed, so every one of them has a consumer on the
// broker, and a message to the last one is delivered.
func TestCrossManyEntities(t *testing.T) {
	if testing.Short() {
		t.Skip("joins 2,100 entities")
	}
	url := brokerURL(t)
	g := startGW(t, t.TempDir(), "h1", settings{"broker": url, "presence-interval": "1h"})
	const n = 2100
	var last entity
	c := g.dial("")
	for i := range n {
		resp, err := c.Call(&api.Request{Op: api.OpJoin, Name: fmt.Sprintf("e%d", i), Mode: "pull"})
		if err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
		last = entity{Name: resp.Entity.Name, Gid: resp.Entity.Gid, Token: resp.Token, gw: g}
	}
	vhost := url[strings.LastIndex(url, "/")+1:]
	root, _ := filepath.Abs("../..")
	out, err := exec.Command(filepath.Join(root, "scripts", "rabbitmq-node.sh"), "ctl", "list_consumers", "-q", "--no-table-headers", "-p", vhost, "queue_name").Output()
	if err != nil {
		t.Fatalf("list_consumers: %v", err)
	}
	inboxes := 0
	for _, q := range strings.Fields(string(out)) {
		if strings.HasPrefix(q, "agent.") {
			inboxes++
		}
	}
	if inboxes != n {
		t.Fatalf("%d inboxes consumed on the broker, want %d", inboxes, n)
	}
	// through the broker, by gid, to the last one joined
	sender := startGW(t, t.TempDir(), "h2", settings{"broker": url})
	enrol(t, g, sender)
	a := sender.join("alice")
	a.mustSend(last.Gid, "to the last")
	eventually(t, "the last entity has its message", func() error {
		if b := bodies(last.recv()); len(b) != 1 || b[0] != "to the last" {
			return fmt.Errorf("got %v", b)
		}
		return nil
	})
	if strings.Count(g.logs.String(), `"level":"ERROR"`) > 0 {
		t.Errorf("errors logged:\n%s", grepLines(g.logs.String(), `"level":"ERROR"`, 5))
	}
}

func grepLines(s, sub string, max int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && len(out) < max {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
