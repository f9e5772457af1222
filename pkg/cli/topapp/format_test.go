package topapp

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
)

func TestFitCutsToWidth(t *testing.T) {
	for _, w := range []int{1, 5, 10, 80} {
		got := fit("alice@h1 → bob@h1 a very long line that goes on and on past any width", w)
		if n := ansi.StringWidth(got); n != w {
			t.Errorf("fit to %d: %d cells: %q", w, n, got)
		}
	}
	if got := fit("ab", 5); got != "ab   " {
		t.Errorf("fit pads: %q", got)
	}
	if got := fit("abcdef", 4); got != "abc…" {
		t.Errorf("fit marks a cut: %q", got)
	}
	// a styled cell keeps its width: styles never count
	p := palette{color: true}
	if got := cell("busy", 9, p.state); ansi.StringWidth(got) != 9 || !strings.Contains(got, "\x1b[") {
		t.Errorf("styled cell: %q", got)
	}
}

func TestNoColor(t *testing.T) {
	t.Setenv("NO_COLOR", "1")
	p := palette{color: !noColor()}
	for _, s := range []string{"idle", "busy", "stuck", "gone"} {
		if got := p.state(s); got != s {
			t.Errorf("NO_COLOR: state %q drawn as %q", s, got)
		}
	}
	if got := p.title("T") + p.dim("d") + p.selected("s"); strings.Contains(got, "\x1b") {
		t.Errorf("NO_COLOR: escapes in %q", got)
	}
	t.Setenv("NO_COLOR", "")
	if !(palette{color: !noColor()}).color {
		t.Error("NO_COLOR empty: colour should stay on")
	}
	if got := (palette{color: true}).state("idle"); !strings.Contains(got, "\x1b[") {
		t.Errorf("colour on: idle not coloured: %q", got)
	}
}
