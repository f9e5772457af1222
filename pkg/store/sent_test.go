package store

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// The bytes kept with a large outbound message last until it settles,
// survive a restart, and become its dead letter on a refusal.
func TestSentBytes(t *testing.T) {
	s, path := newStore(t)
	from := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Host: "h1"}
	to := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Host: "h2"}
	a := envelope.New(envelope.Send, from, to, "a")
	b := envelope.New(envelope.Send, from, to, "b")
	c := envelope.New(envelope.Send, from, to, "c")
	for _, env := range []*envelope.Envelope{a, b, c} {
		if err := s.RecordOutboundKeep(env, t0, []byte(`{"raw":"`+env.Body+`"}`))(); err != nil {
			t.Fatal(err)
		}
	}
	plain := envelope.New(envelope.Send, from, to, "small")
	if err := s.RecordOutbound(plain, t0); err != nil {
		t.Fatal(err)
	}
	if s.Sent(plain.MsgID) != nil {
		t.Fatal("bytes kept for a message recorded without them")
	}
	s = reopen(t, s, path)
	if got := string(s.Sent(a.MsgID)); got != `{"raw":"a"}` {
		t.Fatalf("kept %q after a restart", got)
	}
	if _, err := s.SettleOutbound(a.MsgID, Delivered, "", 1, t0); err != nil {
		t.Fatal(err)
	}
	if s.Sent(a.MsgID) != nil {
		t.Fatal("bytes kept after delivery")
	}
	if dead, err := s.KillOutbound(b.MsgID, s.Sent(b.MsgID), "refused", t0); err != nil || !dead {
		t.Fatalf("KillOutbound: %v %v", dead, err)
	}
	if s.Sent(b.MsgID) != nil {
		t.Fatal("bytes kept beside the dead letter")
	}
	if dl, err := s.DeadLetter(b.MsgID); err != nil || string(dl.Envelope) != `{"raw":"b"}` {
		t.Fatalf("dead letter %v %v", dl, err)
	}
	e := envelope.New(envelope.Send, from, to, "e") // its confirm lost: unknown, and refused all the same
	if err := s.RecordOutboundKeep(e, t0, []byte(`{"raw":"e"}`))(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MarkOutbound(e.MsgID, Unknown); err != nil {
		t.Fatal(err)
	}
	if dead, err := s.KillOutbound(e.MsgID, s.Sent(e.MsgID), "refused", t0); err != nil || !dead {
		t.Fatalf("KillOutbound of an unknown outcome: %v %v", dead, err)
	}
	if err := s.ForgetRecord(c.MsgID); err != nil {
		t.Fatal(err)
	}
	if s.Sent(c.MsgID) != nil {
		t.Fatal("bytes kept for a forgotten record")
	}
	d := envelope.New(envelope.Send, from, to, "d")
	if err := s.RecordOutboundKeep(d, t0, []byte(`{"raw":"d"}`))(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if s.Sent(d.MsgID) != nil {
		t.Fatal("bytes kept after their record was pruned")
	}
}
