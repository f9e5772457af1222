package deliver

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/envelope"
)

func TestInert(t *testing.T) {
	type tc struct {
		name  string
		in    string
		keep  string // Inert(in, true)
		inert string // Inert(in, false); "" means the same as keep
	}
	cases := []tc{
		{"plain", "hello, world", "hello, world", ""},
		{"empty", "", "", ""},
		{"newline", "a\nb", "a\nb", "a␊b"},
		{"tab", "a\tb", "a\tb", "a␉b"},
		{"CR is Enter", "rm -rf x\r", "rm -rf x␍", ""},
		{"CRLF", "a\r\nb", "a␍\nb", "a␍␊b"},
		{"DEL", "a\x7fb", "a␡b", ""},
		{"paste end", "\x1b[201~", "␛[201~", ""},
		{"paste start", "\x1b[200~", "␛[200~", ""},
		{"paste escape", "x\x1b[201~\x1b[Z/quit\r", "x␛[201~␛[Z/quit␍", ""},
		{"OSC title BEL", "\x1b]0;title\x07", "␛]0;title␇", ""},
		{"OSC title ST", "\x1b]0;t\x1b\\", "␛]0;t␛\\", ""},
		{"OSC 52 clipboard", "\x1b]52;c;cm0gLXJmIC8=\x07", "␛]52;c;cm0gLXJmIC8=␇", ""},
		{"C1 CSI", "\u009b201~", "⟨U+009B⟩201~", ""},
		{"C1 first and last", "\u0080\u009f", "⟨U+0080⟩⟨U+009F⟩", ""},
		{"C1 OSC ST", "\u009d0;t\u009c", "⟨U+009D⟩0;t⟨U+009C⟩", ""},
		{"after C1", "\u00a0é", "\u00a0é", ""},
		{"accents", "é café", "é café", ""},
		{"CJK", "日本", "日本", ""},
		{"emoji", "🚀 👍🏽", "🚀 👍🏽", ""},
		{"ZWJ emoji", "👩‍💻", "👩‍💻", ""},
		{"literal control picture", "␛[201~", "⟨U+241B⟩[201~", ""},
		{"literal DEL picture", "␡", "⟨U+2421⟩", ""},
		{"literal angle", "⟨U+009B⟩", "⟨U+27E8⟩U+009B⟩", ""},
		{"other angle kept", "⟩ 〈", "⟩ 〈", ""},
		{"symbol for newline kept", "␤", "␤", ""},
		{"invalid byte", "a\xffb", "a⟨0xFF⟩b", ""},
		{"truncated rune", "h\xc3", "h⟨0xC3⟩", ""},
		{"raw C1 byte", "\x9b201~", "⟨0x9B⟩201~", ""},
		{"surrogate half", "\xed\xa0\x80", "⟨0xED⟩⟨0xA0⟩⟨0x80⟩", ""},
	}
	// every C0 control but LF and TAB, alone and amid text
	for c := 0; c < 0x20; c++ {
		if c == '\n' || c == '\t' {
			continue
		}
		pic := string(rune(0x2400 + c))
		cases = append(cases, tc{fmt.Sprintf("C0 %#02x", c), "a" + string(rune(c)) + "b", "a" + pic + "b", ""})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.inert == "" {
				c.inert = c.keep
			}
			if got := Inert(c.in, true); got != c.keep {
				t.Errorf("Inert(%q, true) = %q, want %q", c.in, got, c.keep)
			}
			got := Inert(c.in, false)
			if got != c.inert {
				t.Errorf("Inert(%q, false) = %q, want %q", c.in, got, c.inert)
			}
			checkInert(t, got, false)
			checkInert(t, Inert(c.in, true), true)
		})
	}
}

// checkInert fails unless s is valid UTF-8 without a control character
// (LF and TAB allowed with keep).
func checkInert(t *testing.T, s string, keep bool) {
	t.Helper()
	if !utf8.ValidString(s) {
		t.Errorf("%q is not valid UTF-8", s)
	}
	for _, r := range s {
		if (r == '\n' || r == '\t') && keep {
			continue
		}
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			t.Errorf("%q holds control %U", s, r)
		}
	}
}

// Every byte value and every rune up to U+00FF, whatever surrounds it,
// comes out as inert, valid UTF-8.
func TestInertAllBytes(t *testing.T) {
	var all []byte
	for b := 0; b < 256; b++ {
		all = append(all, 'x', byte(b))
	}
	var runes strings.Builder
	for r := rune(0); r < 0x100; r++ {
		runes.WriteRune(r)
	}
	for _, s := range []string{string(all), runes.String()} {
		checkInert(t, Inert(s, true), true)
		checkInert(t, Inert(s, false), false)
		if strings.ContainsAny(Inert(s, false), "\n\t") {
			t.Errorf("Inert(_, false) kept a newline or tab")
		}
	}
}

func TestTextAndLine(t *testing.T) {
	env := &envelope.Envelope{
		Kind:      envelope.Send,
		MsgID:     "m1\r\x1b[201~",
		Sender:    envelope.Party{Name: "ev\nil", Host: "h\x1b]0;x\x07"},
		Body:      "line one\n\tline two\x1b[201~\r\u009b\x7f\n\n",
		Recipient: envelope.Party{Gid: "g"},
		Created:   time.Now(),
	}
	hdr := "[fleet send from ev␊il@h␛]0;x␇ · msg m1␍␛[201~ · reply: fleet-send --reply-to m1␍␛[201~ TEXT]"
	if got, want := Text(env), hdr+"\nline one\n\tline two␛[201~␍⟨U+009B⟩␡"; got != want {
		t.Errorf("Text = %q\nwant   %q", got, want)
	}
	if got, want := Line(env), hdr+" line one␊␉line two␛[201~␍⟨U+009B⟩␡"; got != want {
		t.Errorf("Line = %q\nwant   %q", got, want)
	}
	env.Kind, env.InReplyTo = envelope.Reply, "r\n1"
	if got, want := Line(env), "[fleet reply from ev␊il@h␛]0;x␇ · msg m1␍␛[201~ · re r␊1] line one"; !strings.HasPrefix(got, want) {
		t.Errorf("Line = %q\nwant prefix %q", got, want)
	}
}
