package gateway

import (
	"encoding/json"
	"math/rand"
	"reflect"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
)

// TestDecodeRequestAsAPI holds decodeRequest to api.DecodeRequest: on
// requests with random fields of every kind set (filled by reflection, so
// a field added to api.Request is covered too), written as json.Marshal
// and indented, and on frames encoding/json reads otherwise or refuses.
func TestDecodeRequestAsAPI(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	texts := []string{"", "send", "bob", "h1-0192", "<b>&\"q\"\\/", "two\nlines\t\x01", "\u2028é😀", "bad \xff"}
	same := func(data []byte) {
		t.Helper()
		want, werr := api.DecodeRequest(data)
		got, gerr := decodeRequest(data)
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("%s:\ndecodeRequest: %v\napi.DecodeRequest: %v", data, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", data, got, want)
		}
	}
	for range 5000 {
		var req api.Request
		v := reflect.ValueOf(&req).Elem()
		for i := range v.NumField() {
			if r.Intn(3) == 0 {
				continue
			}
			f := v.Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString(texts[r.Intn(len(texts))])
			case reflect.Bool:
				f.SetBool(r.Intn(2) == 0)
			case reflect.Int, reflect.Int64:
				f.SetInt(r.Int63n(1000))
			case reflect.Slice:
				switch f.Type().Elem().Kind() {
				case reflect.String:
					var l []string
					for range r.Intn(3) {
						l = append(l, texts[r.Intn(len(texts))])
					}
					f.Set(reflect.ValueOf(l))
				case reflect.Uint8:
					f.SetBytes([]byte(texts[r.Intn(len(texts))]))
				}
			default:
				t.Fatalf("api.Request.%s: a field of kind %s this test does not fill", v.Type().Field(i).Name, f.Kind())
			}
		}
		if r.Intn(4) != 0 { // mostly requests of strings only: the scanner's
			req.Proto, req.Wait, req.TimeoutMS, req.Max, req.Follow, req.Window, req.Raw, req.Sig, req.Args = 0, false, 0, 0, false, 0, nil, nil, nil
		}
		data, err := json.Marshal(&req)
		if err != nil {
			t.Fatal(err)
		}
		same(data)
		indented, _ := json.MarshalIndent(&req, "", " ")
		same(indented)
	}
	for _, data := range []string{
		`{"op":"send","to":"bob","body":"hi"}`,
		`{"to":"bob","op":"send","OP":"ack"}`,
		`{"op":"ack","acks":[]}`,
		`{"op":"ack","acks":null}`,
		`{"op":"ack","acks":["a","b"],"acks":["c"]}`,
		`{"op":"ack","acks":["a",]}`,
		`{"op":""}`, `{"to":"bob"}`, `{}`, `[]`, ``, `null`,
		`{"op":"send","body":"\ud83d\ude00"}`,
		`{"op":"send"}trailing`,
		`{"op":"send","unknown":{"x":[1,2]}}`,
		`{"op":"send","to":7}`,
	} {
		same([]byte(data))
	}
}
