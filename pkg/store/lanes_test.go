package store

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// lanesFixture: bob's inbox holds, in the order they came, n1 u1 n2 u2 n3
// (n: normal, u: urgent).
func lanesFixture(t *testing.T) (*Store, *Entity, map[string]*envelope.Envelope) {
	t.Helper()
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	m := map[string]*envelope.Envelope{}
	for _, name := range []string{"n1", "u1", "n2", "u2", "n3"} {
		e := msg(a.Gid, b.Gid, name)
		e.Urgent = name[0] == 'u'
		accept(t, s, e)
		m[name] = e
	}
	return s, b, m
}

func bodies(items []Item) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Env.Body)
	}
	return out
}

// TestLanesOrder: urgent mail first, FIFO in each lane, whatever the
// order it came in; every count and lookup sees both lanes.
func TestLanesOrder(t *testing.T) {
	s, b, m := lanesFixture(t)
	items, err := s.Head(b.Gid, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := bodies(items), []string{"u1", "u2", "n1", "n2", "n3"}; !slices.Equal(got, want) {
		t.Fatalf("inbox order %v, want %v", got, want)
	}
	for _, it := range items {
		if Urgent(it.Seq) != it.Env.Urgent {
			t.Errorf("%s: seq %x in the wrong lane", it.Env.Body, it.Seq)
		}
		if r := record(t, s, it.Env.MsgID); r.Seq != it.Seq {
			t.Errorf("%s: record seq %x, item %x", it.Env.Body, r.Seq, it.Seq)
		}
		if env, err := s.At(b.Gid, it.Seq); err != nil || env == nil || env.MsgID != it.Env.MsgID {
			t.Errorf("At(%x) = %v, %v; want %s", it.Seq, env, err, it.Env.Body)
		}
	}
	if n := s.Pending(b.Gid); n != 5 {
		t.Errorf("Pending = %d, want 5", n)
	}
	// the newest is the last to come (n3, sequence 5), whichever lane
	if n := s.Newest(b.Gid); n != 5 {
		t.Errorf("Newest = %d, want 5", n)
	}
	e := msg(b.Gid, b.Gid, "u3")
	e.Urgent = true
	accept(t, s, e)
	if n := s.Newest(b.Gid); n != 6 {
		t.Errorf("Newest after an urgent one = %d, want 6", n)
	}

	// one position: past u2, the rest of the urgent lane and all normal
	// mail; past n1, only normal mail after it
	if got, _ := s.Head(b.Gid, items[1].Seq, 10); !slices.Equal(bodies(got), []string{"u3", "n1", "n2", "n3"}) {
		t.Errorf("Head after u2 = %v", bodies(got))
	}
	if got, _ := s.Head(b.Gid, items[2].Seq, 10); !slices.Equal(bodies(got), []string{"n2", "n3"}) {
		t.Errorf("Head after n1 = %v", bodies(got))
	}

	// delivered and dead leave from either lane
	if err := s.Delivered(m["u1"].MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(m["n2"].MsgID, "test", 1); err != nil {
		t.Fatal(err)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{m["u2"].MsgID, e.MsgID, m["n1"].MsgID, m["n3"].MsgID}) {
		t.Errorf("after a delivery and a death: %v", got)
	}
	if env, _ := s.At(b.Gid, items[0].Seq); env != nil {
		t.Errorf("At(delivered u1) = %s, want nothing", env.Body)
	}
}

// TestLanesPaging: a reader that pages with a position per lane sees an
// urgent message that came after it started first in its next page, and
// never a message twice.
func TestLanesPaging(t *testing.T) {
	s, b, _ := lanesFixture(t)
	page, err := s.HeadAfter(b.Gid, After{}, 3) // u1 u2 n1
	if err != nil {
		t.Fatal(err)
	}
	if got := bodies(page); !slices.Equal(got, []string{"u1", "u2", "n1"}) {
		t.Fatalf("first page %v", got)
	}
	var at After
	for _, it := range page {
		at = at.Advance(it.Seq)
	}
	late := msg(b.Gid, b.Gid, "u-late")
	late.Urgent = true
	accept(t, s, late)
	page, err = s.HeadSoon(b.Gid, at, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := bodies(page); !slices.Equal(got, []string{"u-late", "n2", "n3"}) {
		t.Fatalf("next page %v, want the late urgent one first, then n2 n3", got)
	}
}

// TestLanesKillHead: an entity's inbox emptied a page at a time takes the
// urgent lane first; an expiry stops in each lane at its first message
// that stays, so a fresh urgent message does not keep old normal mail
// alive.
func TestLanesKillHead(t *testing.T) {
	s, b, _ := lanesFixture(t)
	page, err := s.KillHead(b.Gid, "left", 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page {
		got = append(got, e.Body)
	}
	if !slices.Equal(got, []string{"u1", "u2", "n1"}) {
		t.Errorf("KillHead page %v", got)
	}

	s2, _ := newStore(t)
	a, c := mkEntity(t, s2, "alice"), mkEntity(t, s2, "carol")
	old := msg(a.Gid, c.Gid, "old normal")
	if _, _, err := s2.Accept(old, t0); err != nil {
		t.Fatal(err)
	}
	fresh := msg(a.Gid, c.Gid, "fresh urgent")
	fresh.Urgent = true
	if _, _, err := s2.Accept(fresh, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	dead, err := s2.ExpireHead(c.Gid, t0.Add(time.Minute), "expired", 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].MsgID != old.MsgID {
		t.Errorf("ExpireHead = %v, want only the old normal one", dead)
	}
	if got := inbox(t, s2, c.Gid); !slices.Equal(got, []string{fresh.MsgID}) {
		t.Errorf("left %v, want the fresh urgent one", got)
	}
}

// TestLanesReplyIndex: an urgent reply is found by the message it answers
// and leaves the index with its delivery.
func TestLanesReplyIndex(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	orig := msg(a.Gid, b.Gid, "question")
	accept(t, s, orig)
	r := msg(b.Gid, a.Gid, "urgent answer")
	r.Kind, r.InReplyTo, r.Urgent = envelope.Reply, orig.MsgID, true
	accept(t, s, r)
	got, err := s.ReplyTo(a.Gid, orig.MsgID)
	if err != nil || got == nil || got.MsgID != r.MsgID {
		t.Fatalf("ReplyTo = %v, %v", got, err)
	}
	if err := s.Delivered(r.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReplyTo(a.Gid, orig.MsgID); err != nil || got != nil {
		t.Errorf("ReplyTo after its delivery = %v, %v", got, err)
	}
}
