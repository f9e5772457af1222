package store

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

func TestRecordEncodingRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{MsgID: "m1", Kind: "SEND", TraceID: "t1", Sender: "s", Recipient: "r", Seq: 1 << 40, State: Accepted,
			Accepted: time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)},
		{MsgID: "m2/g", Kind: "BROADCAST", State: Dead, Attempts: 5, Reason: "inbox full: ü", Seq: 0,
			Accepted: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Done: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
		{MsgID: "m3", Kind: "SEND", Sender: "h1.a", Recipient: "h2.b", State: Dead, Named: "bob@h2",
			Accepted: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
		{MsgID: "m4", Kind: "REPLY", State: Accepted, Hops: 7},
		{MsgID: "m5", Kind: "SEND", State: Delivered, Named: "bob@h2", Hops: 1 << 20},
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

// A record with the recipient's name reads with it; one written before
// Named (no trailing string) reads with none.
func TestRecordNamedIsOptional(t *testing.T) {
	r := Record{MsgID: "m", Recipient: "h2.b", State: Accepted, Accepted: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	old := encodeRecord(&r)
	r.Named = "bob@h2"
	named := encodeRecord(&r)
	if len(named) <= len(old) || string(named[:len(old)]) != string(old) {
		t.Fatalf("Named is not an optional tail: %v vs %v", named, old)
	}
	got := Record{Named: "stale@h9"}
	if err := decodeRecord(old, &got); err != nil || got.Named != "" {
		t.Errorf("an earlier record: Named %q, %v; want none", got.Named, err)
	}
	if err := decodeRecord(named[:len(named)-1], &got); err == nil {
		t.Errorf("a cut name accepted")
	}
}

// The hop count (issue 37.2) is an optional tail after Named: a record
// with none reads as before (hops 0), and one with hops but no name
// writes the name empty.
func TestRecordHopsIsOptional(t *testing.T) {
	r := Record{MsgID: "m", Recipient: "h1.b", State: Accepted, Accepted: time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)}
	old := encodeRecord(&r)
	r.Hops = 3
	hops := encodeRecord(&r)
	if len(hops) != len(old)+2 || string(hops[:len(old)]) != string(old) {
		t.Fatalf("Hops is not an optional tail: %v vs %v", hops, old)
	}
	got := Record{Hops: 9}
	if err := decodeRecord(old, &got); err != nil || got.Hops != 0 {
		t.Errorf("an earlier record: Hops %d, %v; want 0", got.Hops, err)
	}
	if err := decodeRecord(hops, &got); err != nil || got.Hops != 3 || got.Named != "" {
		t.Errorf("Hops %d, Named %q, %v; want 3 and none", got.Hops, got.Named, err)
	}
}

// A message's hop count stays on its record from accept through delivery
// (a reply to it is one more: gateway/hops.go).
func TestRecordKeepsHops(t *testing.T) {
	s, _ := newStore(t)
	if err := s.CreateEntity(&Entity{Gid: "h1.b", Name: "bob", Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	env := envelope.New(envelope.Reply, envelope.Party{Gid: "h1.a", Name: "alice", Host: "h1"},
		envelope.Party{Gid: "h1.b", Name: "bob", Host: "h1"}, "hi")
	env.Hops = 5
	if _, _, err := s.Accept(env, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Record(env.MsgID); err != nil || r.Hops != 5 {
		t.Fatalf("accepted: %+v, %v; want hops 5", r, err)
	}
	if _, err := s.BeginInject(env.MsgID); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Record(env.MsgID); err != nil || r.Hops != 5 || r.Attempts != 1 {
		t.Fatalf("injecting: %+v, %v; want hops 5", r, err)
	}
}

// The recipient's name, as sent, stays on an outbound record until it
// settles, and after.
func TestOutboundRecordKeepsName(t *testing.T) {
	s, _ := newStore(t)
	env := envelope.New(envelope.Send, envelope.Party{Gid: "h1.a", Name: "alice", Host: "h1"},
		envelope.Party{Gid: "h2.b", Name: "bob", Host: "h2"}, "hi")
	if err := s.RecordOutbound(env, time.Now()); err != nil {
		t.Fatal(err)
	}
	recs, errs := s.SettleOutboundAll([]Settle{{MsgID: env.MsgID, State: Dead, Reason: "left", At: time.Now()}})
	if errs[0] != nil || recs[0].Named != "bob@h2" {
		t.Fatalf("settled: %+v, %v; want Named bob@h2", recs[0], errs[0])
	}
	r, err := s.Record(env.MsgID)
	if err != nil || r.Named != "bob@h2" || r.State != Dead {
		t.Errorf("read back: %+v, %v", r, err)
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
