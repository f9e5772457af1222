package store

import (
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// logState reads the committer's log positions from inside the committer
// (race-free), and the syncer's log end.
func logState(t *testing.T, s *Store) (lsn, ckpt uint64, end int64) {
	t.Helper()
	if err := s.view(func(*wtx) error { lsn, ckpt = s.lsn, s.ckptLSN; return nil }); err != nil {
		t.Fatal(err)
	}
	return lsn, ckpt, s.log.size()
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
	if lsn, ckpt, _ := logState(t, s); lsn == ckpt {
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
	_, _, end := logState(t, s)
	accept(t, s, msg(a.Gid, b.Gid, "three"))
	_, _, torn := logState(t, s)
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
	// and the store goes on from what was kept (in the next epoch)
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
	s = reopen(t, s, path) // checkpoint: new epoch, log starts over
	keep := msg(a.Gid, b.Gid, "after the checkpoint")
	accept(t, s, keep)
	raw, _ := envelope.Encode(gone)
	f, err := os.OpenFile(path+"-wal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	lsn, _, end := logState(t, s)
	forged := &wal{f: f, off: end, salt: newSalt()} // not this epoch's salt
	if err := forged.append(lsn+1, []mut{{kind: mutPut, path: [][]byte{bInbox, []byte(b.Gid)}, key: u64(99), value: raw}}); err != nil {
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
	if _, ckpt, end := logState(t, s); ckpt == 0 || end >= checkpointBytes {
		t.Errorf("no checkpoint: log at %d bytes, checkpoint lsn %d", end, ckpt)
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

// A write whose flush failed after its record reached the file is refused,
// and stays refused after a crash: the record is cleared before the
// writer hears the error, and the store takes no write until a checkpoint.
func TestRefusedWriteIsNotReplayed(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	kept := msg(a.Gid, b.Gid, "kept")
	accept(t, s, kept)

	var fail atomic.Bool
	fail.Store(true)
	s.log.failWrite = func(l *wal, rec []byte) error {
		if _, err := l.f.WriteAt(rec, l.off); err != nil { // the record reaches the file ...
			return err
		}
		if fail.Load() {
			return errors.New("fdatasync: input/output error") // ... its flush fails
		}
		return fdatasync(l.f)
	}
	lost := msg(a.Gid, b.Gid, "lost")
	if _, _, err := s.Accept(lost, t0); err == nil {
		t.Fatal("Accept with a failing flush succeeded")
	}
	fail.Store(false)
	crash(t, s)

	s = openTracked(t, path)
	if _, err := s.Record(lost.MsgID); !errors.Is(err, ErrNotFound) {
		t.Errorf("the refused message came back after a crash: %v", err)
	}
	if got := inbox(t, s, b.Gid); !slices.Equal(got, []string{kept.MsgID}) {
		t.Errorf("inbox = %v, want [%s]", got, kept.MsgID)
	}
}

// A read that saw a change still on its way to disk is answered only
// once that change is on disk.
func TestReadWaitsForTheChangesItSaw(t *testing.T) {
	s, _ := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	entered, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	free := func() { released.Do(func() { close(release) }) }
	t.Cleanup(free) // a failing test must not leave the syncer held
	s.log.failWrite = func(l *wal, rec []byte) error {
		once.Do(func() { close(entered); <-release })
		_, err := l.f.WriteAt(rec, l.off)
		return err
	}
	m := msg(a.Gid, b.Gid, "slow to disk")
	accepted := make(chan error, 1)
	go func() { _, _, err := s.Accept(m, t0); accepted <- err }()
	<-entered // the change is applied; its record waits to be written
	read := make(chan error, 1)
	go func() { _, err := s.Record(m.MsgID); read <- err }()
	select {
	case err := <-read:
		t.Fatalf("the read was answered (%v) before the change it saw was on disk", err)
	case <-time.After(100 * time.Millisecond): // a moment, to see nothing happens
	}
	free()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Errorf("read after the flush: %v", err)
	}
}

// An operation that fails halfway leaves no trace, whatever it changed:
// puts over old and new keys, deletes, sequences, buckets made and removed.
func TestFailedOperationIsUndoneWhole(t *testing.T) {
	s, path := newStore(t)
	a, b := mkEntity(t, s, "alice"), mkEntity(t, s, "bob")
	accept(t, s, msg(a.Gid, b.Gid, "one"))
	accept(t, s, msg(a.Gid, b.Gid, "two"))
	want := state(t, s, a.Gid, b.Gid)
	if n := s.Pending(b.Gid); n != 2 { // counted now, kept from here on
		t.Fatalf("Pending = %d, want 2", n)
	}
	boom := errors.New("boom")
	err := s.update(func(tx *wtx) error {
		ib := tx.Bucket(bInbox).Bucket([]byte(b.Gid))
		if _, err := ib.NextSequence(); err != nil {
			return err
		}
		if err := ib.Put(u64(1), []byte("overwritten")); err != nil {
			return err
		}
		if err := ib.Put(u64(77), []byte("new")); err != nil {
			return err
		}
		if err := ib.Put(u64(78), []byte("another")); err != nil {
			return err
		}
		if err := ib.Delete(u64(2)); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists([]byte("scratch")); err != nil {
			return err
		}
		nb, err := tx.Bucket(bInbox).CreateBucketIfNotExists([]byte("gid-new"))
		if err != nil {
			return err
		}
		if err := nb.Put([]byte("k"), []byte("v")); err != nil {
			return err
		}
		if err := tx.Bucket(bInbox).DeleteBucket([]byte(a.Gid)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update = %v, want boom", err)
	}
	check := func(when string) {
		if got := state(t, s, a.Gid, b.Gid); got != want {
			t.Errorf("%s:\n%s\nwant:\n%s", when, got, want)
		}
		_ = s.view(func(tx *wtx) error {
			if tx.Bucket([]byte("scratch")) != nil || tx.Bucket(bInbox).Bucket([]byte("gid-new")) != nil {
				t.Errorf("%s: a bucket made by the failed operation is there", when)
			}
			if tx.Bucket(bInbox).Bucket([]byte(a.Gid)) == nil {
				t.Errorf("%s: the bucket it removed is gone", when)
			}
			return nil
		})
	}
	check("after the failure")
	if n := s.Pending(b.Gid); n != 2 {
		t.Errorf("Pending after the failed operation = %d, want 2", n)
	}
	if rec := accept(t, s, msg(a.Gid, b.Gid, "three")); rec.Seq != 3 {
		t.Errorf("next seq = %d, want 3 (the failed NextSequence undone)", rec.Seq)
	}
	if n := s.Pending(b.Gid); n != 3 {
		t.Errorf("Pending after one more = %d, want 3", n)
	}
	want = state(t, s, a.Gid, b.Gid)
	crash(t, s)
	s = openTracked(t, path)
	check("after replay")
}

// append writes one record of muts and flushes it (tests forge records
// with it).
func (l *wal) append(lsn uint64, muts []mut) error {
	payload := appendMuts(nil, muts)
	if len(payload) > maxRecord {
		return errors.New("store: one group of changes is too large for the log")
	}
	return l.write(l.frame(nil, lsn, payload))
}
