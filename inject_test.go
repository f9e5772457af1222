package fleet_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"unicode/utf8"

	"github.com/rogpeppe/go-internal/testscript"
)

// pasted REC bracketed|plain PANE LINE TEXT — REC, the bytes a pane program
// received (see scripts/internal/pasterec), is exactly one paste and one
// Enter: ESC[200~ PASTE ESC[201~ CR when the program enabled bracketed
// paste (bracketed), PASTE CR when it did not (plain). PASTE must equal the
// file LINE (the message on one line) — or TEXT (header line, then the
// body with its newlines) when PANE is bracketed and tmux reports so in
// #{bracket_paste_flag}, which tmux 3.3a does not have. Whatever the files
// say, it checks that the only CR is the last byte, that PASTE holds no
// other byte below 0x20 (LF and TAB only in the TEXT form), no DEL and no C1
// control, and so no escape sequence.
func cmdPasted(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 5 || args[1] != "bracketed" && args[1] != "plain" {
		ts.Fatalf("usage: pasted REC bracketed|plain PANE LINE TEXT")
	}
	rec, err := os.ReadFile(ts.MkAbs(args[0]))
	ts.Check(err)
	bracketed := args[1] == "bracketed"
	want := args[3]
	if bracketed {
		tm := exec.Command("tmux", "display-message", "-p", "-t", args[2], "#{bracket_paste_flag}")
		tm.Env = scriptEnv(ts)
		out, err := tm.Output()
		ts.Check(err)
		if strings.TrimSpace(string(out)) == "1" {
			want = args[4]
		}
	}
	lines := want == args[4]
	data, err := os.ReadFile(ts.MkAbs(want))
	ts.Check(err)
	wantPaste := strings.TrimSuffix(string(data), "\n")
	ts.Logf("recorded: %q", rec)

	// the shape: one paste, one Enter, nothing after it
	if bytes.Count(rec, []byte("\r")) != 1 || !bytes.HasSuffix(rec, []byte("\r")) {
		ts.Fatalf("%s: want exactly one CR, the last byte (the gateway's Enter)", args[0])
	}
	paste := rec[:len(rec)-1]
	if bracketed {
		start, end := []byte("\x1b[200~"), []byte("\x1b[201~")
		if !bytes.HasPrefix(paste, start) || !bytes.HasSuffix(paste, end) {
			ts.Fatalf("%s: not one bracketed paste followed by Enter", args[0])
		}
		paste = paste[len(start) : len(paste)-len(end)]
	}
	// the paste itself: text only
	if !utf8.Valid(paste) {
		ts.Fatalf("%s: the paste is not valid UTF-8", args[0])
	}
	for i, r := range string(paste) {
		if lines && (r == '\n' || r == '\t') {
			continue
		}
		if r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f {
			ts.Fatalf("%s: control %U at byte %d of the paste", args[0], r, i)
		}
	}
	if string(paste) != wantPaste {
		ts.Fatalf("%s: the paste is\n%q\nwant (%s)\n%q", args[0], paste, want, wantPaste)
	}
}
