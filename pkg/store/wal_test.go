package store

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/envelope"
)

// crash stops s the way kill -9 would: the committer stops, the open
// transaction (everything since the last checkpoint) is thrown away, and
// only what reached the files stays.
func crash(t *testing.T, s *Store) {
	t.Helper()
	if p, ok := trackers.Load(s); ok {
		*p.(*bool) = true
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	close(s.done)
	s.wg.Wait()
	close(s.flushes)
	s.syncWG.Wait()
	if s.tx != nil {
		s.tx.Rollback()
	}
	s.log.close()
	s.db.Close()
}

// state is what a test compares before a crash and after the replay.
func state(t *testing.T, s *Store, gids ...string) string {
	t.Helper()
	var b strings.Builder
	for _, gid := range gids {
		items, err := s.Head(gid, 0, 1<<30)
		if err != nil {
			t.Fatalf("Head(%s): %v", gid, err)
		}
		for _, it := range items {
			r := record(t, s, Key(it.Env))
			b.WriteString(gid + " " + it.Env.Body + " " + r.State + "\n")
		}
	}
	for _, d := range mustDead(t, s) {
		b.WriteString("dead " + d.Record.MsgID + " " + d.Record.Reason + "\n")
	}
	ents, err := s.Entities()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b.WriteString("entity " + e.Name + " " + e.Status + "\n")
	}
	return b.String()
}

func mustDead(t *testing.T, s *Store) []*DeadLetter {
	t.Helper()
	dl, err := s.DeadLetters("")
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

func TestReplayAfterCrashRestoresEveryAcknowledgedChange(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	var ids []string
	for i := range 50 {
		e := msg(a.Gid, b.Gid, strings.Repeat("x", i))
		accept(t, s, e)
		ids = append(ids, e.MsgID)
	}
	if err := s.DeliveredAll(ids[:10], t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(ids[10], "poison", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginInject(ids[11]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateEntity(b.Gid, func(e *Entity) error { e.Status = "busy"; return nil }); err != nil {
		t.Fatal(err)
	}
	mkEntity(t, s, "carol")
	if _, err := s.DeleteEntity("gid-carol", "left"); err != nil {
		t.Fatal(err)
	}
	want := state(t, s, a.Gid, b.Gid)
	if s.lsn == s.ckptLSN {
		t.Fatal("everything was checkpointed: the test proves nothing about the log")
	}

	crash(t, s)
	s = openTracked(t, path)
	if got := state(t, s, a.Gid, b.Gid); got != want {
		t.Errorf("after replay:\n%s\nwant:\n%s", got, want)
	}
	if got := inflight(t, s); !slices.Equal(got, []string{ids[11]}) {
		t.Errorf("inflight after replay = %v, want [%s]", got, ids[11])
	}
	// sequences go on from where they were, and dedup still holds
	last := msg(a.Gid, b.Gid, "after")
	if rec := accept(t, s, last); rec.Seq != 51 {
		t.Errorf("seq after replay = %d, want 51", rec.Seq)
	}
	if _, dup, err := s.Accept(msg(a.Gid, b.Gid, "dup"), t0); err != nil || dup {
		t.Fatalf("fresh accept: dup=%v err=%v", dup, err)
	}
	e := msg(a.Gid, b.Gid, "again")
	e.MsgID = ids[0]
	if _, dup, err := s.Accept(e, t0); err != nil || !dup {
		t.Errorf("delivered msg id accepted again after replay: dup=%v err=%v", dup, err)
	}
}

func TestReplayStopsAtTornRecord(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	accept(t, s, msg(a.Gid, b.Gid, "one"))
	accept(t, s, msg(a.Gid, b.Gid, "two"))
	want := state(t, s, a.Gid, b.Gid)
	end := s.log.off
	accept(t, s, msg(a.Gid, b.Gid, "three"))
	torn := s.log.off
	crash(t, s)

	// the last record, half written
	f, err := os.OpenFile(path+"-wal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, torn-end)
	if _, err := f.ReadAt(buf, end); err != nil {
		t.Fatal(err)
	}
	half := make([]byte, len(buf)/2)
	if _, err := f.WriteAt(half, end+int64(len(buf)/2)); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s = openTracked(t, path)
	if got := state(t, s, a.Gid, b.Gid); got != want {
		t.Errorf("after a torn record:\n%s\nwant:\n%s", got, want)
	}
	// the log goes on after what was kept
	accept(t, s, msg(a.Gid, b.Gid, "four"))
	crash(t, s)
	s = openTracked(t, path)
	if got := inbox(t, s, b.Gid); len(got) != 3 {
		t.Errorf("inbox after second replay has %d, want 3", len(got))
	}
}

// A record from an earlier epoch, or bytes crafted to look like a record
// with the next sequence number, is never applied: the checksum is seeded
// with the epoch's salt.
func TestReplayRefusesRecordsOfAnotherEpoch(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	gone := msg(a.Gid, b.Gid, "delivered before the checkpoint")
	accept(t, s, gone)
	if err := s.Delivered(gone.MsgID, t0); err != nil {
		t.Fatal(err)
	}
	// a forged record: the put that would bring "gone" back, with the
	// right sequence number, under another salt
	forged := &wal{salt: s.log.salt + 1}
	s = reopen(t, s, path) // checkpoint: new epoch, log starts over
	keep := msg(a.Gid, b.Gid, "after the checkpoint")
	accept(t, s, keep)
	raw, _ := envelope.Encode(gone)
	f, err := os.OpenFile(path+"-wal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	forged.f = f
	forged.off = s.log.off
	if err := forged.append(s.lsn+1, []mut{{kind: mutPut, path: [][]byte{bInbox, []byte(b.Gid)}, key: u64(99), value: raw}}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	crash(t, s)

	s = openTracked(t, path)
	got := inbox(t, s, b.Gid)
	if !slices.Equal(got, []string{keep.MsgID}) {
		t.Errorf("inbox after replay = %v, want only %s", got, keep.MsgID)
	}
}

// When the log cannot be written, the group's changes are undone and its
// writers hear the error: nothing is reported stored that is not.
func TestLogWriteFailureUndoesTheGroup(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	kept := msg(a.Gid, b.Gid, "kept")
	accept(t, s, kept)

	good := s.log.f
	s.log.f = closedFile(t)
	lost := msg(a.Gid, b.Gid, "lost")
	if _, _, err := s.Accept(lost, t0); err == nil {
		t.Fatal("Accept with an unwritable log succeeded")
	}
	if err := s.Delivered(kept.MsgID, t0); err == nil {
		t.Fatal("Delivered with an unwritable log succeeded")
	}
	s.log.f = good

	if _, err := s.Record(lost.MsgID); !errors.Is(err, ErrNotFound) {
		t.Errorf("record of the refused message: %v, want ErrNotFound", err)
	}
	if r := record(t, s, kept.MsgID); r.State != Accepted {
		t.Errorf("refused delivery left state %q", r.State)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{kept.MsgID}) {
		t.Errorf("inbox = %v, want [%s]", got, kept.MsgID)
	}
	// and the store works on once the log does
	accept(t, s, msg(a.Gid, b.Gid, "later"))
}

func closedFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "closed")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return f
}

// The log is checkpointed into bbolt and started over once it is big:
// it does not grow without bound under steady load.
func TestCheckpointStartsTheLogOver(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	body := strings.Repeat("y", 64<<10)
	var last *envelope.Envelope
	for range checkpointBytes/(64<<10) + 20 {
		last = msg(a.Gid, b.Gid, body)
		accept(t, s, last)
	}
	if s.ckptLSN == 0 || s.log.off >= checkpointBytes {
		t.Errorf("no checkpoint: log at %d bytes, checkpoint lsn %d", s.log.off, s.ckptLSN)
	}
	n := len(inbox(t, s, b.Gid))
	crash(t, s)
	s = openTracked(t, path)
	if got := inbox(t, s, b.Gid); len(got) != n || got[len(got)-1] != last.MsgID {
		t.Errorf("after checkpoint and replay: %d messages, want %d ending with the last", len(got), n)
	}
}

func TestMutationsRoundTrip(t *testing.T) {
	in := []mut{
		{kind: mutCreateBucket, path: [][]byte{[]byte("inbox"), []byte("g1")}},
		{kind: mutPut, path: [][]byte{[]byte("inbox"), []byte("g1")}, key: []byte{0, 1}, value: []byte("v")},
		{kind: mutPut, path: [][]byte{[]byte("records")}, key: []byte("k"), value: []byte{}},
		{kind: mutDelete, path: [][]byte{[]byte("records")}, key: []byte("k")},
		{kind: mutSetSeq, path: [][]byte{[]byte("inbox"), []byte("g1")}, seq: 1 << 40},
		{kind: mutDeleteBucket, path: [][]byte{[]byte("inbox"), []byte("g1")}},
	}
	out, err := decodeMuts(appendMuts(nil, in))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("%d mutations back, want %d", len(out), len(in))
	}
	for i := range in {
		a, b := in[i], out[i]
		if a.kind != b.kind || a.seq != b.seq || string(a.key) != string(b.key) || string(a.value) != string(b.value) || len(a.path) != len(b.path) {
			t.Errorf("mutation %d: %+v, want %+v", i, b, a)
		}
	}
	for _, bad := range [][]byte{{9}, {mutPut, 1, 5, 'a'}, {mutSetSeq, 0}} {
		if _, err := decodeMuts(bad); err == nil {
			t.Errorf("decodeMuts(%v) accepted", bad)
		}
	}
}
