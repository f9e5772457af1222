package near

import "testing"

func TestClosest(t *testing.T) {
	cands := []string{"json", "wait", "wait-reply", "reply-to", "status", "as"}
	for word, want := range map[string]string{
		"jsn": "json", "josn": "json", "wiat": "wait", "reply": "reply-to", "stauts": "status",
		"zzz": "", "a": "", "statu": "status", "wait-repl": "wait-reply",
		"wai": "wait", // one edit from wait; wait-reply is farther
	} {
		if got := Closest(word, cands); got != want {
			t.Errorf("Closest(%q) = %q, want %q", word, got, want)
		}
	}
}

// Two candidates as near: no suggestion (naming one would be a guess).
func TestClosestTie(t *testing.T) {
	if got := Closest("bob", []string{"rob", "bab"}); got != "" {
		t.Errorf("a tie suggested %q", got)
	}
	if got := Closest("bbo", []string{"bob", "carol"}); got != "bob" {
		t.Errorf("got %q", got)
	}
	// one option of two levels (fleet-roster's --host, and its list's) is
	// one candidate, not a tie
	if got := Closest("hots", []string{"host", "group", "host", "json"}); got != "host" {
		t.Errorf("a candidate named twice: got %q, want host", got)
	}
	if got := Closest("ho", []string{"host", "host"}); got != "host" {
		t.Errorf("a prefix of a candidate named twice: got %q, want host", got)
	}
}
