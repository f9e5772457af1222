package gateway

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestTasksWaitsForAll(t *testing.T) {
	var ts tasks
	if err := ts.Wait(context.Background()); err != nil {
		t.Fatalf("Wait with none running: %v", err)
	}
	release := make(chan struct{})
	var finished atomic.Int32
	for range 3 {
		ts.Go(func() {
			<-release
			// a task started by a task is waited for too
			ts.Go(func() { finished.Add(1) })
			finished.Add(1)
		})
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ts.Wait(short); err == nil {
		t.Fatal("Wait returned while tasks were blocked")
	}
	if n := ts.Running(); n != 3 {
		t.Fatalf("Running = %d, want 3", n)
	}
	close(release)
	ctx, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if err := ts.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if n := finished.Load(); n != 6 {
		t.Fatalf("finished = %d after Wait, want 6", n)
	}
	if n := ts.Running(); n != 0 {
		t.Fatalf("Running = %d after Wait, want 0", n)
	}
}

func TestTasksClosedRefuses(t *testing.T) {
	var ts tasks
	ts.Close()
	ran := make(chan struct{}, 1)
	if ts.Go(func() { ran <- struct{}{} }) {
		t.Fatal("Go after Close reported started")
	}
	if err := ts.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	select {
	case <-ran:
		t.Fatal("a task ran after Close")
	default:
	}
}
