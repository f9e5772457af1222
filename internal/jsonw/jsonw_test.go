package jsonw

import (
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// TestStringAsEncodingJSON holds String to json.Marshal on every string of
// up to two bytes over the ASCII range and a set of UTF-8 sequences (valid,
// invalid, U+2028/U+2029), and on random strings built from them.
func TestStringAsEncodingJSON(t *testing.T) {
	var atoms []string
	for b := 0; b < 0x80; b++ {
		atoms = append(atoms, string(rune(b)))
	}
	atoms = append(atoms, "é", "€", "😀", "\u2028", "\u2029", "\u2027", "\u202a", "\ufffd",
		"\xff", "\xc3", "\xe2\x80", "\xed\xa0\x80", "\xf0\x9f\x98", "\x80")
	check := func(s string) {
		t.Helper()
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := String(nil, s); string(got) != string(want) {
			t.Fatalf("String(%q) = %s, encoding/json: %s", s, got, want)
		}
	}
	check("")
	for _, a := range atoms {
		for _, b := range atoms {
			check(a + b)
		}
	}
	r := rand.New(rand.NewSource(1))
	for range 20000 {
		var sb strings.Builder
		for range r.Intn(40) {
			sb.WriteString(atoms[r.Intn(len(atoms))])
		}
		check(sb.String())
	}
}

func TestTimeAsEncodingJSON(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("x", 5*3600+30*60), time.FixedZone("y", -7*3600), time.Local}
	r := rand.New(rand.NewSource(2))
	times := []time.Time{{}, time.Now(), time.Now().UTC().Truncate(time.Second), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)}
	for range 2000 {
		times = append(times, time.Unix(r.Int63n(1<<35), r.Int63n(1e9)).In(zones[r.Intn(len(zones))]))
	}
	for _, tm := range times {
		want, err := json.Marshal(tm)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := Time(nil, tm)
		if !ok || string(got) != string(want) {
			t.Fatalf("Time(%v) = %s (%v), encoding/json: %s", tm, got, ok, want)
		}
	}
	for _, tm := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)} {
		if _, err := json.Marshal(tm); err == nil {
			t.Fatalf("encoding/json takes %v", tm)
		}
		if got, ok := Time([]byte("x"), tm); ok || string(got) != "x" {
			t.Fatalf("Time(%v) = %q, %v; want dst unchanged and not ok", tm, got, ok)
		}
	}
}
