package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// run runs app through Main, as the binary does, and returns the exit
// status and stderr.
func run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var stderr strings.Builder
	app := NewSendApp()
	app.ErrWriter = &stderr
	code := Main(app, args)
	return code, stderr.String()
}

func TestMistypedFlagIsNamed(t *testing.T) {
	code, stderr := run(t, "fleet-send", "--jsn", "bob", "hi")
	if code != 64 || !strings.Contains(stderr, "fleet-send: hint: did you mean --json?") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// A quoted text that starts with "-", written where a flag may be, is
// refused (64) with a hint that shows it after "--".
func TestDashTextHintsDoubleDash(t *testing.T) {
	code, stderr := run(t, "fleet-send", "bob", "-v is broken")
	if code != 64 || !strings.Contains(stderr, `goes after --: fleet-send bob -- '-v is broken' (or comes on stdin: fleet-send bob -)`) {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// Under --json, stderr is the JSON error object alone.
func TestJSONErrorsAlone(t *testing.T) {
	code, stderr := run(t, "fleet-send", "--json", "--jsn", "bob", "hi")
	if code != 64 {
		t.Fatalf("exit %d", code)
	}
	var v struct {
		Error struct {
			Kind string `json:"kind"`
			Exit int    `json:"exit"`
			Hint string `json:"hint"`
		} `json:"error"`
	}
	if strings.Count(stderr, "\n") != 1 || json.Unmarshal([]byte(stderr), &v) != nil || v.Error.Exit != 64 ||
		!strings.Contains(v.Error.Hint, "--json") {
		t.Errorf("stderr %q", stderr)
	}
}
