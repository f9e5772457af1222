package gateway

import (
	"go/ast"
	"go/types"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// twoWayCeiling is the ratchet: how many pairs of pkg/gateway's
// production files use each other's functions both ways (gateway.go, the
// wiring, left out). It may only come down; lower it when it does.
const twoWayCeiling = 0

// TestNoTwoWayFileCalls counts, for every use of a function or method
// declared in pkg/gateway's production files (a call, or a method value
// handed on), the file it is used in and the file it is declared in, and
// fails when more pairs of files than twoWayCeiling use each other both
// ways (STYLE "Owning state": where two parts must change together, one
// calls the other, in one direction). With -v it prints the pairs and who
// calls what.
func TestNoTwoWayFileCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("loads and type-checks the package (go list): not in -short")
	}
	pkgs, err := packages.Load(&packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
	}, ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != 1 || len(pkgs[0].Errors) > 0 {
		t.Fatalf("loading pkg/gateway: %v", pkgs[0].Errors)
	}
	pairs := callPairs(pkgs[0])
	two := twoWay(pairs)
	for _, p := range two {
		t.Logf("%s <-> %s", p[0], p[1])
		t.Logf("    %s -> %s: %s", p[0], p[1], strings.Join(pairs[[2]string{p[0], p[1]}], ", "))
		t.Logf("    %s -> %s: %s", p[1], p[0], strings.Join(pairs[[2]string{p[1], p[0]}], ", "))
	}
	t.Logf("%d pairs of files call each other both ways (ceiling %d)", len(two), twoWayCeiling)
	if len(two) > twoWayCeiling {
		t.Errorf("%d pairs of files call each other both ways, more than the ceiling %d: move a function to the file of its owner, or call one way (run with -v for the pairs)",
			len(two), twoWayCeiling)
	}
}

// callPairs maps (file using, file declaring) to the functions used, for
// the package's production files (no _test.go on either side).
func callPairs(pkg *packages.Package) map[[2]string][]string {
	pairs := map[[2]string][]string{}
	seen := map[[3]string]bool{}
	for _, f := range pkg.Syntax {
		from := filepath.Base(pkg.Fset.File(f.Pos()).Name())
		if strings.HasSuffix(from, "_test.go") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			fn, ok := pkg.TypesInfo.Uses[id].(*types.Func)
			if !ok || fn.Pkg() != pkg.Types {
				return true
			}
			to := filepath.Base(pkg.Fset.File(fn.Pos()).Name())
			if to == from || strings.HasSuffix(to, "_test.go") {
				return true
			}
			name := fn.Name()
			if recv := fn.Signature().Recv(); recv != nil {
				name = types.TypeString(recv.Type(), types.RelativeTo(pkg.Types)) + "." + name
			}
			if k := [3]string{from, to, name}; !seen[k] {
				seen[k] = true
				pairs[[2]string{from, to}] = append(pairs[[2]string{from, to}], name)
			}
			return true
		})
	}
	return pairs
}

// twoWay is the pairs of files that use each other both ways, gateway.go
// (which wires the parts) left out, sorted.
func twoWay(pairs map[[2]string][]string) [][2]string {
	var out [][2]string
	for p := range pairs {
		if p[0] < p[1] && p[0] != "gateway.go" && p[1] != "gateway.go" && pairs[[2]string{p[1], p[0]}] != nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0]+out[i][1] < out[j][0]+out[j][1] })
	return out
}
