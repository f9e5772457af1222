package fleet_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"

	"github.com/fleetd/fleet/pkg/api"
)

// TestConcurrentRemoteSendsAllConfirmed has many senders on h1 send to
// entities on h2 at once, through the private broker: every send must be
// confirmed. Each remote send waits for the broker's confirm, and confirms
// stream back while new messages go out — the interleaving in which the
// gateway's publisher once deadlocked (asking the library for the next
// sequence number under the lock its confirm reader needed), after which
// every publish of the gateway timed out.
func TestConcurrentRemoteSendsAllConfirmed(t *testing.T) {
	testsched.Take(t, testsched.Need{Group: "node"})
	brokerLock.RLock()
	defer brokerLock.RUnlock()
	url, drop, err := testnode.Vhost("t-go-publish", "h1", "h2") // with their logins
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	dir := t.TempDir()
	login := func(host string) string { // each gateway its own broker login
		u, err := testnode.Login(url, host)
		if err != nil {
			t.Fatal(err)
		}
		return "FLEET_BROKER=" + u
	}
	h1 := newTestGW(t, dir, "h1", login("h1"), "FLEET_PUBLISH_TIMEOUT=5s")
	h2 := newTestGW(t, dir, "h2", login("h2"), "FLEET_PUBLISH_TIMEOUT=5s")
	enrolGWs(t, h1, h2)
	const senders, each = 16, 150
	var names []string
	for i := range 4 {
		names = append(names, fmt.Sprintf("sink%d", i))
		h2.join(names[i])
	}
	var toks []string
	for i := range senders {
		toks = append(toks, h1.join(fmt.Sprintf("src%d", i)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for i, tok := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := h1.dial(tok)
			defer c.Close()
			for j := range each {
				to := names[(i+j)%len(names)]
				resp, err := c.Call(&api.SendRequest{To: to + "@h2", Body: fmt.Sprintf("m%d-%d", i, j)})
				if err != nil {
					errs <- fmt.Errorf("sender %d, message %d to %s: %w", i, j, to, err)
					return
				}
				if resp.Sent == nil {
					errs <- fmt.Errorf("sender %d, message %d: no Sent in %+v", i, j, resp)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
