package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// awkward is a string encoding/json escapes in every way it can: quotes,
// backslash, control bytes, HTML characters, U+2028/2029 and invalid UTF-8.
const awkward = "a\"b\\c\n\t\x01<&>\u2028\u2029\xff é 🙂"

// sample returns a non-zero value for a field of kind k (every kind
// Request has; a field of another kind fails the test).
func sample(t *testing.T, f reflect.StructField, i int) reflect.Value {
	t.Helper()
	v := reflect.New(f.Type).Elem()
	switch {
	case f.Type.Kind() == reflect.String:
		v.SetString(awkward)
	case f.Type.Kind() == reflect.Bool:
		v.SetBool(true)
	case f.Type.Kind() == reflect.Int || f.Type.Kind() == reflect.Int64:
		v.SetInt(int64(-1000 * (i + 1)))
	case f.Type == reflect.TypeOf([]string(nil)):
		v.Set(reflect.ValueOf([]string{awkward, "", "x"}))
	case f.Type == reflect.TypeOf([]byte(nil)):
		v.Set(reflect.ValueOf([]byte(awkward)))
	default:
		t.Fatalf("Request.%s is a %s: teach appendJSON and this test about it", f.Name, f.Type)
	}
	return v
}

func marshalBoth(t *testing.T, r *Request) (ours, lib []byte) {
	t.Helper()
	ours, err := r.appendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	lib, err = json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return ours, lib
}

// TestRequestJSONMatchesMarshal: the hand-written encoding is the
// library's, byte for byte, for the zero request, for each field set alone
// (so a field added to Request and not to appendJSON fails here), for
// every field set at once, and for empty but non-nil slices.
func TestRequestJSONMatchesMarshal(t *testing.T) {
	typ := reflect.TypeOf(Request{})
	all := reflect.New(typ).Elem()
	cases := map[string]*Request{"zero": {}}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		one := reflect.New(typ).Elem()
		one.Field(i).Set(sample(t, f, i))
		all.Field(i).Set(sample(t, f, i))
		r := one.Addr().Interface().(*Request)
		cases[f.Name] = r
	}
	cases["all"] = all.Addr().Interface().(*Request)
	cases["empty slices"] = &Request{Op: OpAck, Groups: []string{}, Acks: []string{}, Raw: []byte{}, MsgIDs: []string{}}
	for name, r := range cases {
		ours, lib := marshalBoth(t, r)
		if !bytes.Equal(ours, lib) {
			t.Errorf("%s:\n ours %s\n json %s", name, ours, lib)
		}
	}
}

// TestWriteFrameRequest: a request's frame is its header and the
// library's encoding.
func TestWriteFrameRequest(t *testing.T) {
	r := &Request{Op: OpSend, To: "bob", Body: awkward, Token: "t", TimeoutMS: 30000}
	var buf bytes.Buffer
	if err := WriteFrame(&buf, r); err != nil {
		t.Fatal(err)
	}
	lib, _ := json.Marshal(r)
	if want := append(header(uint32(len(lib))), lib...); !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("frame %q, want %q", buf.Bytes(), want)
	}
}
