package fleet_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/testnode"
	"github.com/fleetd/fleet/internal/testsched"
)

// The exit status of a send says what happened to the message (issue 26,
// point 3), whatever the network does meanwhile. Three senders on h1 send
// to bob on h2 through a proxy that, again and again, silences h1's broker
// connection one way (the publish reaches the broker, its confirm never
// comes back) or both ways. Each send's status is then held against what
// bob received:
//
//	0   accepted: bob has it exactly once
//	69  not sent: bob never has it
//	74  outcome unknown: bob has it at most once, and --status says
//	    delivered if he has it and unknown if he has not
//
// A send that breaks one of these is misreported; the figure printed must
// be 0. Nothing may arrive twice.
func TestSendOutcomesUnderCuts(t *testing.T) {
	testsched.Take(t, testsched.Need{Group: "node"})
	brokerLock.RLock()
	t.Cleanup(brokerLock.RUnlock)
	vurl, drop, err := testnode.Vhost("outcomes", "h1", "h2") // with their logins
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	login := func(host string) *url.URL {
		u, err := testnode.Login(vurl, host)
		if err != nil {
			t.Fatal(err)
		}
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		return pu
	}
	// h1 reaches the broker through the proxy only
	u1 := login("h1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: u1.Host}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.a.Close()
			c.b.Close()
		}
		p.mu.Unlock()
	})
	u1.Host = ln.Addr().String()
	dir := t.TempDir()
	common := []string{"FLEET_PRESENCE_INTERVAL=300ms", "FLEET_HEARTBEAT=1s", "FLEET_PUBLISH_TIMEOUT=3s"}
	h1 := newTestGW(t, dir, "h1", append(common, "FLEET_BROKER="+u1.String())...)
	h2 := newTestGW(t, dir, "h2", append(common, "FLEET_BROKER="+login("h2").String())...)
	enrolGWs(t, h1, h2)
	alice := h1.join("alice")
	bob := h2.join("bob")

	run := func(g *testGW, token string, args ...string) (string, string, int) {
		cmd := exec.Command(filepath.Join(binDir, args[0]), args[1:]...)
		cmd.Env = append(append([]string{}, g.env...), "FLEET_TOKEN="+token)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out.String(), errb.String(), 0
		case errors.As(err, &ee):
			return out.String(), errb.String(), ee.ExitCode()
		}
		t.Fatalf("%v: %v", args, err)
		return "", "", -1
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ := run(h1, alice, "fleet-roster", "--json")
		if strings.Contains(out, `"name":"bob","host":"h2"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h1 never heard of bob: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	type sent struct {
		body, id string
		exit     int
		stderr   string
	}
	var (
		mu    sync.Mutex
		sends []sent
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	idRE := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	const senders, each = 3, 20
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("m-%d-%d", s, i)
				out, errs, code := run(h1, alice, "fleet-send", "bob", body)
				id := idRE.FindString(out)
				if code != 0 {
					id = idRE.FindString(errs)
				}
				mu.Lock()
				sends = append(sends, sent{body: body, id: id, exit: code, stderr: errs})
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	// the faults, one after another, until the senders are done
	var faults atomic.Int32
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(700 * time.Millisecond):
			}
			p.silence(i%3 != 2) // two one-way cuts, then a silent network
			faults.Add(1)
		}
	}()
	wg.Wait()
	close(stop)

	// what bob has, once everything has had time to arrive
	got := map[string]int{}
	quiet := time.Now()
	for time.Since(quiet) < 8*time.Second {
		out, _, code := run(h2, bob, "fleet-recv", "--json")
		if code != 0 {
			t.Fatalf("fleet-recv exit %d", code)
		}
		for line := range strings.Lines(out) {
			var m struct {
				Body string `json:"body"`
			}
			if json.Unmarshal([]byte(line), &m) == nil && m.Body != "" {
				got[m.Body]++
				quiet = time.Now()
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	status := func(id string) string {
		out, _, _ := run(h1, alice, "fleet-send", "--status", id, "--json")
		var r struct {
			State string `json:"state"`
		}
		json.Unmarshal([]byte(out), &r)
		return r.State
	}
	byExit := map[int]int{}
	misreported := 0
	for _, s := range sends {
		byExit[s.exit]++
		n := got[s.body]
		bad := ""
		switch {
		case n > 1:
			bad = fmt.Sprintf("received %d times", n)
		case s.exit == 0 && n != 1:
			bad = "accepted (0) but never received"
		case s.exit == 69 && n != 0:
			bad = "not sent (69) but received"
		case s.exit == 74 && s.id == "":
			bad = "outcome unknown (74) without its msg id"
		case s.exit == 74:
			// the receipt of one received settles it; give it time
			want := "unknown"
			if n == 1 {
				want = "delivered"
			}
			st := status(s.id)
			for end := time.Now().Add(20 * time.Second); st != want && time.Now().Before(end); st = status(s.id) {
				time.Sleep(200 * time.Millisecond)
			}
			if st != want {
				bad = fmt.Sprintf("outcome unknown (74), received %d, --status reads %q", n, st)
			}
		case s.exit != 0 && s.exit != 69:
			bad = fmt.Sprintf("exit %d", s.exit)
		}
		if bad != "" {
			misreported++
			t.Errorf("%s: %s\n%s", s.body, bad, s.stderr)
		}
	}
	t.Logf("%d sends under %d faults: %d accepted (0), %d not sent (69), %d outcome unknown (74), other %v; misreported: %d",
		len(sends), faults.Load(), byExit[0], byExit[69], byExit[74], byExit, misreported)
}
