package examples

import (
	"errors"
	"regexp"
	"strings"
)

// Calls finds every call of command name in one shell line (first on the
// line, after a pipe or a list operator, in $( ), after a prompt "a$",
// variable assignments or a launcher's "--") and returns the arguments of
// each, up to the shell operator or the ")" that ends it. It does no
// expansion.
func Calls(line, name string) ([][]string, error) {
	words, err := Words(line)
	if err != nil {
		return nil, err
	}
	var calls [][]string
	for i, w := range words {
		if !strings.Contains(w, "$(") && !commandPosition(words[:i]) {
			continue // an argument: journalctl -u fleet-gw
		}
		if w != name && !strings.HasSuffix(w, "$("+name) {
			continue
		}
		var args []string
		for _, a := range words[i+1:] {
			if IsShellOperator(a) {
				break
			}
			if strings.HasSuffix(a, ")") { // the end of $( ... )
				args = append(args, strings.TrimSuffix(a, ")"))
				break
			}
			args = append(args, a)
		}
		calls = append(calls, args)
	}
	return calls, nil
}

// commandPosition reports whether the word after before is a command: the
// first word, one after a shell operator, a prompt ("a$") or variable
// assignments, or after "--", where a launcher's own options end
// (claude mcp add fleet -- fleet-mcp ...).
func commandPosition(before []string) bool {
	for i := len(before) - 1; i >= 0; i-- {
		w := before[i]
		switch {
		case w == "--" || strings.HasSuffix(w, "$") || IsShellOperator(w) || w == "||" || w == "&&":
			return true
		case assignment.MatchString(w):
			continue
		default:
			return false
		}
	}
	return true
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// IsShellOperator reports whether w is (or starts with) a pipe, a list or a
// redirection operator: a fleet command's arguments end there.
func IsShellOperator(w string) bool {
	for _, op := range []string{"|", "&", ";", "<", ">", "2>"} {
		if strings.HasPrefix(w, op) {
			return true
		}
	}
	return false
}

// Words splits a line into words the way sh does for quoting: single
// quotes, double quotes with backslash escapes, and backslashes; a word
// that begins with # begins a comment. It does no expansion.
func Words(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '#' && !inWord:
			i = len(line) // a comment, to the end of the line
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case ch == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
		case ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
