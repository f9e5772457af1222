package fleet_test

import (
	"fmt"
	"regexp"
	"strings"

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
func cmdMetrics(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: metrics NAME")
	}
	m := servedRE.FindStringSubmatch(ts.ReadFile(args[0] + ".log"))
	if m == nil {
		ts.Fatalf("%s.log has no \"metrics served\" line", args[0])
	}
	f, err := scrape.Get("http://" + m[1] + "/metrics")
	ts.Check(err)
	fmt.Fprintln(ts.Stdout(), strings.Join(f.Lines(), "\n"))
}
