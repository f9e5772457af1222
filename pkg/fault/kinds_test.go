package fault

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// No kind is written as a bare string outside this package: every fault is
// raised, built and compared with a declared constant, so a typo cannot
// silently skip a branch (routing once branched on "inbox_full").
func TestNoBareKinds(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	isFault := func(e ast.Expr, name string) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != name {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && id.Name == "fault"
	}
	lit := func(e ast.Expr) bool {
		b, ok := e.(*ast.BasicLit)
		return ok && b.Kind == token.STRING
	}
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			filepath.Dir(path) == "." {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if (isFault(n.Fun, "New") || isFault(n.Fun, "Wrap")) && len(n.Args) > 1 && lit(n.Args[1]) {
					t.Errorf("%s: a fault kind written as a bare string", fset.Position(n.Pos()))
				}
				if isFault(n.Fun, "Kind") && len(n.Args) == 1 && lit(n.Args[0]) {
					t.Errorf("%s: a fault kind converted from a bare string", fset.Position(n.Pos()))
				}
			case *ast.BinaryExpr:
				call, ok := n.X.(*ast.CallExpr)
				if !ok {
					call, _ = n.Y.(*ast.CallExpr)
				}
				if call != nil && isFault(call.Fun, "KindOf") && (lit(n.X) || lit(n.Y)) {
					t.Errorf("%s: a fault kind compared with a bare string", fset.Position(n.Pos()))
				}
			case *ast.CompositeLit:
				// fault.Error{Kind: "..."}: a fault built by hand
				if n.Type == nil || !isFault(n.Type, "Error") {
					break
				}
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Kind" && lit(kv.Value) {
						t.Errorf("%s: a fault.Error with its Kind written as a bare string", fset.Position(kv.Pos()))
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: the walk missed the tree", checked)
	}
}

// Every declared kind is in the closed set, and the set holds nothing else.
func TestKindsAreClosed(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "fault.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Kind" {
				continue
			}
			for _, name := range v.Names {
				declared++
				val := strings.Trim(v.Values[0].(*ast.BasicLit).Value, `"`)
				if !Kind(val).Known() {
					t.Errorf("%s (%q) is declared but not in Kinds", name.Name, val)
				}
			}
		}
	}
	if declared != len(Kinds) {
		t.Errorf("%d kinds declared, %d in Kinds", declared, len(Kinds))
	}
}
