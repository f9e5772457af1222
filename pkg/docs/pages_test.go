package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/config"
	ucli "github.com/urfave/cli/v2"
)

func freshApps() []*ucli.App {
	var out []*ucli.App
	for _, newApp := range AllApps() {
		out = append(out, newApp())
	}
	return out
}

// Every concept page is rendered as a man page of its section, with a NAME
// line whatis can read and a SEE ALSO, and its generated parts in place.
func TestPages(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := readPages()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"fleet.7": true, "fleet-config.5": true, "fleet-broker.7": true, "fleet-security.7": true,
		"fleet-agents.7": true, "fleet-metrics.7": true, "fleet-json.7": true}
	for _, p := range ps {
		file := p.Name + "." + p.Section
		delete(want, file)
		page := string(files["man/"+file])
		if !strings.HasPrefix(page, ".nh\n.TH "+p.Name+" "+p.Section+"\n") {
			t.Errorf("%s: no .TH line for %s(%s):\n%.80s", file, p.Name, p.Section, page)
		}
		if !strings.Contains(page, "\n.SH NAME\n"+p.Name+" \\- ") {
			t.Errorf("%s: no NAME line \"%s \\- ...\"", file, p.Name)
		}
		if !strings.Contains(page, "\n.SH SEE ALSO\n") {
			t.Errorf("%s: no SEE ALSO", file)
		}
		if strings.Contains(page, "<!--") || strings.Contains(page, ".TS") {
			t.Errorf("%s: a marker or a tbl table is left", file)
		}
	}
	for f := range want {
		t.Errorf("no page %s", f)
	}
	cfg := string(files["man/fleet-config.5"])
	for _, k := range config.Keys {
		if !strings.Contains(cfg, "\n.TP\n\\fB"+k.Name+"\\fR\n") || !strings.Contains(cfg, k.Env) {
			t.Errorf("fleet-config(5) does not list %s (%s)", k.Name, k.Env)
		}
	}
	overview := string(files["man/fleet.7"])
	for _, e := range exitCodes {
		if !strings.Contains(overview, "\n.TP\n"+strconv.Itoa(int(e.Code))+"\n") {
			t.Errorf("fleet(7) does not list exit code %d", e.Code)
		}
	}
}

// Every command's page points to the concept pages, and those exist.
func TestSeeAlsoPagesExist(t *testing.T) {
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	for name, refs := range seeAlso {
		if _, ok := files["man/"+name+".1"]; !ok {
			t.Errorf("seeAlso names %s, which has no page", name)
		}
		for _, r := range append([]string{"fleet(7)", "fleet-config(5)"}, refs...) {
			n, sec, _ := strings.Cut(strings.TrimSuffix(r, ")"), "(")
			if _, ok := files["man/"+n+"."+sec]; !ok {
				t.Errorf("%s: SEE ALSO %s, which is not generated", name, r)
			}
			if !strings.Contains(string(files["man/"+name+".1"]), "\\fB"+roffCode(n)+"\\fR("+sec+")") {
				t.Errorf("%s(1): SEE ALSO does not name %s", name, r)
			}
		}
	}
}

// groff reads every generated page without a warning (lines it cannot
// adjust around a long word aside).
func TestPagesRenderCleanly(t *testing.T) {
	groff, err := exec.LookPath("groff")
	if err != nil {
		// never a quiet skip: make test installs it (scripts/test-deps.sh)
		t.Fatalf("no groff on this machine, so the pages cannot be checked: run scripts/test-deps.sh (apt-get install groff-base)")
	}
	files, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for p, data := range files {
		if !strings.HasPrefix(p, "man/") {
			continue
		}
		f := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd := exec.Command(groff, "-k", "-t", "-man", "-Tutf8", "-ww", "-Wbreak", "-z", f)
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil || stderr.Len() > 0 {
			t.Errorf("groff %s: %v\n%s", p, err, stderr.String())
		}
	}
}

// Every fleet command line in the README's and the pages' sh blocks, and
// every config line in their conf blocks, exists: commands, flags, values
// and required flags as the definitions have them.
func TestDocCommandLines(t *testing.T) {
	apps := freshApps()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n, errs := CheckMarkdown("README.md", string(readme), apps)
	for _, e := range errs {
		t.Error(e)
	}
	if n < 25 {
		t.Errorf("README.md: %d command and config lines checked; its sh blocks hold more (are they marked sh?)", n)
	}
	ps, err := readPages()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, p := range ps {
		n, errs := CheckMarkdown(p.Name+"."+p.Section+".md", string(p.Src), apps)
		total += n
		for _, e := range errs {
			t.Error(e)
		}
	}
	if total < 80 {
		t.Errorf("pages: %d command and config lines checked, want at least 80", total)
	}
}

// The check finds what is wrong, where.
func TestCheckMarkdownFails(t *testing.T) {
	src := "text\n\n```sh\nfleet-send --as a b hi\nfleet-send --bogus b hi\n  fleet-gw trust list \\\n    --nope\n```\n\n" +
		"1. step\n   ```sh\n   fleet-roster join x --mode pull --tmux-target\n   ```\n\n```conf\nhost = a\nno-such-key = 1\n```\n\n```json\n{\"command\": \"fleet-send --bogus\"}\n```\n"
	n, errs := CheckMarkdown("x.md", src, freshApps())
	got := strings.Join(errs, "\n")
	for _, want := range []string{"x.md:5:", "no flag --bogus", "x.md:6:", "fleet-gw trust list has no flag --nope",
		"x.md:12:", "--tmux-target needs a value", "x.md:17:", "no config key no-such-key"} {
		if !strings.Contains(got, want) {
			t.Errorf("errors do not say %q:\n%s", want, got)
		}
	}
	if len(errs) != 4 || n != 6 {
		t.Errorf("%d errors over %d lines checked, want 4 over 6:\n%s", len(errs), n, got)
	}
}
