package gateway

import "testing"

// An answer reaches only the calls of the entity that asked, each once;
// a repeated answer neither blocks nor reaches anyone twice.
func TestControlAnswersReachTheirRequesterOnce(t *testing.T) {
	c := &controlRequests{}
	a1 := c.wait("req-1", "gid-a", "h2")
	a2 := c.wait("req-1", "gid-a", "h2") // the same request id, sent twice
	b := c.wait("req-1", "gid-b", "h2")  // someone else reusing the id
	other := c.wait("req-2", "gid-a", "h2")

	res := &controlResult{RequestID: "req-1"}
	if n, _ := c.hand("req-1", "gid-a", "h2", res); n != 2 {
		t.Fatalf("handed to %d calls, want the 2 of gid-a", n)
	}
	for i, w := range []*ctlWaiter{a1, a2} {
		select {
		case got := <-w.ch:
			if got != res {
				t.Errorf("call %d got %+v", i, got)
			}
		default:
			t.Errorf("call %d of gid-a got nothing", i)
		}
	}
	for name, w := range map[string]*ctlWaiter{"gid-b": b, "req-2": other} {
		select {
		case got := <-w.ch:
			t.Errorf("%s got an answer not meant for it: %+v", name, got)
		default:
		}
	}
	// a repeated answer before the calls took the first: it does not
	// block, and is not queued behind the first
	if n, _ := c.hand("req-1", "gid-a", "h2", res); n != 2 {
		t.Errorf("handed to %d calls, want 2", n)
	}
	if n, _ := c.hand("req-1", "gid-a", "h2", res); n != 0 {
		t.Errorf("a repeated answer was handed to %d calls still holding one, want 0", n)
	}
	// an answer from another host than the one asked is refused, and
	// reaches no one
	if n, err := c.hand("req-1", "gid-a", "h3", res); err == nil || n != 0 {
		t.Errorf("an answer from h3 to a request sent to h2: handed to %d, err %v", n, err)
	}
	c.unwait("req-1", a1)
	c.unwait("req-1", a2)
	c.unwait("req-1", b)
	if n, _ := c.hand("req-1", "gid-a", "h2", res); n != 0 {
		t.Errorf("handed to %d calls after they stopped waiting", n)
	}
	c.unwait("req-2", other)
	if len(c.waiters) != 0 {
		t.Errorf("waiters left behind: %v", c.waiters)
	}
}
