package cli_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// The domain packages know nothing of the command line or the terminal:
// flags, tables and ttys belong to pkg/cli alone.
var (
	domainPackages = []string{
		"github.com/fleetd/fleet/pkg/envelope",
		"github.com/fleetd/fleet/pkg/store",
		"github.com/fleetd/fleet/pkg/gateway",
		"github.com/fleetd/fleet/pkg/api",
		"github.com/fleetd/fleet/pkg/deliver",
		"github.com/fleetd/fleet/pkg/audit",
		"github.com/fleetd/fleet/pkg/backoff",
		"github.com/fleetd/fleet/pkg/config",
		"github.com/fleetd/fleet/pkg/ident",
		"github.com/fleetd/fleet/pkg/fault",
		"github.com/fleetd/fleet/pkg/broker",
	}
	edgeOnly = []string{
		"github.com/urfave/cli/v2",
		"github.com/olekukonko/tablewriter",
		"golang.org/x/term",
	}
)

// listedPackage is the part of `go list -json` output the test reads.
type listedPackage struct {
	ImportPath string
	Imports    []string
	Error      *struct{ Err string }
}

// TestDomainPackagesStayOffTheEdge fails when a domain package imports,
// directly or through any dependency, urfave/cli, tablewriter or x/term.
func TestDomainPackagesStayOffTheEdge(t *testing.T) {
	// fleet-roster's package is the control: it imports all three, so a
	// test that found nothing there would be a broken test, not a clean tree.
	const control = "github.com/fleetd/fleet/pkg/cli/rosterapp"
	graph := goListDeps(t, append([]string{control}, domainPackages...))
	for _, bad := range edgeOnly {
		if path := importChain(graph, control, bad); path == nil {
			t.Fatalf("control failed: %s does not appear to import %s; the dependency graph is not being read", control, bad)
		}
	}
	for _, pkg := range domainPackages {
		if _, ok := graph[pkg]; !ok {
			t.Errorf("%s is not in the dependency graph: renamed or removed? update domainPackages", pkg)
			continue
		}
		for _, bad := range edgeOnly {
			if chain := importChain(graph, pkg, bad); chain != nil {
				t.Errorf("%s must not import %s, but does: %s", pkg, bad, strings.Join(chain, " -> "))
			}
		}
	}
}

// goListDeps returns every package pkgs depend on (themselves included),
// by import path, from `go list -deps -json`. Test files are not included:
// the rule is about what the packages build into.
func goListDeps(t *testing.T, pkgs []string) map[string]listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Imports,Error"}, pkgs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.String())
	}
	graph := map[string]listedPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		graph[p.ImportPath] = p
	}
	return graph
}

// importChain returns the import path from "from" to a package that is
// target or inside it (target/...), or nil when there is none.
func importChain(graph map[string]listedPackage, from, target string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == target || strings.HasPrefix(cur, target+"/") {
			var chain []string
			for p := cur; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, imp := range graph[cur].Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// The short commands link neither the gateway nor what only it uses: every
// package linked is initialised on every call, and fleet-send's start-up
// time is part of each send.
func TestShortCommandsStayLight(t *testing.T) {
	const self = "github.com/fleetd/fleet/pkg/cli"
	const mcpapp = "github.com/fleetd/fleet/pkg/cli/mcpapp"
	graph := goListDeps(t, []string{self, "github.com/fleetd/fleet/pkg/cli/gwapp", mcpapp})
	if importChain(graph, mcpapp, "github.com/modelcontextprotocol/go-sdk") == nil {
		t.Fatal("control failed: fleet-mcp does not appear to link the MCP SDK; the MCP check below would pass for nothing")
	}
	if importChain(graph, "github.com/fleetd/fleet/pkg/cli/gwapp", "github.com/fleetd/fleet/pkg/gateway") == nil {
		t.Fatal("control failed: gwapp does not appear to import pkg/gateway; the dependency graph is not being read")
	}
	if importChain(graph, "github.com/fleetd/fleet/pkg/cli/gwapp", "github.com/prometheus/client_golang") == nil {
		t.Fatal("control failed: fleet-gw does not appear to link client_golang; the metrics check below would pass for nothing")
	}
	for _, heavy := range []string{
		"github.com/fleetd/fleet/pkg/gateway",
		"github.com/fleetd/fleet/pkg/store",
		"github.com/fleetd/fleet/pkg/broker",
		"go.etcd.io/bbolt",
		"github.com/rabbitmq/amqp091-go",
		"github.com/olekukonko/tablewriter",   // only fleet-roster and fleet-trace render tables (pkg/cli/table)
		"github.com/prometheus/client_golang", // only fleet-gw serves metrics (pkg/metrics)
		"github.com/fleetd/fleet/pkg/metrics",
		"github.com/modelcontextprotocol/go-sdk", // only fleet-mcp serves MCP (pkg/cli/mcpapp)
		"github.com/google/jsonschema-go",
		mcpapp,
	} {
		if chain := importChain(graph, self, heavy); chain != nil {
			t.Errorf("pkg/cli links %s: %s", heavy, strings.Join(chain, " -> "))
		}
	}
}
