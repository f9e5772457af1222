package gateway_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// A backlog in a remote inbox is taken in batches (intake.go): two
// senders' messages, with a RECEIPT among them, waiting while the
// recipient's gateway is down, all arrive once each, in order per sender,
// and the receipt in the middle of a batch is taken too.
func TestCrossHostBacklogTakenInOrder(t *testing.T) {
	h1, h2 := twoHosts(t)
	alice, carol := h1.join("alice"), h1.join("carol")
	bob := h2.join("bob")
	h2.resolves("alice@h1")
	hi := bob.mustSend("alice@h1", "hi") // its receipt will wait in bob's inbox
	eventually(t, "alice has bob's message", func() error {
		if len(h1Recv(alice)) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	h2.stop()

	const n = 150
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, s := range []entity{alice, carol} {
		wg.Add(1)
		go func(s entity) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				if _, err := s.send(bob.Gid, fmt.Sprintf("%s %03d", s.Name, i)); err != nil {
					errs <- fmt.Errorf("%s, message %d: %w", s.Name, i, err)
					return
				}
			}
		}(s)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h2.start()

	var got []string
	eventually(t, "bob has every message", func() error {
		for _, d := range bob.recv() {
			got = append(got, d.Envelope.Body)
		}
		if len(got) < 2*n {
			return fmt.Errorf("%d of %d", len(got), 2*n)
		}
		return nil
	})
	if len(got) != 2*n {
		t.Fatalf("bob got %d messages, want %d", len(got), 2*n)
	}
	next := map[string]int{}
	for _, b := range got {
		name, seq, _ := strings.Cut(b, " ")
		i, err := strconv.Atoi(seq)
		if err != nil {
			t.Fatalf("unexpected body %q", b)
		}
		if i != next[name] {
			t.Fatalf("from %s: got message %d, want %d (a duplicate, a loss or out of order); all: %v", name, i, next[name], got)
		}
		next[name]++
	}
	if r := bob.waitState(hi.MsgID, "delivered"); r.State != "delivered" {
		t.Fatalf("bob's message to alice: %s, want delivered (its receipt was in the backlog)", r.State)
	}
}

// h1Recv drains e's inbox and returns the bodies.
func h1Recv(e entity) []string { return bodies(e.recv()) }
