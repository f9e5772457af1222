package fleet_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// TestKillDuringLoadLosesNothing runs the real fleet-gw under concurrent
// senders, kills it with SIGKILL mid-stream (so the store's log is
// replayed on the next start, whatever it held), and checks, over several
// rounds, that every message a sender heard "accepted" for is received
// exactly once, and that nothing is received that no sender sent.
func TestKillDuringLoadLosesNothing(t *testing.T) {
	gw := newTestGW(t, t.TempDir(), "h1")
	sock := gw.sock
	rtok := gw.join("sink")
	var stoks []string
	for i := range 4 {
		stoks = append(stoks, gw.join(fmt.Sprintf("src%d", i)))
	}

	accepted := map[string]bool{} // acknowledged to a sender
	tried := map[string]bool{}    // bodies sent, acknowledged or not
	var mu sync.Mutex
	for round := range 4 {
		var wg sync.WaitGroup
		for i, tok := range stoks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := api.Dial(sock)
				if err != nil {
					return
				}
				defer c.Close()
				c.Token = tok
				for j := 0; ; j++ {
					body := fmt.Sprintf("r%d-s%d-%d", round, i, j)
					mu.Lock()
					tried[body] = true
					mu.Unlock()
					resp, err := c.Call(&api.SendRequest{To: "sink", Body: body})
					if err != nil {
						return // the gateway went away mid-call: outcome unknown
					}
					if resp.Sent == nil || resp.Sent.State != "accepted" {
						t.Errorf("send %s: %+v", body, resp.Sent)
						return
					}
					mu.Lock()
					accepted[body] = true
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(150+100*round) * time.Millisecond) // let the load run, then pull the plug
		gw.kill()
		wg.Wait()
		gw.start()
	}

	// drain everything and compare
	c := gw.dial(rtok)
	defer c.Close()
	if err := c.Send(&api.RecvRequest{}); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for {
		resp, err := c.Read()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if resp.End {
			break
		}
		var acks []string
		for _, d := range resp.Batch {
			got[d.Envelope.Body]++
			acks = append(acks, d.Envelope.MsgID)
		}
		if err := c.Send(&api.AckRequest{Acks: acks}); err != nil {
			t.Fatal(err)
		}
	}
	if len(accepted) < 100 {
		t.Fatalf("only %d messages accepted over the rounds: the test proves little", len(accepted))
	}
	var missing, twice, unknown []string
	for b := range accepted {
		if got[b] == 0 {
			missing = append(missing, b)
		}
	}
	for b, n := range got {
		if n > 1 {
			twice = append(twice, b)
		}
		if !tried[b] {
			unknown = append(unknown, b)
		}
	}
	if len(missing)+len(twice)+len(unknown) > 0 {
		t.Errorf("over %d accepted messages: %d lost %v, %d received twice %v, %d never sent %v",
			len(accepted), len(missing), head(missing), len(twice), head(twice), len(unknown), head(unknown))
	}
	t.Logf("%d accepted, %d received (the difference: sends cut short by the kill, stored but never acknowledged)", len(accepted), len(got))
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}
