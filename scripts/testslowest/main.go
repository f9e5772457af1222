// Command testslowest prints what a run of make test spent its time on,
// from its go test -json events (TEST_JSON):
//
//	go run ./scripts/testslowest [-n 20] FILE
//
// the run's wall time, the longest packages' wall times (first event to
// last: with -p 2 the longest of them sets the run's), and the n slowest
// tests and scripts. A test's time is its own: the time it waited for its
// turn (internal/testsched logs it) is left out, as Go leaves out its own
// wait for a parallel place.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet/internal/testsched"
)

type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type span struct{ first, last time.Time }

func (s *span) add(t time.Time) {
	if s.first.IsZero() || t.Before(s.first) {
		s.first = t
	}
	if t.After(s.last) {
		s.last = t
	}
}

func main() {
	n := flag.Int("n", 20, "how many tests to print")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: testslowest [-n N] FILE")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testslowest:", err)
		os.Exit(1)
	}
	defer f.Close()
	type key struct{ pkg, test string }
	var run span
	pkgs := map[string]*span{}
	took := map[key]time.Duration{}
	waited := map[key]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Time.IsZero() {
			continue
		}
		run.add(e.Time)
		if pkgs[e.Package] == nil {
			pkgs[e.Package] = &span{}
		}
		pkgs[e.Package].add(e.Time)
		if e.Test == "" {
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "pass", "fail":
			took[k] = time.Duration(e.Elapsed * float64(time.Second))
		case "output":
			if w, ok := testsched.Waited(e.Output); ok {
				waited[k] += w
			}
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testslowest:", err)
		os.Exit(1)
	}
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	fmt.Printf("the run: %v of wall time\n", round(run.last.Sub(run.first)))
	var names []string
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := pkgs[names[i]], pkgs[names[j]]
		return a.last.Sub(a.first) > b.last.Sub(b.first)
	})
	fmt.Println("the longest packages (first event to last, from the run's start):")
	for _, p := range names[:min(3, len(names))] {
		s := pkgs[p]
		fmt.Printf("  %s %v (%v to %v)\n", p, round(s.last.Sub(s.first)),
			round(s.first.Sub(run.first)), round(s.last.Sub(run.first)))
	}
	var keys []key
	own := map[key]time.Duration{}
	for k, d := range took {
		own[k] = max(d-waited[k], 0)
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return own[keys[i]] > own[keys[j]] })
	fmt.Printf("the %d slowest tests (their own time, without their wait for a turn):\n", *n)
	for _, k := range keys[:min(*n, len(keys))] {
		line := fmt.Sprintf("  %s %s %v", k.pkg, k.test, round(own[k]))
		if w := waited[k]; w > 0 {
			line += fmt.Sprintf(" (and %v waiting)", round(w))
		}
		fmt.Println(strings.TrimRight(line, " "))
	}
}
