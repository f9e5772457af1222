package store

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// A request id is carried out once: the first BeginControl claims it, every
// later one (also after a restart, also many at once) gets the record back,
// with the answer once it is recorded.
func TestControlRequestIsClaimedOnce(t *testing.T) {
	s, path := newStore(t)
	id := envelope.NewID()
	prev, err := s.BeginControl(id, envelope.Spawn, "w1", t0)
	if err != nil || prev != nil {
		t.Fatalf("first BeginControl = %v, %v; want nil, nil (go ahead)", prev, err)
	}
	prev, err = s.BeginControl(id, envelope.Spawn, "w1", t0.Add(time.Second))
	if err != nil || prev == nil || prev.State != ControlRunning || prev.Subject != "w1" || !prev.Started.Equal(t0) {
		t.Fatalf("second BeginControl = %+v, %v; want the running record of the first", prev, err)
	}
	if err := s.EndControl(id, []byte(`{"gid":"g1"}`), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	prev, err = s.BeginControl(id, envelope.Spawn, "w1", t0.Add(3*time.Second))
	if err != nil || prev == nil || prev.State != ControlDone || string(prev.Result) != `{"gid":"g1"}` {
		t.Fatalf("BeginControl after reopen = %+v, %v; want the done record with its answer", prev, err)
	}
	c, err := s.ControlRequest(id)
	if err != nil || c.Kind != envelope.Spawn || !c.Done.Equal(t0.Add(2*time.Second)) {
		t.Errorf("ControlRequest = %+v, %v", c, err)
	}

	// many deliveries of one new request at once: exactly one goes ahead
	id2 := envelope.NewID()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ahead := 0
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev, err := s.BeginControl(id2, envelope.Stop, "g2", t0)
			if err != nil {
				t.Error(err)
				return
			}
			if prev == nil {
				mu.Lock()
				ahead++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ahead != 1 {
		t.Errorf("%d of 50 concurrent claims went ahead, want 1", ahead)
	}
}

func TestForgetControlLetsARequestRunAgain(t *testing.T) {
	s, _ := newStore(t)
	if err := s.ForgetControl("never-seen"); err != nil {
		t.Errorf("forgetting an unknown id (no bucket yet): %v", err)
	}
	if _, err := s.ControlRequest("never-seen"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ControlRequest of an unknown id = %v, want ErrNotFound", err)
	}
	id := envelope.NewID()
	s.BeginControl(id, envelope.Spawn, "w1", t0)
	if err := s.ForgetControl(id); err != nil {
		t.Fatal(err)
	}
	if prev, err := s.BeginControl(id, envelope.Spawn, "w1", t0); err != nil || prev != nil {
		t.Errorf("BeginControl after ForgetControl = %+v, %v; want to go ahead", prev, err)
	}
	if err := s.EndControl(envelope.NewID(), nil, t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("EndControl of an unclaimed id = %v, want ErrNotFound", err)
	}
}

func TestPruneControlKeepsRunningAndRecent(t *testing.T) {
	s, _ := newStore(t)
	old, recent, running := envelope.NewID(), envelope.NewID(), envelope.NewID()
	for _, id := range []string{old, recent, running} {
		s.BeginControl(id, envelope.Spawn, "x", t0)
	}
	s.EndControl(old, []byte(`{}`), t0)
	s.EndControl(recent, []byte(`{}`), t0.Add(2*time.Hour))
	n, err := s.PruneControl(t0.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("PruneControl = %d, %v; want 1 pruned", n, err)
	}
	if _, err := s.ControlRequest(old); !errors.Is(err, ErrNotFound) {
		t.Errorf("the old answered request is still there: %v", err)
	}
	for _, id := range []string{recent, running} {
		if _, err := s.ControlRequest(id); err != nil {
			t.Errorf("request %s was pruned: %v", id, err)
		}
	}
}

func TestLaunched(t *testing.T) {
	s, path := newStore(t)
	if _, err := s.Launched("g1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Launched before any = %v, want ErrNotFound", err)
	}
	if err := s.PutLaunched("g1", []byte(`{"launcher":"tmux"}`)); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, path)
	if got, err := s.Launched("g1"); err != nil || string(got) != `{"launcher":"tmux"}` {
		t.Errorf("Launched = %q, %v", got, err)
	}
	if err := s.DeleteLaunched("g1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Launched("g1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Launched after delete = %v, want ErrNotFound", err)
	}
}
