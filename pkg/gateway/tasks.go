package gateway

import (
	"context"
	"sync"
)

// tasks tracks the short goroutines the gateway starts on the side of its
// work: a receipt, a TOO_LATE notice, a presence notice, a broadcast's
// publish. Shutdown waits for them (within the drain bound) before it
// closes the broker, so what they publish is published; once closed, a
// late one (a timer firing after the drain) is not started at all.
type tasks struct {
	mu     sync.Mutex
	n      int           // running
	idle   chan struct{} // closed when n drops to 0; nil while none ran
	closed bool
}

// Go runs f in a goroutine of its own, tracked; false (f not run) once
// the tasks are closed.
func (t *tasks) Go(f func()) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
	go func() {
		defer t.done()
		f()
	}()
	return true
}

func (t *tasks) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 {
		close(t.idle)
	}
}

// Wait returns once no task runs (a task a running one starts is waited
// for too), or with ctx's error when ctx ends first.
func (t *tasks) Wait(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.n == 0 {
			t.mu.Unlock()
			return nil
		}
		idle := t.idle
		t.mu.Unlock()
		select {
		case <-idle:
			// a task may have started another since: look again
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close refuses new tasks; the running ones go on (Wait for them).
func (t *tasks) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// Running is how many tasks run now.
func (t *tasks) Running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}
