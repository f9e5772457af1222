package topapp

// filter.go — the filter of the live view: host:H and group:G terms
// beside a substring (/ to type it, h and g to step through them).

import (
	"slices"
	"strings"
)

// query is the filter: host:H and group:G terms, and a substring (the
// rest of it).
type query struct{ host, group, text string }

func parseQuery(s string) query {
	var q query
	var rest []string
	for _, f := range strings.Fields(s) {
		switch {
		case strings.HasPrefix(f, "host:"):
			q.host = strings.TrimPrefix(f, "host:")
		case strings.HasPrefix(f, "group:"):
			q.group = strings.TrimPrefix(f, "group:")
		default:
			rest = append(rest, f)
		}
	}
	q.text = strings.Join(rest, " ")
	return q
}

func (q query) String() string {
	var out []string
	if q.host != "" {
		out = append(out, "host:"+q.host)
	}
	if q.group != "" {
		out = append(out, "group:"+q.group)
	}
	if q.text != "" {
		out = append(out, q.text)
	}
	return strings.Join(out, " ")
}

// hostOf is the host a gid names (<host>.<uuid>).
func hostOf(gid string) string {
	if i := strings.LastIndexByte(gid, '.'); i > 0 {
		return gid[:i]
	}
	return ""
}

// matches says whether it passes the filter q: the substring (any case)
// in its text, one of its hosts the host, one of its entities in the
// group (groups: gid -> its groups).
func (it item) matches(q query, groups map[string][]string) bool {
	if q.text != "" && !strings.Contains(strings.ToLower(it.text), strings.ToLower(q.text)) {
		return false
	}
	if q.host != "" && !slices.Contains(it.hosts, q.host) {
		return false
	}
	if q.group != "" && !slices.ContainsFunc(it.gids, func(g string) bool { return slices.Contains(groups[g], q.group) }) {
		return false
	}
	return true
}
