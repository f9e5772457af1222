package ident

import (
	"regexp"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
)

// The hand-written grammars match their regular expressions exactly.
func TestGrammars(t *testing.T) {
	hostRE := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)
	gidRE := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	nameRE := regexp.MustCompile(NamePattern)
	idRE := regexp.MustCompile(IDPattern)
	uuid := "01a22c15-8557-7503-928f-f03d6429f6ed"
	long := strings.Repeat("a", 62)
	cases := []string{
		"", "h", "H1", "1h", "-h", "_h", "h-1_x", "h.1", "h 1", "hé", "h\n", long, "a" + long, "aa" + long,
		"h1." + uuid, "h1." + strings.ToUpper(uuid), "h1." + uuid[:35], "h1." + uuid + "0", "." + uuid,
		"h1.x" + uuid[1:], "h1." + strings.Replace(uuid, "-", "_", 1), "a" + long + "." + uuid, "aa" + long + "." + uuid,
		"h1..", "h1." + uuid + "\n", "bob", "Bob_2", "b-", "9bob", strings.Repeat("b", 64), strings.Repeat("b", 65), "bob@h1",
		uuid, "a:b.c_d-e", ":a", ".a", "a/b", "../x", "a b", "a\x00", "x" + strings.Repeat("1", 127), "x" + strings.Repeat("1", 128), "a'b", "a$b",
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
		if got, want := ValidID(s), idRE.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", s, got, want)
		}
	}
}

// A group name is an entity name (each is a routing key: broadcast.<group>);
// a broadcast may name "all", nobody joins it.
func TestGroupNames(t *testing.T) {
	for _, g := range []string{"ops", "Team-2", "a_b", "all", strings.Repeat("g", 64)} {
		if !ValidGroup(g) || CheckGroup(g) != nil {
			t.Errorf("group %q refused", g)
		}
	}
	if CheckGroup("") != nil {
		t.Error(`a broadcast to "" (everyone) refused`)
	}
	if CheckMember([]string{"ops", "team-2"}) != nil || CheckMember(nil) != nil {
		t.Error("good groups to join refused")
	}
	for _, g := range []string{"x y", "#", "*", "ops.*", "broadcast.ops", "a.b", "-ops", "9ops", "ops\n", "é", strings.Repeat("g", 65)} {
		if ValidGroup(g) {
			t.Errorf("ValidGroup(%q) = true", g)
		}
		for what, err := range map[string]error{"CheckGroup": CheckGroup(g), "CheckMember": CheckMember([]string{"ops", g})} {
			if fault.CodeOf(err) != fault.Usage || !strings.Contains(err.Error(), "not a valid group name") || fault.HintOf(err) == "" {
				t.Errorf("%s(%q) = %v, want a usage error with a hint", what, g, err)
			}
		}
	}
	if err := CheckMember([]string{"all"}); fault.CodeOf(err) != fault.Usage {
		t.Errorf(`joining "all": %v, want a usage error`, err)
	}
}
