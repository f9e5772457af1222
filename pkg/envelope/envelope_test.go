package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// allKinds is written out by hand so that a kind added to the code without a
// test here (or removed from it) fails TestAllKindsCovered.
var allKinds = []Kind{
	Send, Reply, Ask, Answer, TooLate, Broadcast, Presence,
	Spawn, SpawnResult, Stop, StopResult, Receipt, Bounce, Trace, TraceResult, Notice,
}

// asFault returns err as a *fault.Error, failing the test when it is not one.
func asFault(t *testing.T, err error) *fault.Error {
	t.Helper()
	if err == nil {
		t.Fatal("got no error, want a *fault.Error")
	}
	var fe *fault.Error
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *fault.Error", err, err)
	}
	return fe
}

// wantFault checks that err is a fault of the given kind and code 65, and
// that no envelope came with it.
func wantFault(t *testing.T, e *Envelope, err error, kind fault.Kind) *fault.Error {
	t.Helper()
	fe := asFault(t, err)
	if fe.Kind != kind {
		t.Errorf("fault kind = %q, want %q (error: %v)", fe.Kind, kind, err)
	}
	if fe.Code != fault.Data || fault.CodeOf(err) != 65 {
		t.Errorf("fault code = %d, want 65 (error: %v)", fe.Code, err)
	}
	if e != nil {
		t.Errorf("got an envelope %+v alongside error %v", e, err)
	}
	return fe
}

// sameEnvelope compares two envelopes field by field, times by instant.
func sameEnvelope(t *testing.T, got, want *Envelope) {
	t.Helper()
	if got == nil || want == nil {
		t.Fatalf("sameEnvelope: got %v, want %v", got, want)
	}
	g, w := *got, *want
	if !g.Created.Equal(w.Created) {
		t.Errorf("Created = %v, want %v", g.Created, w.Created)
	}
	if !g.Expires.Equal(w.Expires) {
		t.Errorf("Expires = %v, want %v", g.Expires, w.Expires)
	}
	if !bytes.Equal(g.Sealed, w.Sealed) {
		t.Errorf("Sealed = %q, want %q", g.Sealed, w.Sealed)
	}
	g.Created, w.Created, g.Expires, w.Expires = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	g.Sealed, w.Sealed = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("envelope mismatch:\n got  %+v\n want %+v", g, w)
	}
}

// validMap is a complete, valid envelope as generic JSON, for tests that
// remove or replace one field.
func validMap() map[string]any {
	return map[string]any{
		"v":         "1.0",
		"msg_id":    "3f1d2c9e-0000-4000-8000-000000000001",
		"kind":      "SEND",
		"sender":    map[string]any{"gid": "g-alice", "name": "alice", "host": "h1"},
		"recipient": map[string]any{"gid": "g-bob", "name": "bob", "host": "h1"},
		"trace_id":  "3f1d2c9e-0000-4000-8000-0000000000aa",
		"created":   "2025-03-04T05:06:07.000000890Z",
		"body":      "hello bob",
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAllKindsCovered(t *testing.T) {
	if len(allKinds) != len(kinds) {
		t.Fatalf("test lists %d kinds, the code knows %d: update allKinds", len(allKinds), len(kinds))
	}
	for _, k := range allKinds {
		if !k.Known() {
			t.Errorf("kind %q is not Known()", k)
		}
	}
	for _, k := range []Kind{"", "send", "Send", "SHOUT", "SEND "} {
		if k.Known() {
			t.Errorf("kind %q is Known(), want unknown", k)
		}
	}
}

func TestRoundTripEveryKind(t *testing.T) {
	created := time.Date(2025, 3, 4, 5, 6, 7, 890, time.UTC)
	for _, k := range allKinds {
		t.Run(string(k), func(t *testing.T) {
			to := Party{Gid: "g-bob", Name: "bob", Host: "h1"}
			if k == Broadcast {
				to = Party{Group: "ops"}
			}
			e := New(k, Party{Gid: "g-alice", Name: "alice", Host: "h1"}, to, "héllo, "+string(k)+"\n")
			if e.Schema != Version || e.MsgID == "" || e.TraceID == "" || e.MsgID == e.TraceID {
				t.Fatalf("New: bad defaults %+v", e)
			}
			e.Created = created
			e.InReplyTo = "parent-msg"
			e.TurnID = "turn-7"
			e.Expires = created.Add(90 * time.Second)

			raw, err := Encode(e)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(raw, 0)
			if err != nil {
				t.Fatalf("Decode(%s): %v", raw, err)
			}
			sameEnvelope(t, got, e)

			// A second trip is byte-identical.
			raw2, err := Encode(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw, raw2) {
				t.Errorf("re-encoding differs:\n%s\n%s", raw, raw2)
			}
		})
	}
}

func TestRoundTripOmitsZeroExpiry(t *testing.T) {
	e := New(Send, Party{Gid: "a"}, Party{Gid: "b"}, "x")
	raw, err := Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(`"expires"`)) {
		t.Errorf("zero expiry was encoded: %s", raw)
	}
	got, err := Decode(raw, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Expires.IsZero() {
		t.Errorf("Expires = %v, want zero", got.Expires)
	}
	sameEnvelope(t, got, e)
}

func TestDecodeIgnoresUnknownFieldsWithinMajor(t *testing.T) {
	m := validMap()
	m["v"] = "1.7"
	m["priority"] = 3
	m["route"] = []any{"h1", "h2", map[string]any{"hop": true}}
	m["sender"].(map[string]any)["avatar"] = "🙂"
	m["future"] = map[string]any{"msg_id": 42, "kind": []any{}}
	e, err := Decode(mustJSON(t, m), 0)
	if err != nil {
		t.Fatalf("a 1.7 envelope with extra fields was refused: %v", err)
	}
	if e.Schema != "1.7" {
		t.Errorf("Schema = %q, want 1.7", e.Schema)
	}
	want := &Envelope{
		Schema: "1.7", MsgID: "3f1d2c9e-0000-4000-8000-000000000001", Kind: Send,
		Sender:    Party{Gid: "g-alice", Name: "alice", Host: "h1"},
		Recipient: Party{Gid: "g-bob", Name: "bob", Host: "h1"},
		TraceID:   "3f1d2c9e-0000-4000-8000-0000000000aa",
		Created:   time.Date(2025, 3, 4, 5, 6, 7, 890, time.UTC),
		Body:      "hello bob",
	}
	sameEnvelope(t, e, want)
}

func TestDecodeRefusesNewerMajorWithoutParsing(t *testing.T) {
	// Every other field has a type that would fail to decode: only the
	// version may have been read.
	garbage := `"msg_id":42,"kind":["SEND"],"sender":"nobody","recipient":7,` +
		`"trace_id":{"x":1},"created":"yesterday","expires":false,"body":{"a":[1,2]}`

	// Control: with a version of this major, the same garbage is a bad
	// envelope, so the newer-schema cases below prove nothing else was read.
	e, err := Decode([]byte(`{"v":"1.0",`+garbage+`}`), 0)
	wantFault(t, e, err, fault.KindBadEnvelope)

	for _, v := range []string{"2.0", "2.9", "3.0", "10.1", "99.0"} {
		t.Run(v, func(t *testing.T) {
			for _, doc := range []string{
				`{"v":"` + v + `",` + garbage + `}`,
				`{` + garbage + `,"v":"` + v + `"}`, // version last
				`{"v":"` + v + `"}`,                 // nothing else at all
			} {
				e, err := Decode([]byte(doc), 0)
				fe := wantFault(t, e, err, fault.KindNewerSchema)
				if fe.Hint == "" {
					t.Errorf("newer schema fault has no hint: %v", err)
				}
				if !strings.Contains(err.Error(), v) {
					t.Errorf("error %q does not name the version %s", err, v)
				}
			}
		})
	}
}

func TestDecodeRefusesOldOrInvalidVersion(t *testing.T) {
	cases := map[string]string{
		"older major":   `"0.9"`,
		"zero":          `"0.0"`,
		"no minor":      `"1"`,
		"words":         `"one.zero"`,
		"empty":         `""`,
		"letter minor":  `"1.x"`,
		"negative":      `"-1.0"`,
		"three parts":   `"1.0.0"`,
		"number":        `1.0`,
		"null":          `null`,
		"object":        `{"major":1}`,
		"padded major":  `" 1.0"`,
		"missing minor": `"1."`,
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			m := validMap()
			var raw json.RawMessage = []byte(v)
			m["v"] = raw
			e, err := Decode(mustJSON(t, m), 0)
			wantFault(t, e, err, fault.KindBadEnvelope)
		})
	}
	t.Run("absent", func(t *testing.T) {
		m := validMap()
		delete(m, "v")
		e, err := Decode(mustJSON(t, m), 0)
		wantFault(t, e, err, fault.KindBadEnvelope)
	})
}

func TestDecodeRefusesNonJSON(t *testing.T) {
	for _, doc := range []string{``, `{`, `[]`, `"v"`, `{"v":"1.0"`, `{"v":"1.0"} trailing`, "\x00"} {
		e, err := Decode([]byte(doc), 0)
		wantFault(t, e, err, fault.KindBadEnvelope)
	}
}

func TestDecodeRefusesMissingFields(t *testing.T) {
	cases := map[string]func(m map[string]any){
		"msg_id":          func(m map[string]any) { delete(m, "msg_id") },
		"empty msg_id":    func(m map[string]any) { m["msg_id"] = "" },
		"trace_id":        func(m map[string]any) { delete(m, "trace_id") },
		"created":         func(m map[string]any) { delete(m, "created") },
		"zero created":    func(m map[string]any) { m["created"] = "0001-01-01T00:00:00Z" },
		"recipient":       func(m map[string]any) { delete(m, "recipient") },
		"recipient names": func(m map[string]any) { m["recipient"] = map[string]any{"name": "bob", "host": "h1"} },
		"kind":            func(m map[string]any) { delete(m, "kind") },
		"unknown kind":    func(m map[string]any) { m["kind"] = "SHOUT" },
		"lowercase kind":  func(m map[string]any) { m["kind"] = "send" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			m := validMap()
			mutate(m)
			e, err := Decode(mustJSON(t, m), 0)
			wantFault(t, e, err, fault.KindBadEnvelope)
		})
	}

	// Control: the unmutated map decodes, and a group alone is a recipient.
	if _, err := Decode(mustJSON(t, validMap()), 0); err != nil {
		t.Fatalf("valid envelope refused: %v", err)
	}
	m := validMap()
	m["kind"] = "BROADCAST"
	m["recipient"] = map[string]any{"group": "all"}
	if _, err := Decode(mustJSON(t, m), 0); err != nil {
		t.Fatalf("broadcast to a group refused: %v", err)
	}
}

func TestDecodeBodyLimit(t *testing.T) {
	m := validMap()
	m["body"] = strings.Repeat("x", 10)
	raw := mustJSON(t, m)

	if _, err := Decode(raw, 10); err != nil {
		t.Errorf("body at the limit refused: %v", err)
	}
	e, err := Decode(raw, 9)
	wantFault(t, e, err, fault.KindBodyTooLarge)

	// max <= 0 means DefaultMaxBody.
	m["body"] = strings.Repeat("x", DefaultMaxBody)
	if _, err := Decode(mustJSON(t, m), 0); err != nil {
		t.Errorf("body of DefaultMaxBody refused with max 0: %v", err)
	}
	m["body"] = strings.Repeat("x", DefaultMaxBody+1)
	e, err = Decode(mustJSON(t, m), -1)
	wantFault(t, e, err, fault.KindBodyTooLarge)
}

// A sealed body (issue 27) travels as base64 beside an empty body, is
// bounded like a body (plus what sealing adds), and never sits beside
// plain text.
func TestDecodeSealed(t *testing.T) {
	m := validMap()
	m["body"] = ""
	m["sealed"] = base64.StdEncoding.EncodeToString([]byte("fsl1\x01sealed bytes"))
	e, err := Decode(mustJSON(t, m), 10)
	if err != nil {
		t.Fatalf("a sealed envelope refused: %v", err)
	}
	if string(e.Sealed) != "fsl1\x01sealed bytes" || e.Body != "" {
		t.Fatalf("sealed %q body %q", e.Sealed, e.Body)
	}
	raw, err := Encode(e)
	if err != nil || !strings.Contains(string(raw), `"sealed":"`) {
		t.Fatalf("encoded %s, %v", raw, err)
	}
	e2, err := Decode(raw, 10)
	if err != nil {
		t.Fatal(err)
	}
	sameEnvelope(t, e2, e)

	m["body"] = "hi"
	e, err = Decode(mustJSON(t, m), 10)
	wantFault(t, e, err, fault.KindBadEnvelope)

	m["body"] = ""
	m["sealed"] = ""
	e, err = Decode(mustJSON(t, m), 10)
	wantFault(t, e, err, fault.KindBadEnvelope)

	// bounded by the body limit plus what sealing adds for the hosts
	// the bytes name (two here)
	sized := func(n int) string {
		b := make([]byte, n)
		copy(b, "fsl1\x02")
		return base64.StdEncoding.EncodeToString(b)
	}
	m["sealed"] = sized(10 + SealOverhead(10, 2) + 1)
	e, err = Decode(mustJSON(t, m), 10)
	wantFault(t, e, err, fault.KindBodyTooLarge)
	m["sealed"] = sized(10 + SealOverhead(10, 2))
	if _, err := Decode(mustJSON(t, m), 10); err != nil {
		t.Errorf("sealed bytes at the limit refused: %v", err)
	}
	// not sealed bytes at all (no frame, no host)
	for _, b := range []string{"plain text", "fsl1", "fsl1\x00"} {
		m["sealed"] = base64.StdEncoding.EncodeToString([]byte(b))
		e, err = Decode(mustJSON(t, m), 10)
		wantFault(t, e, err, fault.KindBadEnvelope)
	}

	// without the field, nothing is sealed and encoding leaves it out
	delete(m, "sealed")
	m["body"] = "hi"
	e, err = Decode(mustJSON(t, m), 10)
	if err != nil || e.Sealed != nil {
		t.Fatalf("sealed %q, %v", e.Sealed, err)
	}
	if raw, _ := Encode(e); strings.Contains(string(raw), "sealed") {
		t.Fatalf("an unsealed envelope encodes a sealed field: %s", raw)
	}
}

func TestValidateBadUTF8Body(t *testing.T) {
	e := New(Send, Party{Gid: "a"}, Party{Gid: "b"}, "ok\xffno")
	wantFault(t, nil, e.Validate(DefaultMaxBody), fault.KindBadUTF8)
}

func TestCheckBody(t *testing.T) {
	cases := []struct {
		name string
		body string
		max  int
		kind fault.Kind // "" means accepted
	}{
		{"text", "hello", 10, ""},
		{"at limit", "0123456789", 10, ""},
		{"multibyte at limit", "héllo wörld", len("héllo wörld"), ""},
		{"leading space kept", "  hi", 10, ""},
		{"empty", "", 10, fault.KindEmptyBody},
		{"spaces", "   ", 10, fault.KindEmptyBody},
		{"whitespace", " \t\r\n\v\f ", 10, fault.KindEmptyBody},
		{"one over", "0123456789a", 10, fault.KindBodyTooLarge},
		{"multibyte over", "héllo", len("héllo") - 1, fault.KindBodyTooLarge},
		{"invalid byte", "abc\xff", 10, fault.KindBadUTF8},
		{"truncated rune", "h\xc3", 10, fault.KindBadUTF8},
		{"surrogate half", "\xed\xa0\x80", 10, fault.KindBadUTF8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckBody([]byte(tc.body), tc.max)
			if tc.kind == "" {
				if err != nil {
					t.Fatalf("CheckBody(%q, %d) = %v, want nil", tc.body, tc.max, err)
				}
				return
			}
			wantFault(t, nil, err, tc.kind)
		})
	}
}

func TestCheckBodyLimitIsConfigurable(t *testing.T) {
	body := []byte(strings.Repeat("a", 100))
	wantFault(t, nil, CheckBody(body, 99), fault.KindBodyTooLarge)
	if err := CheckBody(body, 100); err != nil {
		t.Errorf("limit 100: %v", err)
	}
	if err := CheckBody(body, DefaultMaxBody); err != nil {
		t.Errorf("default limit: %v", err)
	}
	big := bytes.Repeat([]byte("a"), DefaultMaxBody+1)
	wantFault(t, nil, CheckBody(big, DefaultMaxBody), fault.KindBodyTooLarge)
	if err := CheckBody(big, 2*DefaultMaxBody); err != nil {
		t.Errorf("raised limit: %v", err)
	}
}

func TestExpired(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	e := New(Ask, Party{Gid: "a"}, Party{Gid: "b"}, "?")
	if e.Expired(now) || e.Expired(now.AddDate(100, 0, 0)) {
		t.Error("an envelope without expiry expired")
	}
	e.Expires = now
	if e.Expired(now.Add(-time.Nanosecond)) {
		t.Error("expired before its expiry")
	}
	if !e.Expired(now) {
		t.Error("not expired at its expiry instant")
	}
	if !e.Expired(now.Add(time.Hour)) {
		t.Error("not expired after its expiry")
	}
	// The instant counts, not the zone it is written in.
	if !e.Expired(now.In(time.FixedZone("x", 5*3600))) {
		t.Error("expiry depends on the time zone of now")
	}
}

func TestParseVersion(t *testing.T) {
	for v, want := range map[string][2]int{"1.0": {1, 0}, "1.7": {1, 7}, "2.13": {2, 13}, "0.1": {0, 1}} {
		major, minor, err := ParseVersion(v)
		if err != nil || major != want[0] || minor != want[1] {
			t.Errorf("ParseVersion(%q) = %d, %d, %v; want %d, %d", v, major, minor, err, want[0], want[1])
		}
	}
	for _, v := range []string{"", "1", "1.", ".1", "a.b", "1.0.0", "-1.0", "1.-2"} {
		if _, _, err := ParseVersion(v); err == nil {
			t.Errorf("ParseVersion(%q) succeeded", v)
		}
	}
	if Version != "1.0" {
		t.Errorf("Version = %q, want 1.0 (Major %d, Minor %d)", Version, Major, Minor)
	}
}

func TestDigestAndPartyString(t *testing.T) {
	e := New(Send, Party{}, Party{}, "abc")
	n, sum := e.Digest()
	if n != 3 || sum != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("Digest = %d, %s", n, sum)
	}
	for p, want := range map[Party]string{
		{Gid: "g", Name: "bob", Host: "h"}: "bob@h",
		{Gid: "g", Name: "bob"}:            "bob",
		{Gid: "g"}:                         "g",
		{Gid: "g", Group: "ops"}:           "broadcast.ops",
	} {
		if got := p.String(); got != want {
			t.Errorf("%+v.String() = %q, want %q", p, got, want)
		}
	}
}

// Validate refuses a body that is not UTF-8, but Decode never gets there for
// raw invalid bytes: encoding/json replaces them with U+FFFD, so the body is
// silently changed and accepted.
func TestDecodeRefusesRawInvalidUTF8(t *testing.T) {
	m := validMap()
	m["body"] = "BODY"
	raw := bytes.Replace(mustJSON(t, m), []byte("BODY"), []byte("caf\xe9 \xff"), 1)
	e, err := Decode(raw, 0)
	if err == nil {
		t.Fatalf("invalid UTF-8 accepted; body became %q", e.Body)
	}
	wantFault(t, e, err, fault.KindBadUTF8)
}

// clear_gids (issue 36) rides on a broadcast only, at most MaxClearGids
// of them; on any other kind the envelope is refused.
func TestDecodeClearGids(t *testing.T) {
	m := validMap()
	m["kind"] = "BROADCAST"
	m["recipient"] = map[string]any{"group": "ops"}
	m["body"] = ""
	m["sealed"] = base64.StdEncoding.EncodeToString([]byte("fsl1\x01sealed bytes"))
	m["clear_gids"] = []string{"h3.0c0ffee0-0000-4000-8000-000000000003"}
	e, err := Decode(mustJSON(t, m), 10)
	if err != nil || len(e.ClearGids) != 1 {
		t.Fatalf("a sealed broadcast naming its clear copies: %v, %v", err, e)
	}
	many := make([]string, MaxClearGids+1)
	for i := range many {
		many[i] = "h3.0c0ffee0-0000-4000-8000-000000000003"
	}
	m["clear_gids"] = many
	if _, err := Decode(mustJSON(t, m), 1<<20); fault.KindOf(err) != fault.KindBadEnvelope {
		t.Fatalf("%d clear_gids: %v, want bad_envelope", len(many), err)
	}
	s := validMap()
	s["clear_gids"] = []string{"h3.0c0ffee0-0000-4000-8000-000000000003"}
	if _, err := Decode(mustJSON(t, s), 10); fault.KindOf(err) != fault.KindBadEnvelope {
		t.Fatalf("clear_gids on a SEND: %v, want bad_envelope", err)
	}
}
