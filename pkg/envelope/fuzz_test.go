package envelope

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
)

// fuzzMax is the body limit the fuzz target decodes with: small, so that
// the body_too_large path is reachable from short inputs.
const fuzzMax = 256

// FuzzDecode checks, for any input, that Decode never panics; that a
// success survives encode+decode unchanged; and that a failure is always a
// *fault.Error with code 65 and no envelope. The seed corpus lives in
// testdata/fuzz/FuzzDecode; run with
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 30s ./pkg/envelope
func FuzzDecode(f *testing.F) {
	valid := `{"v":"1.0","msg_id":"m1","kind":"SEND","sender":{"gid":"a","name":"alice","host":"h1"},` +
		`"recipient":{"gid":"b"},"trace_id":"t1","created":"2025-03-04T05:06:07.89+02:00","body":"hi"}`
	for _, s := range []string{
		valid,
		strings.Replace(valid, `"1.0"`, `"1.42"`, 1),
		strings.Replace(valid, `"1.0"`, `"2.0"`, 1),
		strings.Replace(valid, `"1.0"`, `"0.9"`, 1),
		strings.Replace(valid, `"SEND"`, `"SHOUT"`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"`+strings.Repeat("x", fuzzMax+1)+`"`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"\ud800\u00e9\\\"\n"`, 1),
		strings.Replace(valid, `"created"`, `"expires":"2025-03-04T05:06:08Z","created"`, 1),
		strings.Replace(valid, `{"gid":"b"}`, `{"group":"all"}`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"","sealed":"ZnNsMQFzZWFsZWQ="`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"hi","sealed":"ZnNsMQFzZWFsZWQ="`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"","sealed":"not base64!"`, 1),
		strings.Replace(valid, `"body":"hi"`, `"body":"","sealed":""`, 1),
		valid[:len(valid)/2],
		`{"v":"2.0","msg_id":42,"body":[]}`,
		`{"v":null}`,
		`{"V":"1.0","v":"2.0"}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Decode(data, fuzzMax)
		if err != nil {
			var fe *fault.Error
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *fault.Error", err, err)
			}
			if fe.Code != fault.Data {
				t.Fatalf("error %v has code %d, want 65", err, fe.Code)
			}
			if e != nil {
				t.Fatalf("an envelope came back with error %v", err)
			}
			return
		}
		if e == nil {
			t.Fatal("Decode returned neither an envelope nor an error")
		}
		raw, err := Encode(e)
		if err != nil {
			t.Fatalf("a decoded envelope does not encode: %v (%+v)", err, e)
		}
		e2, err := Decode(raw, fuzzMax)
		if err != nil {
			t.Fatalf("re-encoded envelope does not decode: %v\ninput:   %q\nencoded: %s", err, data, raw)
		}
		sameEnvelope(t, e2, e)
		raw2, err := Encode(e2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, raw2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", raw, raw2)
		}
	})
}
