// Package jsonw writes the one JSON value the gateway encodes for every
// message event by hand — an audit line (pkg/audit) — byte for byte as
// encoding/json would, without its reflection: the string escaping of
// json.Marshal (HTML characters escaped, invalid UTF-8 as U+FFFD, U+2028
// and U+2029 escaped) and time.Time's RFC 3339 form.
//
// What it pays, from scripts/bench-libs.sh (part of make bench; both ways
// in the same run, repeated): an audit line of a delivered message is
// written in 0.4-1.9 µs by hand against 2.0-9.3 µs by json.Marshal, a
// ratio of 3.7-8.5x (medians of four sets of 3-9 runs, 2026-12-02, a busy
// 2-core VM; no run below 2.2x), and without an allocation (json.Marshal:
// 3). The stored envelope's encoder and scanner that were here did not pay
// in the same runs (json.Marshal 0.77-0.99x their time, json.Unmarshal
// 0.87-2.1x) and went back to encoding/json, as did the gateway's request
// scanner that was here (five alternating scripts/bench-local.sh runs of
// the two builds: see pkg/api's WriteFrame).
package jsonw

import (
	"time"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// plain says which ASCII bytes encoding/json copies as they are (its
// htmlSafeSet): everything printable but '"', '\\', '<', '>' and '&'.
var plain = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

// String appends s as json.Marshal encodes a string.
func String(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if plain[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Time appends t as its MarshalJSON does; ok is false (dst unchanged)
// where that fails (a year outside 0-9999), for
// the caller to fall back on encoding/json and its error.
func Time(dst []byte, t time.Time) (out []byte, ok bool) {
	b := append(dst, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return dst, false
	}
	return append(b, '"'), true
}
