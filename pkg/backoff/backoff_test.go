package backoff

import (
	"testing"
	"time"
)

func TestDelayDoublesAndCaps(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if got := p.Delay(0); got != 100*time.Millisecond {
		t.Errorf("Delay(0) = %v, want the base", got)
	}
}

func TestJitterStaysInUpperHalf(t *testing.T) {
	p := Policy{Base: time.Second, Max: 8 * time.Second, Jitter: true}
	for n := 1; n <= 5; n++ {
		full := Policy{Base: p.Base, Max: p.Max}.Delay(n)
		seen := map[time.Duration]bool{}
		for i := 0; i < 200; i++ {
			d := p.Delay(n)
			if d < full/2 || d > full {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v]", n, d, full/2, full)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Delay(%d) took only %d distinct values in 200 draws", n, len(seen))
		}
	}
}

func TestPollEndsOnReadyStopOrDeadline(t *testing.T) {
	n := 0
	if !Poll(time.Millisecond, time.Time{}, func() bool { n++; return n == 3 }, nil, nil) || n != 3 {
		t.Fatalf("Poll: want true after the third ask, asked %d times", n)
	}
	stop := make(chan struct{})
	close(stop)
	if Poll(time.Hour, time.Time{}, func() bool { return true }, nil, stop) {
		t.Fatal("Poll: true after a stop closed")
	}
	asked := false
	if Poll(time.Millisecond, time.Now(), func() bool { asked = true; return true }, nil, nil) || asked {
		t.Fatal("Poll: past its deadline it must say false without asking")
	}
}

func TestWaitEndsEarlyOnStop(t *testing.T) {
	if !Wait(time.Millisecond, nil, nil) {
		t.Fatal("Wait: false with no stop")
	}
	stop := make(chan struct{})
	close(stop)
	if Wait(time.Hour, stop, nil) {
		t.Fatal("Wait: true after a stop closed")
	}
}
