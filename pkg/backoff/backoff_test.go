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
