package gateway_test

// Helpers shared by the focused tests of one gateway (no broker): held-open
// requests, draining an inbox exactly, reading what an exec adapter wrote.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// open sends a request whose answer comes in two frames (fleet-ask,
// fleet-send --wait) on its own connection and returns the client after
// the first frame (Sent), or the first frame's error.
func (g *testGW) open(token string, req api.Request) (*api.Client, *api.Sent, error) {
	g.t.Helper()
	c := g.dial(token)
	resp, err := c.Call(req)
	if err != nil {
		return c, nil, err
	}
	if resp.Sent == nil {
		g.t.Fatalf("%s: first frame without Sent: %+v", api.OpOf(req), resp)
	}
	return c, resp.Sent, nil
}

// second reads the second frame of a held-open request: the one envelope
// it carries, or its error.
func second(t testing.TB, c *api.Client) (*envelope.Envelope, error) {
	t.Helper()
	resp, err := c.Read()
	if err != nil {
		return nil, err
	}
	if len(resp.Batch) != 1 {
		t.Fatalf("second frame: want one envelope, got %+v", resp)
	}
	return resp.Batch[0].Envelope, nil
}

// take is one fleet-recv (as pkg/cli/recv.go: write out, then ack) with
// max; it retries while the gateway still reports the previous fleet-recv
// of this inbox as draining (see TestLocalRecvBackToBack: the inbox is
// released only after the previous fleet-recv was told End).
func (e entity) take(max int) []api.Delivery {
	e.gw.t.Helper()
	var got []api.Delivery
	eventually(e.gw.t, "a fleet-recv of "+e.Name, func() error {
		var err error
		got, err = e.tryTake(max)
		if fault.KindOf(err) == fault.KindInboxBusy {
			return err
		}
		if err != nil {
			e.gw.t.Fatalf("recv %s: %v", e.Name, err)
		}
		return nil
	})
	return got
}

// tryTake is one fleet-recv with max; its error as the gateway said it.
func (e entity) tryTake(max int) ([]api.Delivery, error) {
	c, err := api.Dial(e.gw.Cfg.Socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.Token = e.Token
	if err := c.Send(&api.RecvRequest{Max: max}); err != nil {
		return nil, err
	}
	var got []api.Delivery
	for {
		resp, err := c.Read()
		if err != nil {
			return got, err
		}
		if resp.End {
			return got, nil
		}
		acks := make([]string, 0, len(resp.Batch))
		for _, d := range resp.Batch {
			got = append(got, d)
			acks = append(acks, d.Envelope.MsgID)
		}
		if err := c.Send(&api.AckRequest{Acks: acks}); err != nil {
			return got, err
		}
	}
}

// collect drains e's inbox until exactly want has arrived, in this order
// (messages may still be on their way), and returns the deliveries.
func (e entity) collect(want ...string) []api.Delivery {
	e.gw.t.Helper()
	var got []api.Delivery
	eventually(e.gw.t, fmt.Sprintf("%s receives %q", e.Name, want), func() error {
		got = append(got, e.take(0)...)
		if len(got) < len(want) {
			return fmt.Errorf("got %q so far", bodies(got))
		}
		return nil
	})
	if b := bodies(got); !slices.Equal(b, want) {
		e.gw.t.Fatalf("%s got %q, want %q", e.Name, b, want)
	}
	return got
}

// empty proves e's inbox holds nothing from before: a sentinel sent now
// from s is the next and only thing e receives.
func (e entity) empty(s entity) {
	e.gw.t.Helper()
	s.mustSend(e.Gid, "sentinel")
	e.collect("sentinel")
}

// lines are the envelopes an exec adapter appended to path (one JSON line
// each), in order.
func lines(t testing.TB, path string) []*envelope.Envelope {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*envelope.Envelope
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		var env envelope.Envelope
		if err := json.Unmarshal(sc.Bytes(), &env); err != nil {
			t.Fatalf("%s: not an envelope line: %q: %v", path, sc.Text(), err)
		}
		out = append(out, &env)
	}
	return out
}

// waitLines waits until path holds n envelope lines and returns them.
func waitLines(t testing.TB, path string, n int) []*envelope.Envelope {
	t.Helper()
	var got []*envelope.Envelope
	eventually(t, fmt.Sprintf("%d lines in %s", n, path), func() error {
		got = lines(t, path)
		if len(got) < n {
			return fmt.Errorf("%d lines", len(got))
		}
		return nil
	})
	if len(got) != n {
		t.Fatalf("%s: %d lines, want %d", path, len(got), n)
	}
	return got
}

// envBodies are the bodies of envs, in order.
func envBodies(envs []*envelope.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.Body
	}
	return out
}

// rosterRow returns g's roster row for name@host.
func (g *testGW) rosterRow(name string) (api.EntityRow, bool) {
	g.t.Helper()
	resp := g.must("", &api.RosterRequest{})
	for _, r := range resp.Entities {
		if r.Name == name && r.Host == g.Host {
			return r, true
		}
	}
	return api.EntityRow{}, false
}

// record is the delivery record of msgID as e may see it.
func (e entity) record(msgID string) *api.Record {
	e.gw.t.Helper()
	resp, err := e.gw.call(e.Token, &api.LookupRequest{MsgID: msgID})
	if err != nil {
		e.gw.t.Fatalf("lookup %s by %s: %v", msgID, e.Name, err)
	}
	return resp.Record
}

// waitState waits until e sees msgID in state.
func (e entity) waitState(msgID, state string) *api.Record {
	e.gw.t.Helper()
	var rec *api.Record
	eventually(e.gw.t, msgID+" "+state, func() error {
		rec = e.record(msgID)
		if rec.State != state {
			return errors.New(rec.State)
		}
		return nil
	})
	return rec
}

// logCount is how many lines of g's log contain s.
func (g *testGW) logCount(s string) int {
	return strings.Count(g.logs.String(), s)
}

// codeOf is the exit code of err (0 for none).
func codeOf(err error) fault.Code { return fault.CodeOf(err) }
