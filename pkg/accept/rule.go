// Package accept holds the pure logic of an entity's inbound policy
// (issue 37.1): parsing the patterns of `--accept` and matching a
// proven sender against them. It owns no state and does no I/O; the
// gateway part that stores and enforces a policy is built on it.
//
// Syntax of one rule:
//
//	WHO[/KIND,KIND...]
//
// WHO is NAME, NAME@HOST, @HOST, group:G or *. The optional kinds
// after a slash are SEND, ASK, BROADCAST, SPAWN, STOP; without them a
// rule accepts every kind. The slash cannot clash with group:G, nor
// with a name or host, since neither may hold a slash.
package accept

import (
	"fmt"
	"strings"
)

// Kind is one kind of inbound traffic a rule may be limited to.
type Kind string

// The kinds a rule may name.
const (
	Send      Kind = "SEND"
	Ask       Kind = "ASK"
	Broadcast Kind = "BROADCAST"
	Spawn     Kind = "SPAWN"
	Stop      Kind = "STOP"
)

var allKinds = []Kind{Send, Ask, Broadcast, Spawn, Stop}

// Rule is one parsed pattern. Zero fields mean "any".
type Rule struct {
	Raw   string // the text as given, for messages naming the rule
	Name  string // entity name; "" means any
	Host  string // host id; "" means any
	Group string // group name, for group:G
	Any   bool   // the rule is *
	Kinds []Kind // nil means every kind
}

// Sender is the proven origin of a message: the entity and host as
// the sending gateway authenticated them, and the groups the sender
// belongs to on the receiving host's roster.
type Sender struct {
	Name   string
	Host   string
	Groups []string
}

// Parse reads one rule. Its error is one line with a hint.
func Parse(s string) (Rule, error) {
	r := Rule{Raw: s}
	who, kinds, hasKinds := strings.Cut(s, "/")
	if hasKinds {
		if kinds == "" {
			return r, fmt.Errorf("accept pattern %q: empty kind list after '/' (hint: e.g. bob@h2/SEND,ASK)", s)
		}
		for _, k := range strings.Split(kinds, ",") {
			kk, ok := parseKind(k)
			if !ok {
				return r, fmt.Errorf("accept pattern %q: unknown kind %q (hint: one of SEND, ASK, BROADCAST, SPAWN, STOP)", s, k)
			}
			r.Kinds = append(r.Kinds, kk)
		}
	}
	switch {
	case who == "*":
		r.Any = true
	case strings.HasPrefix(who, "group:"):
		r.Group = strings.TrimPrefix(who, "group:")
		if !validWord(r.Group) {
			return r, fmt.Errorf("accept pattern %q: bad group name (hint: group:G with G letters, digits, '-', '_' or '.')", s)
		}
	default:
		name, host, at := strings.Cut(who, "@")
		if at && host == "" || !at && name == "" ||
			name != "" && !validWord(name) || host != "" && !validWord(host) {
			return r, fmt.Errorf("accept pattern %q: not NAME, NAME@HOST, @HOST, group:G or * (hint: e.g. bob@h2 or @h2/SEND)", s)
		}
		r.Name, r.Host = name, host
	}
	return r, nil
}

func parseKind(s string) (Kind, bool) {
	for _, k := range allKinds {
		if strings.EqualFold(s, string(k)) {
			return k, true
		}
	}
	return "", false
}

func validWord(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.'
		if !ok {
			return false
		}
	}
	return true
}

// Matches reports whether the rule accepts traffic of kind k from s.
func (r Rule) Matches(s Sender, k Kind) bool {
	if r.Kinds != nil && !hasKind(r.Kinds, k) {
		return false
	}
	switch {
	case r.Any:
		return true
	case r.Group != "":
		for _, g := range s.Groups {
			if g == r.Group {
				return true
			}
		}
		return false
	}
	return (r.Name == "" || r.Name == s.Name) && (r.Host == "" || r.Host == s.Host)
}

func hasKind(ks []Kind, k Kind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// Decide returns whether any rule accepts, and the rule that did.
// An empty policy accepts nothing.
func Decide(rules []Rule, s Sender, k Kind) (Rule, bool) {
	for _, r := range rules {
		if r.Matches(s, k) {
			return r, true
		}
	}
	return Rule{}, false
}

// ParseAll reads a list of rules, as given (a flag repeated, a config
// value split at commas): the first bad one is the error.
func ParseAll(patterns []string) ([]Rule, error) {
	rules := make([]Rule, 0, len(patterns))
	for _, p := range patterns {
		r, err := Parse(strings.TrimSpace(p))
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// Everyone reports whether rules accept every kind from everyone (a *
// with no kinds): the policy that needs no look at the sender.
func Everyone(rules []Rule) bool {
	for _, r := range rules {
		if r.Any && r.Kinds == nil {
			return true
		}
	}
	return false
}

// NeedsGroups reports whether a rule names a group: only then are the
// sender's groups looked up.
func NeedsGroups(rules []Rule) bool {
	for _, r := range rules {
		if r.Group != "" {
			return true
		}
	}
	return false
}

// String is the rules as given, separated by commas ("nothing": none).
func String(rules []Rule) string {
	if len(rules) == 0 {
		return "nothing"
	}
	s := make([]string, len(rules))
	for i, r := range rules {
		s[i] = r.Raw
	}
	return strings.Join(s, ", ")
}
