package broker

import (
	"net"
	"net/url"
	"strings"

	"github.com/fleetd/fleet/pkg/config"
)

// The broker setting: its node URIs, redacted for logs, and whether
// one of them sends in clear.

// SplitURLs splits a broker setting into its node URIs (config.BrokerNodes).
func SplitURLs(raw string) []string { return config.BrokerNodes(raw) }

// nodeURLs are the node URIs of a broker setting, a node without user info
// taking the login of the first (one login, several nodes of a cluster).
func nodeURLs(raw string) []string {
	urls := SplitURLs(raw)
	first, err := url.Parse(urls[0])
	if err != nil || first.User == nil {
		return urls
	}
	for i, one := range urls[1:] {
		if u, err := url.Parse(one); err == nil && u.User == nil {
			u.User = first.User
			urls[i+1] = u.String()
		}
	}
	return urls
}

// RedactAll is Redact of every node URI in raw, comma-separated.
func RedactAll(raw string) string {
	var out []string
	for _, u := range SplitURLs(raw) {
		out = append(out, Redact(u))
	}
	return strings.Join(out, ",")
}

// Redact returns the URL without its user info: credentials never appear in
// logs or errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable broker URL)"
	}
	u.User = nil
	return u.String()
}

// InClear reports whether raw (one or several node URIs) has a plain
// amqp:// URI to a host that is not this machine: then every message
// crosses a network unencrypted. It also returns that broker's host, for
// the warning.
func InClear(raw string) (bool, string) {
	for _, one := range SplitURLs(raw) {
		if clear, h := inClear(one); clear {
			return true, h
		}
	}
	return false, ""
}

func inClear(raw string) (bool, string) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "amqp" {
		return false, ""
	}
	h := u.Hostname()
	if h == "localhost" {
		return false, h
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return false, h
	}
	return true, h
}
