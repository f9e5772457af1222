package jsonw

import (
	"unicode/utf16"
	"unicode/utf8"
)

// Scanner reads the compact JSON objects this package's writers (and
// json.Marshal) make — objects of string fields, no whitespace — without
// reflection. It reads a string as json.Unmarshal would; anything it does
// not read exactly so (whitespace, a number, null, an escaped surrogate, a
// control byte, invalid UTF-8, an unknown key at the caller's discretion)
// makes it Bad, and the caller then decodes the same bytes with
// encoding/json instead: the scanner is a fast path, never a second
// grammar.
type Scanner struct {
	b   []byte
	i   int
	bad bool
}

// NewScanner scans data.
func NewScanner(data []byte) *Scanner { return &Scanner{b: data} }

// Bad says whether anything so far could not be read exactly.
func (s *Scanner) Bad() bool { return s.bad }

// Fail marks the scan bad (an unknown key, a value of another type).
func (s *Scanner) Fail() { s.bad = true }

func (s *Scanner) next(c byte) bool {
	if s.bad || s.i >= len(s.b) || s.b[s.i] != c {
		return false
	}
	s.i++
	return true
}

// Open reads the '{' of an object.
func (s *Scanner) Open() {
	if !s.next('{') {
		s.bad = true
	}
}

// More says whether the object has another field (reading the ',' before
// it), or reads its '}' and says false.
func (s *Scanner) More(first bool) bool {
	if s.bad {
		return false
	}
	if s.next('}') {
		return false
	}
	if !first && !s.next(',') {
		s.bad = true
		return false
	}
	return true
}

// Key reads a field's name and its ':'.
func (s *Scanner) Key() string {
	k := s.String()
	if !s.next(':') {
		s.bad = true
	}
	return k
}

// Done says whether the scan read everything, exactly.
func (s *Scanner) Done() bool { return !s.bad && s.i == len(s.b) }

// String reads a JSON string.
func (s *Scanner) String() string {
	raw, esc := s.span()
	if s.bad {
		return ""
	}
	if !esc {
		return string(raw)
	}
	return s.unescape(raw)
}

// RawString reads a JSON string that has no escapes, as the bytes
// between its quotes (what time.Time's UnmarshalJSON reads).
func (s *Scanner) RawString() []byte {
	raw, esc := s.span()
	if esc {
		s.bad = true
	}
	if s.bad {
		return nil
	}
	return raw
}

// span finds the string at s.i: its bytes between the quotes, and whether
// they hold an escape. Control bytes and invalid UTF-8 make it bad.
func (s *Scanner) span() (raw []byte, esc bool) {
	if !s.next('"') {
		s.bad = true
		return nil, false
	}
	start := s.i
	ascii := true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[start:s.i]
			s.i++
			if !ascii && !utf8.Valid(raw) {
				s.bad = true
			}
			return raw, esc
		case c == '\\':
			esc = true
			s.i += 2
			continue
		case c < 0x20:
			s.bad = true
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		s.i++
	}
	s.bad = true
	return nil, false
}

func hexVal(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// unescape decodes the escapes of raw; an escaped surrogate, or any escape
// JSON does not have, makes it bad.
func (s *Scanner) unescape(raw []byte) string {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 >= len(raw) {
			s.bad = true
			return ""
		}
		i++
		switch raw[i] {
		case '"', '\\', '/':
			out = append(out, raw[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+4 >= len(raw) {
				s.bad = true
				return ""
			}
			var r rune
			for _, h := range raw[i+1 : i+5] {
				v := hexVal(h)
				if v < 0 {
					s.bad = true
					return ""
				}
				r = r<<4 | v
			}
			if utf16.IsSurrogate(r) {
				s.bad = true // pairs and lone halves: encoding/json's rules
				return ""
			}
			out = utf8.AppendRune(out, r)
			i += 4
		default:
			s.bad = true
			return ""
		}
	}
	return string(out)
}

// Strings reads a JSON array of strings (null is not read: bad).
func (s *Scanner) Strings() []string {
	if !s.next('[') {
		s.bad = true
		return nil
	}
	out := []string{}
	for first := true; !s.bad; first = false {
		if s.next(']') {
			return out
		}
		if !first && !s.next(',') {
			s.bad = true
			break
		}
		out = append(out, s.String())
	}
	return nil
}
