package accept

import "testing"

func TestParseBad(t *testing.T) {
	for _, s := range []string{"", "@", "bob@", "group:", "bob/", "bob/SEN", "a b", "bob@h/ASK,", "x/y/SEND"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q): no error", s)
		}
	}
}

func TestMatch(t *testing.T) {
	bob := Sender{Name: "bob", Host: "h2", Groups: []string{"ops"}}
	cases := []struct {
		pat  string
		kind Kind
		want bool
	}{
		{"*", Send, true},
		{"bob", Ask, true},
		{"bob@h2", Send, true},
		{"bob@h1", Send, false},
		{"alice", Send, false},
		{"@h2", Broadcast, true},
		{"@h1", Send, false},
		{"group:ops", Send, true},
		{"group:dev", Send, false},
		{"bob@h2/SEND", Send, true},
		{"bob@h2/SEND", Ask, false},
		{"*/send,ask", Ask, true},
		{"@h2/SPAWN", Stop, false},
	}
	for _, c := range cases {
		r, err := Parse(c.pat)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.pat, err)
		}
		if got := r.Matches(bob, c.kind); got != c.want {
			t.Errorf("%q %s: got %v want %v", c.pat, c.kind, got, c.want)
		}
	}
}

func TestDecideNamesRule(t *testing.T) {
	a, _ := Parse("alice")
	b, _ := Parse("@h2/SEND")
	r, ok := Decide([]Rule{a, b}, Sender{Name: "bob", Host: "h2"}, Send)
	if !ok || r.Raw != "@h2/SEND" {
		t.Fatalf("got %v %v", r, ok)
	}
	if _, ok := Decide([]Rule{a, b}, Sender{Name: "bob", Host: "h2"}, Ask); ok {
		t.Fatal("ASK accepted by a SEND-only rule")
	}
	if _, ok := Decide(nil, Sender{Name: "bob"}, Send); ok {
		t.Fatal("empty policy accepted")
	}
}
