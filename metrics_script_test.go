package fleet_test

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/fleetd/fleet/internal/scrape"
	"github.com/rogpeppe/go-internal/testscript"
)

// servedRE finds the metrics address in a gateway's JSON log.
var servedRE = regexp.MustCompile(`"msg":"metrics served[^"]*".*"addr":"([^"]+)"`)

// metrics NAME — scrape the /metrics endpoint of the gateway started as
// NAME (its address from the "metrics served" line of $WORK/NAME.log),
// parse it with Prometheus's own text parser (a scrape it rejects fails the
// script), and print every sample on stdout as `name{label="v",...} value`,
// labels sorted (histograms as _count and _sum), for stdout checks.
// With -until REGEXP (repeatable) it scrapes again every 100ms until the
// samples match every one, for -t DUR (default 15s): a count that has to
// reach a figure, waited for rather than slept for.
func cmdMetrics(ts *testscript.TestScript, neg bool, args []string) {
	f, args := parseWaitFlags(ts, args, " -t -until ")
	if neg || len(args) != 1 {
		ts.Fatalf("usage: metrics [-t DUR] [-until REGEXP]... NAME")
	}
	m := servedRE.FindStringSubmatch(ts.ReadFile(args[0] + ".log"))
	if m == nil {
		ts.Fatalf("%s.log has no \"metrics served\" line", args[0])
	}
	deadline := time.Now().Add(f.limit)
	for {
		fam, err := scrape.Get("http://" + m[1] + "/metrics")
		ts.Check(err)
		out := strings.Join(fam.Lines(), "\n")
		if f.matches(out) {
			fmt.Fprintln(ts.Stdout(), out)
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("metrics %s: no match for %v within %v; last scrape:\n%s", args[0], f.match, f.limit, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
