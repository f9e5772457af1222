package store

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

func TestRecordEncodingRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{MsgID: "m1", Kind: "SEND", TraceID: "t1", Sender: "s", Recipient: "r", Seq: 1 << 40, State: Accepted,
			Accepted: time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)},
		{MsgID: "m2/g", Kind: "BROADCAST", State: Dead, Attempts: 5, Reason: "inbox full: ü", Seq: 0,
			Accepted: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Done: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
		{},
	} {
		var got Record
		if err := decodeRecord(encodeRecord(&r), &got); err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, r)
		}
	}
}

// Records written as JSON by earlier versions are still read.
func TestRecordDecodesEarlierJSON(t *testing.T) {
	r := Record{MsgID: "m", Kind: "REPLY", TraceID: "t", Sender: "a", Recipient: "b", Seq: 7, State: Delivered, Attempts: 1,
		Accepted: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), Done: time.Date(2026, 5, 1, 0, 0, 1, 0, time.UTC)}
	data, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	var got Record
	if err := decodeRecord(data, &got); err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("from JSON: %+v, %v; want %+v", got, err, r)
	}
}

func TestRecordRefusesGarbage(t *testing.T) {
	full := encodeRecord(&Record{MsgID: "m", State: Accepted, Accepted: time.Now()})
	for _, bad := range [][]byte{nil, {9}, full[:len(full)-1], full[:3], {recordV1, 200}} {
		var r Record
		if err := decodeRecord(bad, &r); err == nil {
			t.Errorf("decodeRecord(%v) accepted", bad)
		}
	}
}
