package deliver

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Inert returns s as text that no terminal program can take for a key or
// an escape sequence: every control character is replaced by a visible
// stand-in, so ESC [ 201 ~ (the end of a bracketed paste), CR (Enter),
// Ctrl-C and every other escape sequence arrive as characters to read.
//
// The notation, one visible form per neutralised byte or rune:
//
//   - a C0 control U+0000–U+001F is its Unicode Control Picture, U+2400
//     plus its code: ␀ for NUL, ␃ for Ctrl-C, ␉ for TAB, ␊ for LF, ␍ for
//     CR, ␛ for ESC, ␟ for U+001F. With keepNewlines, LF and TAB are kept
//     as they are (the body of a bracketed paste); otherwise they are ␊ and
//     ␉ too.
//   - DEL (U+007F) is ␡ (U+2421).
//   - a C1 control U+0080–U+009F is written ⟨U+009B⟩ (its code point, four
//     hex digits, in mathematical angle brackets).
//   - a byte that is not part of valid UTF-8 is written ⟨0xFF⟩.
//   - so that every stand-in is unambiguous, a literal U+2400–U+2421 or ⟨
//     (U+27E8) in s is written the same way, ⟨U+241B⟩ or ⟨U+27E8⟩: in the
//     result a Control Picture always stands for a neutralised control and
//     ⟨ always opens one of these forms.
//
// Everything else, valid multi-byte UTF-8 included, is kept as is.
func Inert(s string, keepNewlines bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "⟨0x%02X⟩", s[i])
		case (r == '\n' || r == '\t') && keepNewlines:
			b.WriteRune(r)
		case r < 0x20:
			b.WriteRune(0x2400 + r)
		case r == 0x7f:
			b.WriteRune('\u2421')
		case r >= 0x80 && r <= 0x9f, r >= 0x2400 && r <= 0x2421, r == '⟨':
			fmt.Fprintf(&b, "⟨U+%04X⟩", r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
