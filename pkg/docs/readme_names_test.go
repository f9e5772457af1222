package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The README's "Where things happen" table is how a newcomer finds where
// a message is routed, stored, delivered and acked: every file it names
// must exist, and every function, method or type it names after a file
// must be declared in that file (or, after a package, in that package).
// A name it gives that is no Go identifier (a flag, a queue, a URI) is
// left alone; one that is an identifier but names a bucket or an op must
// at least be a string in the file's package.
func TestREADMENamesExist(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## Where things happen\n")
	if !ok {
		t.Fatal(`README.md has no "## Where things happen" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	span := regexp.MustCompile("`([^`]+)`")
	ident := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	qualified := regexp.MustCompile(`^([a-z][a-z0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)$`)
	files := map[string]*goFile{}
	load := func(path string) *goFile {
		if f, ok := files[path]; ok {
			return f
		}
		f := parseGo(t, filepath.Join(root, path))
		files[path] = f
		return f
	}
	checked := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") || strings.TrimSpace(cells[1]) == "what" {
			continue
		}
		where := strings.Join(cells[2:len(cells)-1], "|")
		dir, file := "", "" // what a bare name or a bare file name is relative to
		for _, m := range span.FindAllStringSubmatch(where, -1) {
			s := m[1]
			switch {
			case strings.Contains(s, "*"):
				// a glob (agent_*_test.go): no one file
			case strings.HasSuffix(s, ".go"):
				if !strings.Contains(s, "/") {
					s = filepath.Join(dir, s)
				}
				if _, err := os.Stat(filepath.Join(root, s)); err != nil {
					t.Errorf("README names %s, which does not exist", s)
					file = ""
					continue
				}
				dir, file = filepath.Dir(s), s
			case strings.HasPrefix(s, "pkg/") || strings.HasPrefix(s, "internal/") || strings.HasPrefix(s, "scripts/") || strings.HasPrefix(s, "cmd/") || strings.HasPrefix(s, "docs/"):
				if _, err := os.Stat(filepath.Join(root, s)); err != nil {
					t.Errorf("README names %s, which does not exist", s)
				}
				dir, file = s, ""
			case qualified.MatchString(s):
				q := qualified.FindStringSubmatch(s)
				pkg := filepath.Join("pkg", q[1])
				if _, err := os.Stat(filepath.Join(root, pkg)); err != nil {
					continue // bridge.dlq, control.<host>: no package
				}
				checked++
				if !packageDeclares(root, pkg, q[2], load) {
					t.Errorf("README names %s: %s declares no %s", s, pkg, q[2])
				}
			case ident.MatchString(s) && file == "" && dir != "":
				// after a package: declared in one of its files
				checked++
				if !packageDeclares(root, dir, s, load) {
					t.Errorf("README names %s in %s, which declares no %s", s, dir, s)
				}
			case ident.MatchString(s) && file != "":
				checked++
				f := load(file)
				if f.decls[s] {
					continue
				}
				if !packageHasString(root, dir, s, load) {
					t.Errorf("README names %s in %s, which declares no %s (moved? name where it lives now)", s, file, s)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d names checked: the table's format changed?", checked)
	}
}

// goFile is what one Go file declares (functions, methods, types, values,
// struct fields) and the strings it quotes.
type goFile struct {
	decls, strs map[string]bool
}

func parseGo(t *testing.T, path string) *goFile {
	f := &goFile{decls: map[string]bool{}, strs: map[string]bool{}}
	af, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Errorf("parsing %s: %v", path, err)
		return f
	}
	ast.Inspect(af, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncDecl:
			f.decls[x.Name.Name] = true
		case *ast.TypeSpec:
			f.decls[x.Name.Name] = true
		case *ast.ValueSpec:
			for _, id := range x.Names {
				f.decls[id.Name] = true
			}
		case *ast.Field:
			for _, id := range x.Names {
				f.decls[id.Name] = true
			}
		case *ast.BasicLit:
			if x.Kind == token.STRING {
				if s, err := strconv.Unquote(x.Value); err == nil {
					f.strs[s] = true
				}
			}
		}
		return true
	})
	return f
}

// goFiles are the non-test Go files of dir (relative to root).
func goFiles(root, dir string) []string {
	ents, _ := os.ReadDir(filepath.Join(root, dir))
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".go") && !strings.HasSuffix(e.Name(), "_test.go") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

func packageDeclares(root, dir, name string, load func(string) *goFile) bool {
	for _, p := range goFiles(root, dir) {
		if load(p).decls[name] {
			return true
		}
	}
	return false
}

func packageHasString(root, dir, s string, load func(string) *goFile) bool {
	for _, p := range goFiles(root, dir) {
		if f := load(p); f.strs[s] || f.decls[s] {
			return true
		}
	}
	return false
}
