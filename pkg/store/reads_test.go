package store

import (
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleet/pkg/envelope"
)

// reply is a REPLY from `from` to `to` answering msgID.
func reply(from, to, msgID, body string) *envelope.Envelope {
	e := msg(from, to, body)
	e.Kind = envelope.Reply
	e.InReplyTo = msgID
	return e
}

func replyTo(t *testing.T, s *Store, gid, msgID string) string {
	t.Helper()
	env, err := s.ReplyTo(gid, msgID)
	if err != nil {
		t.Fatalf("ReplyTo(%s, %s): %v", gid, msgID, err)
	}
	if env == nil {
		return ""
	}
	return env.MsgID
}

// TestReplyToFindsTheFirstWaitingReply: ReplyTo finds the oldest REPLY to a
// msg id in an inbox among other messages (a SEND naming the same msg id
// is not one), forgets a reply once it is delivered or dead, and finds
// nothing in another inbox, for another msg id, or after the entity left.
func TestReplyToFindsTheFirstWaitingReply(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "a"), mkEntity(t, s, "b")
	const asked = "0192d3a4-0000-7000-8000-000000000001"
	accept(t, s, msg(b.Gid, a.Gid, "noise"))
	notReply := msg(b.Gid, a.Gid, "a send naming it")
	notReply.InReplyTo = asked
	accept(t, s, notReply)
	other := accept(t, s, reply(b.Gid, a.Gid, asked+"x", "to another message"))
	first := accept(t, s, reply(b.Gid, a.Gid, asked, "first"))
	second := accept(t, s, reply(b.Gid, a.Gid, asked, "second"))
	accept(t, s, reply(a.Gid, b.Gid, asked, "in b's inbox"))

	if got := replyTo(t, s, a.Gid, asked); got != first.MsgID {
		t.Fatalf("ReplyTo = %q, want the first reply %s", got, first.MsgID)
	}
	if got := replyTo(t, s, a.Gid, asked+"x"); got != other.MsgID {
		t.Fatalf("ReplyTo(other) = %q, want %s", got, other.MsgID)
	}
	if got := replyTo(t, s, a.Gid, "0192d3a4-0000-7000-8000-00000000000"); got != "" {
		t.Fatalf("ReplyTo(a prefix of the msg id) = %q, want none", got)
	}
	if err := s.Delivered(first.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if got := replyTo(t, s, a.Gid, asked); got != second.MsgID {
		t.Fatalf("after the first was delivered: %q, want %s", got, second.MsgID)
	}
	if err := s.Kill(second.MsgID, "test", 1); err != nil {
		t.Fatal(err)
	}
	if got := replyTo(t, s, a.Gid, asked); got != "" {
		t.Fatalf("after both left the inbox: %q, want none", got)
	}
	if _, err := s.DeleteEntity(b.Gid, "left"); err != nil {
		t.Fatal(err)
	}
	if got := replyTo(t, s, b.Gid, asked); got != "" {
		t.Fatalf("after b left: %q, want none", got)
	}
	mkEntity(t, s, "b") // same gid again: a fresh inbox, no index left behind
	if got := replyTo(t, s, b.Gid, asked); got != "" {
		t.Fatalf("b again: %q, want none", got)
	}
}

// TestReplyIndexSurvivesReopenAndIsBuiltForOldStores: the index is
// replayed from the log after a crash-like reopen, and a store written
// before it was kept (no index, no meta mark) gets one at open.
func TestReplyIndexSurvivesReopenAndIsBuiltForOldStores(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "a"), mkEntity(t, s, "b")
	const asked = "0192d3a4-0000-7000-8000-000000000002"
	accept(t, s, msg(b.Gid, a.Gid, "noise"))
	r := accept(t, s, reply(b.Gid, a.Gid, asked, "the reply"))
	s = reopen(t, s, path)
	if got := replyTo(t, s, a.Gid, asked); got != r.MsgID {
		t.Fatalf("after reopen: %q, want %s", got, r.MsgID)
	}
	closeStore(t, s)

	// as an older build left it: no reply index, no mark
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bReplies); err != nil {
			return err
		}
		return tx.Bucket(bMeta).Delete(metaReplies)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s = openTracked(t, path)
	if got := replyTo(t, s, a.Gid, asked); got != r.MsgID {
		t.Fatalf("old store: %q, want %s", got, r.MsgID)
	}
	if err := s.Delivered(r.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	if got := replyTo(t, s, a.Gid, asked); got != "" {
		t.Fatalf("old store, after delivery: %q, want none", got)
	}
	_ = b
}

// TestPendingAllIsPendingOfEach: one operation gives every inbox's count,
// as Pending gives each, and follows puts and deletes.
func TestPendingAllIsPendingOfEach(t *testing.T) {
	s, _ := newStore(t)
	var ents []*Entity
	for i := range 5 {
		ents = append(ents, mkEntity(t, s, fmt.Sprintf("e%d", i)))
	}
	var last *Record
	for i, e := range ents {
		for range i * 3 {
			last = accept(t, s, msg(ents[0].Gid, e.Gid, "x"))
		}
	}
	check := func() {
		t.Helper()
		all := s.PendingAll()
		for _, e := range ents {
			if all[e.Gid] != s.Pending(e.Gid) {
				t.Fatalf("PendingAll[%s] = %d, Pending %d", e.Name, all[e.Gid], s.Pending(e.Gid))
			}
		}
		if _, ok := all[ents[0].Gid]; ok {
			t.Fatalf("an empty inbox is listed: %v", all)
		}
	}
	check()
	if all := s.PendingAll(); all[ents[4].Gid] != 12 {
		t.Fatalf("PendingAll = %v, want 12 for e4", all)
	}
	if err := s.Delivered(last.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	check()
	if all := s.PendingAll(); all[ents[4].Gid] != 11 {
		t.Fatalf("after a delivery: %v, want 11 for e4", all)
	}
}

// TestKillHeadPages: an inbox is emptied a page at a time, oldest first,
// every message dead-lettered with the reason, a reply's index entry too.
func TestKillHeadPages(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "a"), mkEntity(t, s, "b")
	var want []string
	for i := range 7 {
		e := msg(a.Gid, b.Gid, fmt.Sprint(i))
		if i == 3 {
			e = reply(a.Gid, b.Gid, "0192d3a4-0000-7000-8000-000000000003", "3")
		}
		want = append(want, accept(t, s, e).MsgID)
	}
	if _, err := s.BeginInject(want[0]); err != nil { // being injected: killed all the same
		t.Fatal(err)
	}
	var got []string
	for {
		page, err := s.KillHead(b.Gid, "recipient left", 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 3 {
			t.Fatalf("a page of %d", len(page))
		}
		for _, e := range page {
			got = append(got, e.MsgID)
		}
		if len(page) < 3 {
			break
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("killed %v, want %v", got, want)
	}
	for _, id := range want {
		if r := record(t, s, id); r.State != Dead || r.Reason != "recipient left" {
			t.Fatalf("%s: %s %q", id, r.State, r.Reason)
		}
	}
	if n := s.Pending(b.Gid); n != 0 {
		t.Fatalf("%d left in the inbox", n)
	}
	if got := replyTo(t, s, b.Gid, "0192d3a4-0000-7000-8000-000000000003"); got != "" {
		t.Fatalf("the killed reply is still indexed: %s", got)
	}
	if page, err := s.KillHead(b.Gid, "again", 3); err != nil || len(page) != 0 {
		t.Fatalf("an empty inbox: %d, %v", len(page), err)
	}
}

// BenchmarkReplyTo is --wait-reply's lookup of a stored reply in an inbox
// of 100 and of 100,000 other messages, the reply last: with the index it
// does not grow with the inbox (before it, storedReply read the inbox from
// its head, up to 100,000 items). The scan it replaced runs beside it.
//
//	go test -run '^$' -bench ReplyTo ./pkg/store
func BenchmarkReplyTo(b *testing.B) {
	for _, n := range []int{100, 100000} {
		s, err := Open(filepath.Join(b.TempDir(), "fleet.db"))
		if err != nil {
			b.Fatal(err)
		}
		for _, g := range []string{"a", "b"} {
			if err := s.CreateEntity(&Entity{Gid: "gid-" + g, Name: g, Host: "h1", Mode: "pull", Created: t0}); err != nil {
				b.Fatal(err)
			}
		}
		const asked = "0192d3a4-0000-7000-8000-000000000004"
		for i := 0; i < n; i += 1000 {
			var envs []*envelope.Envelope
			for j := i; j < min(n, i+1000); j++ {
				envs = append(envs, msg("gid-b", "gid-a", "a body of a few words"))
			}
			if _, _, err := s.AcceptBatch(envs, t0); err != nil {
				b.Fatal(err)
			}
		}
		want := reply("gid-b", "gid-a", asked, "the reply")
		if _, _, err := s.Accept(want, t0); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("index/inbox=%d", n), func(b *testing.B) {
			for b.Loop() {
				if env, err := s.ReplyTo("gid-a", asked); err != nil || env == nil || env.MsgID != want.MsgID {
					b.Fatalf("%v, %v", env, err)
				}
			}
		})
		b.Run(fmt.Sprintf("scan/inbox=%d", n), func(b *testing.B) {
			for b.Loop() {
				items, err := s.Head("gid-a", 0, 100000+1)
				if err != nil {
					b.Fatal(err)
				}
				found := false
				for _, it := range items {
					if it.Env.Kind == envelope.Reply && it.Env.InReplyTo == asked {
						found = true
						break
					}
				}
				if !found {
					b.Fatal("no reply")
				}
			}
		})
		s.Close()
	}
}
