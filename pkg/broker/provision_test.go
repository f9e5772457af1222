package broker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// The grant's patterns, read the way RabbitMQ reads them (a regular
// expression searched in the name or key; these use no PCRE-only syntax).
// The broker's own verdicts are tested in pkg/gateway
// (TestCrossLeastPrivilege); this pins the patterns' intent.
func TestHostGrantPatterns(t *testing.T) {
	g := HostGrant("fleet", "h1")
	const own, other = "h1.01a22a93-8b62-7719-997e-dae6eae12382", "h2.01a22a93-8b62-7719-997e-dae6eae12382"
	check := func(what, pattern string, yes, no []string) {
		t.Helper()
		re := regexp.MustCompile(pattern)
		for _, s := range yes {
			if !re.MatchString(s) {
				t.Errorf("%s refuses %q", what, s)
			}
		}
		for _, s := range no {
			if re.MatchString(s) {
				t.Errorf("%s allows %q", what, s)
			}
		}
	}
	check("configure", g.Configure,
		[]string{InboxQueue(own), ControlQueue("h1"), RosterQueue("h1")},
		[]string{InboxQueue(other), ControlQueue("h2"), RosterQueue("h2"), ExMsg, QDLQ, "agent.h1.x.inbox", "control.h10", "roster.h1x", "agent.h1.01a22a93-8b62-7719-997e-dae6eae12382.inbox.x"})
	check("read", g.Read,
		[]string{InboxQueue(own), ExMsg, ExRoster, ExControl},
		[]string{InboxQueue(other), "bridge.dlx", QDLQ, ""})
	check("write", g.Write,
		[]string{InboxQueue(own), ExMsg, ExRoster, ExControl},
		[]string{InboxQueue(other), QDLQ, "bridge.dlx", ""})
	topics := map[string]TopicGrant{}
	for _, tg := range g.Topics {
		topics[tg.Exchange] = tg
	}
	check("bind bridge.msg", topics[ExMsg].Read,
		[]string{own, "broadcast.all", "broadcast.ci"},
		[]string{other, "#", "*", "h1.*", "h1.#", "broadcast.*", "broadcast.#", "broadcast.all.x", own + ".x"})
	check("publish bridge.msg", topics[ExMsg].Write,
		[]string{own, other, "broadcast.all", DeadKey("h1")},
		[]string{"#", "x", other + ".x", DeadKey("h2"), DeadKey("h10")})
	check("publish bridge.roster", topics[ExRoster].Write,
		[]string{"roster.h1.leaving", "roster.h1." + own},
		[]string{"roster.h2.leaving", "roster.h10.x", "roster"})
	check("bind bridge.roster", topics[ExRoster].Read, []string{"roster.#"}, []string{"#", "roster.h2.*"})
	check("bind bridge.control", topics[ExControl].Read, []string{"h1"}, []string{"h2", "#", "*", "h10"})

	op := OperatorGrant("fleet", "ops")
	check("operator read", op.Read, []string{QDLQ}, []string{InboxQueue(own), ExMsg, ControlQueue("h1")})
	check("operator configure", op.Configure, nil, []string{QDLQ, ExMsg, InboxQueue(own)})
}

// The password reaches RabbitMQ only as its salted SHA-256 (the form of
// rabbit_password_hashing_sha256), and the definitions hold the user,
// its permissions and the topology.
func TestDefinitions(t *testing.T) {
	h := HashPassword("s3cret")
	raw, err := base64.StdEncoding.DecodeString(h)
	if err != nil || len(raw) != 36 {
		t.Fatalf("hash %q: %v", h, err)
	}
	if sum := sha256.Sum256(append(raw[:4:4], "s3cret"...)); string(sum[:]) != string(raw[4:]) {
		t.Fatal("the hash is not sha256(salt ++ password)")
	}
	if HashPassword("s3cret") == h {
		t.Fatal("two hashes of one password share a salt")
	}
	g := HostGrant("v", "h1")
	var d struct {
		Users []struct {
			Name         string
			PasswordHash string `json:"password_hash"`
		}
		Permissions      []map[string]string
		TopicPermissions []map[string]string `json:"topic_permissions"`
		Exchanges        []struct{ Name, Type string }
		Queues           []struct{ Name string }
		Bindings         []struct {
			Source, Destination string
			RoutingKey          string `json:"routing_key"`
		}
	}
	out := Definitions("v", "classic", &g, h)
	if strings.Contains(string(out), "s3cret") {
		t.Fatal("the definitions hold the password")
	}
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Users) != 1 || d.Users[0].PasswordHash != h || len(d.Permissions) != 1 || d.Permissions[0]["read"] != g.Read ||
		len(d.TopicPermissions) != 4 || len(d.Exchanges) != 4 || d.Queues[0].Name != QDLQ ||
		len(d.Bindings) != 2 || d.Bindings[0].Source != ExMsg || d.Bindings[0].RoutingKey != "fleet.dead.*" ||
		d.Bindings[1].Source != ExDead || d.Bindings[1].RoutingKey != DLQDeadKey {
		t.Fatalf("definitions: %s", out)
	}
	for _, e := range d.Exchanges {
		if e.Name == ExControl && e.Type != "topic" {
			t.Errorf("bridge.control is %s: its binding keys could not be confined", e.Type)
		}
	}
}

func TestStepShell(t *testing.T) {
	steps := SetupSteps(HostGrant("v", "h1"), "v", "classic")
	if got := steps[1].Shell("rabbitmqctl"); got != `printf '%s\n' "$PASSWORD" | rabbitmqctl add_user fleet-gw-h1@v` {
		t.Errorf("add_user: %s", got)
	}
	if got := steps[2].Shell("rabbitmqctl"); !strings.Contains(got, `'^(agent\.h1\.[0-9a-f-]{36}\.inbox|control\.h1|roster\.h1|deaths\.h1)$'`) {
		t.Errorf("set_permissions: %s", got)
	}
	if got := shellQuote("it's"); got != `'it'\''s'` {
		t.Errorf("quote: %s", got)
	}
}

func TestInClear(t *testing.T) {
	for raw, want := range map[string]bool{
		"amqp://u:p@broker.example:5672/fleet": true,
		"amqp://u:p@10.1.2.3:5672/":            true,
		"amqp://u:p@[2001:db8::1]:5672/":       true,
		"amqps://u:p@broker.example:5671/":     false,
		"amqp://u:p@127.0.0.1:5699/":           false,
		"amqp://u:p@127.1.2.3:5699/":           false,
		"amqp://u:p@localhost:5672/":           false,
		"amqp://u:p@[::1]:5672/":               false,
		"%%%":                                  false,
	} {
		if got, _ := InClear(raw); got != want {
			t.Errorf("InClear(%s) = %v, want %v", raw, got, want)
		}
	}
}

func TestParseBase(t *testing.T) {
	for raw, vhost := range map[string]string{
		"amqps://h:5671/fleet": "fleet", "amqps://h/": "/", "amqp://h": "/", "amqp://h/%2f": "/", "amqp://h/a%2Fb": "a/b",
	} {
		if _, v, err := ParseBase(raw); err != nil || v != vhost {
			t.Errorf("ParseBase(%s) = %q, %v; want %q", raw, v, err, vhost)
		}
	}
	for _, raw := range []string{"amqp://u:p@h/", "http://h/", "amqp:///x", "%%"} {
		if _, _, err := ParseBase(raw); err == nil {
			t.Errorf("ParseBase(%s) accepted", raw)
		}
	}
}
