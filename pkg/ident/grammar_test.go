package ident

import (
	"regexp"
	"strings"
	"testing"
)

// The hand-written grammars match their regular expressions exactly.
func TestGrammars(t *testing.T) {
	hostRE := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)
	gidRE := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	nameRE := regexp.MustCompile(NamePattern)
	uuid := "01a22c15-8557-7503-928f-f03d6429f6ed"
	long := strings.Repeat("a", 62)
	cases := []string{
		"", "h", "H1", "1h", "-h", "_h", "h-1_x", "h.1", "h 1", "hé", "h\n", long, "a" + long, "aa" + long,
		"h1." + uuid, "h1." + strings.ToUpper(uuid), "h1." + uuid[:35], "h1." + uuid + "0", "." + uuid,
		"h1.x" + uuid[1:], "h1." + strings.Replace(uuid, "-", "_", 1), "a" + long + "." + uuid, "aa" + long + "." + uuid,
		"h1..", "h1." + uuid + "\n", "bob", "Bob_2", "b-", "9bob", strings.Repeat("b", 64), strings.Repeat("b", 65), "bob@h1",
	}
	for _, s := range cases {
		if got, want := ValidHost(s), hostRE.MatchString(s); got != want {
			t.Errorf("ValidHost(%q) = %v, want %v", s, got, want)
		}
		if got, want := IsGid(s), gidRE.MatchString(s); got != want {
			t.Errorf("IsGid(%q) = %v, want %v", s, got, want)
		}
		if got, want := ValidName(s), nameRE.MatchString(s); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", s, got, want)
		}
	}
}
