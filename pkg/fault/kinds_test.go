package fault

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
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

// The walk of the closed list: every kind either names a next step or says
// why it has none — never both, never neither — and a hint is a line.
func TestEveryKindHasANextStep(t *testing.T) {
	seen := map[Kind]bool{}
	for _, ki := range KindTable {
		if seen[ki.Kind] {
			t.Errorf("%s: two lines in KindTable", ki.Kind)
		}
		seen[ki.Kind] = true
		switch {
		case ki.Hint == "" && ki.None == "":
			t.Errorf("%s: no hint, and no reason why there is no next step", ki.Kind)
		case ki.Hint != "" && ki.None != "":
			t.Errorf("%s: both a hint and a reason for none", ki.Kind)
		}
		for _, s := range []string{ki.Hint, ki.None} {
			if strings.ContainsAny(s, "\n\r") || strings.HasSuffix(s, ".") || s != strings.TrimSpace(s) {
				t.Errorf("%s: %q is not one line in the house style (no period, no newline)", ki.Kind, s)
			}
		}
	}
	if len(seen) != len(Kinds) {
		t.Errorf("%d kinds in KindTable, %d in Kinds", len(seen), len(Kinds))
	}
}

// HintFor prefers the raiser's own hint, falls back to the kind's, names
// the command, and gives nothing for a kind with no next step or a plain
// error.
func TestHintFor(t *testing.T) {
	if h := HintFor(New(Usage, KindUsage, "x"), "fleet-send"); h != "see: fleet-send --help" {
		t.Errorf("default usage hint: %q", h)
	}
	if h := HintFor(New(Usage, KindUsage, "x").WithHint("mine"), "fleet-send"); h != "mine" {
		t.Errorf("own hint: %q", h)
	}
	if h := HintFor(New(Data, KindBadEnvelope, "x"), "fleet-send"); h != "" {
		t.Errorf("a kind with no next step got %q", h)
	}
	if h := HintFor(errors.New("plain"), "fleet-send"); h != "" {
		t.Errorf("a plain error got %q", h)
	}
	if h := HintFor(nil, "fleet-send"); h != "" {
		t.Errorf("nil got %q", h)
	}
}

// Every exit code declared in fault.go has one line in Codes, in order,
// with a retry class that fits it; 75 is the only "try again as it is",
// and the codes a retry cannot mend are not 75.
func TestCodesTable(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "fault.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == "Code" {
				declared[v.Values[0].(*ast.BasicLit).Value] = true
			}
		}
	}
	if len(declared) != len(Codes) {
		t.Errorf("%d codes declared, %d in Codes", len(declared), len(Codes))
	}
	for i, ci := range Codes {
		if !declared[strconv.Itoa(int(ci.Code))] {
			t.Errorf("Codes has %d, which is not declared", ci.Code)
		}
		if i > 0 && Codes[i-1].Code >= ci.Code {
			t.Errorf("Codes: %d after %d", ci.Code, Codes[i-1].Code)
		}
		if (ci.Retry == RetryYes) != (ci.Code == TempFail) {
			t.Errorf("%d: retry %q; only 75 is 'try again as it is'", ci.Code, ci.Retry)
		}
		if (ci.Retry == RetryNone) != (ci.Code == OK || ci.Code == AskArrived) {
			t.Errorf("%d: retry %q", ci.Code, ci.Retry)
		}
		if ci.Text == "" || !strings.HasSuffix(ci.Text, ".") {
			t.Errorf("%d: text %q is not a sentence", ci.Code, ci.Text)
		}
	}
	for _, c := range []Code{TooLate, Partial, Conflict, Refused} {
		if ci, ok := c.Info(); !ok || ci.Retry == RetryYes || c == TempFail {
			t.Errorf("%d must not read as 'try again'", c)
		}
	}
}
