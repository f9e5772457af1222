package deliver

import (
	"regexp"
	"testing"
)

// TestHandGrammars holds the hand-written checks to the regular
// expressions they replace, on the edges and on every short string over
// an alphabet that covers each class and its neighbours.
func TestHandGrammars(t *testing.T) {
	for _, g := range []struct {
		name string
		re   *regexp.Regexp
		fn   func(string) bool
	}{
		{"isFleetVar", regexp.MustCompile(`^FLEET_[A-Z0-9_]+$`), isFleetVar},
		{"quotable", regexp.MustCompile(`^[A-Za-z0-9_.:%@+=/-]+$`), quotable},
	} {
		cases := []string{"", "FLEET_", "FLEET_X", "FLEET_SOCKET", "FLEET_A9_", "FLEET_a", "FLEET_X ", "XFLEET_X", "fleet_x",
			"a", "h1.01a22c52-8775-70dc-b05f-c3fbe3f46d8d", "%1", "s:w.p", "a'b", "a#b", "a b", "a\nb", "é", "a\x00"}
		const alphabet = "AZaz09_.:%@$+=/-'# \x7f\xc3FLET"
		var walk func(prefix string, n int)
		walk = func(prefix string, n int) {
			cases = append(cases, prefix, "FLEET_"+prefix)
			if n == 0 {
				return
			}
			for i := 0; i < len(alphabet); i++ {
				walk(prefix+alphabet[i:i+1], n-1)
			}
		}
		walk("", 3)
		for _, c := range cases {
			if got, want := g.fn(c), g.re.MatchString(c); got != want {
				t.Errorf("%s(%q) = %v, the expression says %v", g.name, c, got, want)
			}
		}
	}
}
