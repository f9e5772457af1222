package gateway_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// More entities than one AMQP connection has channels (RabbitMQ's default
// channel_max is 2,047): every join reports success only with its inbox
// declared, bound and consumed, so every one of them has a consumer on the
// broker, and a message to the last one is delivered.
func TestCrossManyEntities(t *testing.T) {
	if testing.Short() {
		t.Skip("joins 2,100 entities")
	}
	brokerAlone(t, time.Minute)
	url := brokerURL(t)
	g := startGW(t, t.TempDir(), "h1", settings{"broker": url, "presence-interval": "1h"})
	const n = 2100
	var last entity
	c := g.dial("")
	for i := range n {
		var resp *api.Response
		// a join refused 69 while the gateway lost a starved node (as in
		// TestCrossPresenceManyEntitiesOneMessage) is tried again
		eventuallyWithin(t, time.Minute, fmt.Sprintf("join %d", i), func() error {
			var err error
			resp, err = c.Call(&api.JoinRequest{Name: fmt.Sprintf("e%d", i), Mode: "pull"})
			if err != nil && fault.CodeOf(err) != fault.Unavailable {
				t.Fatalf("join %d: %v", i, err)
			}
			return err
		})
		last = entity{Name: resp.Entity.Name, Gid: resp.Entity.Gid, Token: resp.Token, gw: g}
	}
	vhost := url[strings.LastIndex(url, "/")+1:]
	out, err := testnode.Ctl("list_consumers", "-q", "--no-table-headers", "-p", vhost, "queue_name")
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
	// enrolled before it starts: a host announces itself at once, with
	// no entities too (an empty snapshot), and h1 would refuse that
	// snapshot as from an untrusted host — an ERROR line
	sender := &testGW{t: t, Host: "h2", Cfg: newConfig(t, t.TempDir(), "h2", settings{"broker": url}), logs: &syncBuffer{}}
	enrol(t, g, sender)
	sender.start()
	t.Cleanup(sender.stop)
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

// A join that cannot get its inbox on the broker fails whole: 69 with the
// reason, and nothing is left behind — no entity in the roster or the
// store, no credential file. The gateway's login here may not declare
// inbox queues (its configure permission leaves out agent.*).
func TestCrossJoinWithoutInboxFailsWhole(t *testing.T) {
	url := brokerURL(t)
	vhost := url[strings.LastIndex(url, "/")+1:]
	user := "limited-" + fmt.Sprint(len(vhost))
	ctl := func(args ...string) {
		if out, err := testnode.Ctl(args...); err != nil {
			t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
	}
	testnode.Ctl("delete_user", user)
	ctl("add_user", user, "pw-"+user)
	t.Cleanup(func() { testnode.Ctl("delete_user", user) })
	ctl("set_permissions", "-p", vhost, user, `^(bridge|control|roster)\..*`, ".*", ".*")
	limited := strings.Replace(url, "guest:guest@", user+":pw-"+user+"@", 1)
	g := startGW(t, t.TempDir(), "h1", settings{"broker": limited})
	_, err := g.call("", &api.JoinRequest{Name: "nohome", Mode: "pull"})
	fe := faultOf(t, err, 69)
	if !strings.Contains(fe.Error(), "could not declare and consume the inbox") {
		t.Errorf("error: %v", fe)
	}
	check := func(when string) {
		resp := g.must("", &api.RosterRequest{})
		for _, r := range resp.Entities {
			if r.Name == "nohome" {
				t.Fatalf("%s: nohome is in the roster: %+v", when, r)
			}
		}
		if _, err := os.Stat(filepath.Join(g.Cfg.StateDir, "credentials", "nohome.token")); !os.IsNotExist(err) {
			t.Fatalf("%s: a credential file was left behind (%v)", when, err)
		}
	}
	check("after the failed join")
	g.restart() // nothing in the store either
	check("after a restart")
	// the name is free, and the gateway still works for what it may do
	_, err = g.call("", &api.JoinRequest{Name: "nohome", Mode: "pull"})
	faultOf(t, err, 69)
}
