package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/docs"
)

// TestGeneratedDocsUpToDate regenerates the man pages and completions into
// a temporary folder and fails, naming every file, when the committed ones
// under man/ and completions/ differ: a flag, command or usage text changed
// without `make generate`.
func TestGeneratedDocsUpToDate(t *testing.T) {
	root := moduleRoot(t)
	tmp := t.TempDir()
	if err := docs.Generate(tmp); err != nil {
		t.Fatalf("generating: %v", err)
	}
	var diffs []string
	for _, dir := range docs.Dirs {
		want := readFiles(t, filepath.Join(tmp, dir))
		have := readFiles(t, filepath.Join(root, dir))
		for name, w := range want {
			h, ok := have[name]
			switch {
			case !ok:
				diffs = append(diffs, dir+"/"+name+": missing")
			case h != w:
				diffs = append(diffs, dir+"/"+name+": out of date, "+firstDiff(h, w))
			}
		}
		for name := range have {
			if _, ok := want[name]; !ok {
				diffs = append(diffs, dir+"/"+name+": not generated any more (remove it)")
			}
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("committed man pages and completions differ from the command definitions; "+
			"run `make generate` and commit the result:\n\t%s", strings.Join(diffs, "\n\t"))
	}
}

// readFiles reads the regular files of dir by name; a missing dir has none.
func readFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return files
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue // .gitkeep and the like
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(data)
	}
	return files
}

// firstDiff names the first line where the committed and generated files part.
func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		if i >= len(h) || i >= len(w) || h[i] != w[i] {
			var hl, wl string
			if i < len(h) {
				hl = h[i]
			}
			if i < len(w) {
				wl = w[i]
			}
			return fmt.Sprintf("line %d: committed %q, generated %q", i+1, hl, wl)
		}
	}
	return "same lines, different bytes"
}

// moduleRoot is the folder holding go.mod, found upwards from the test's
// working directory (its package folder).
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = parent
	}
}
