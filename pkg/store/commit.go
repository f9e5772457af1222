package store

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleet/pkg/private"
)

// Store is the embedded store. Safe for concurrent use.
//
// Two goroutines do all the work, in a pipeline:
//
//   - the committer owns an open bbolt write transaction and runs every
//     operation, read or write, against it in arrival order, a group at a
//     time (all that queued meanwhile). A group's changes are encoded as one
//     log record and handed on; the committer goes straight on to the next
//     group.
//   - the syncer writes the records handed to it — all that queued during
//     its previous flush, in one write — fdatasyncs the log, and only then
//     answers the operations of those groups.
//
// So a caller hears "done" only once its change is on disk, and reads see
// every change already acknowledged; a read that saw changes still on their
// way to disk is answered after them. The transaction is committed to bbolt
// (a checkpoint) every few megabytes of log or every second, and the log
// starts over. When the log cannot be written, the refused groups are undone
// (each change keeps its before-image, wtx.go), and no write is taken until
// a checkpoint succeeds.
type Store struct {
	db     *bolt.DB
	log    *wal
	ops    chan *op
	done   chan struct{}
	wg     sync.WaitGroup
	mu     sync.RWMutex // held for reading while queueing an operation
	closed bool

	flushes chan *flush // committer -> syncer, in log order
	syncWG  sync.WaitGroup
	durable atomic.Uint64 // last log record on disk
	failed  atomic.Uint64 // first log record the syncer could not write (0: none)
	failErr atomic.Pointer[error]

	flushHook atomic.Pointer[func(time.Duration)] // OnFlush (stats.go); nil: none

	// owned by the committer
	tx        *bolt.Tx
	lsn       uint64    // last log record handed to the syncer
	ckptLSN   uint64    // last log record held by a bbolt commit
	dirty     time.Time // when the open transaction first changed (zero: clean)
	pending   []pendingGroup
	broken    error          // a log write or a checkpoint failed: writes are refused until a checkpoint succeeds
	counts    map[string]int // inbox gid -> messages in it, where counted (Pending)
	failTaken uint64         // the failure (first refused lsn) takeFailure has dealt with

	soonDelay time.Duration // how long a batch of soon items waits (soon.go); tests may set it before the first soon operation

	// tests: set before the first operation, called by the committer
	groupHook func(muts, bytes int)    // each group handed to the syncer: its changes, its log payload
	chunkHook func(tx *wtx, chunk int) // each chunk of a prune (prune.go), as it starts
}

type op struct {
	fn   func(*wtx) error
	read bool
	soon bool // its flush may wait up to soonDelay for others to share it (soon.go)
	err  chan error
}

// pendingGroup is a group handed to the syncer and not yet known to be on
// disk, with what undoes it.
type pendingGroup struct {
	lsn  uint64
	undo []undo
}

// flush is one item for the syncer: a log record and the operations it
// answers; or, with no record, a barrier (its operations are answered once
// everything before is on disk); or a fence (done is answered when the
// syncer reaches it); or a reset of the log to a new epoch.
type flush struct {
	lsn     uint64
	payload []byte
	ops     []*op
	errs    []error
	fence   chan struct{}
	reset   bool
	salt    uint64
	soon    bool // every operation it answers is soon (soon.go)
}

// Checkpoint policy: the open transaction is committed to bbolt once the
// log holds this much, or this long after its first change.
const (
	checkpointBytes = walPrealloc - (1 << 20)
	checkpointEvery = time.Second
)

// maxGroup bounds how many operations share one log record, groupBytes
// how much they write (a group ends early past it).
const (
	maxGroup   = 512
	groupBytes = 64 << 20
)

// Meta keys of the checkpoint.
var (
	metaLSN  = []byte("wal_lsn")
	metaSalt = []byte("wal_salt")
)

// Open opens (creating if needed) the store at path, with its log at
// path+"-wal", and replays the log. It fails at once when another process
// holds the store.
func Open(path string) (*Store, error) {
	// The free-page list is rebuilt at open instead of written on every
	// commit: fewer pages per checkpoint.
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        200 * time.Millisecond,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		OpenFile:       private.OpenFile, // never through a planted link
	})
	if err != nil {
		return nil, err
	}
	log, err := openWAL(path + "-wal")
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db, log: log, ops: make(chan *op, 1024), done: make(chan struct{}), flushes: make(chan *flush, 1024), soonDelay: soonDelay}
	if err := s.recover(noLimit); err != nil {
		log.close()
		db.Close()
		return nil, err
	}
	s.durable.Store(s.lsn)
	s.syncWG.Add(1)
	go s.syncLoop()
	if err := s.checkpoint(); err != nil {
		if s.tx != nil {
			s.tx.Rollback()
		}
		close(s.flushes)
		s.syncWG.Wait()
		log.close()
		db.Close()
		return nil, err
	}
	s.wg.Add(1)
	go s.commitLoop()
	return s, nil
}

// noLimit: recover replays whatever the log holds (at open).
const noLimit = ^uint64(0)

// recover begins the committer's transaction from the last checkpoint and
// applies the log records after it, up to limit. The syncer must be idle.
func (s *Store) recover(limit uint64) error {
	tx, err := s.db.Begin(true)
	if err != nil {
		return err
	}
	for _, b := range [][]byte{bEntities, bNames, bInbox, bRecords, bInflight, bDead, bMeta} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			tx.Rollback()
			return err
		}
	}
	meta := tx.Bucket(bMeta)
	if err := meta.Put([]byte("schema"), []byte("1")); err != nil {
		tx.Rollback()
		return err
	}
	var ckpt, salt uint64
	if v := meta.Get(metaLSN); len(v) == 8 {
		ckpt = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(metaSalt); len(v) == 8 {
		salt = binary.BigEndian.Uint64(v)
	}
	lsn := ckpt
	if salt != 0 { // no salt: no log was ever written for this store
		lsn, err = s.log.replay(salt, ckpt, limit, func(muts []mut) error {
			for i := range muts {
				if err := applyMut(tx, &muts[i]); err != nil {
					return fmt.Errorf("store: replaying the log: %w", err)
				}
			}
			return nil
		})
		if err != nil {
			tx.Rollback()
			return err
		}
		if limit != noLimit && lsn != limit && limit > ckpt {
			tx.Rollback()
			return fmt.Errorf("store: the log ends at record %d, but record %d was written", lsn, limit)
		}
	}
	if string(meta.Get(metaReplies)) != "1" {
		if err := buildReplyIndex(tx); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: building the reply index: %w", err)
		}
	}
	s.tx, s.lsn, s.ckptLSN, s.pending = tx, lsn, ckpt, nil
	s.counts = map[string]int{} // counted afresh from what was rebuilt
	s.dirty = time.Now()
	return nil
}

// checkpoint waits until every record handed to the syncer is on disk (or
// refused: then it is undone first), commits the open transaction to bbolt
// with the log position it holds and a new salt, begins the next
// transaction, and starts the log over. On failure the transaction is
// gone (s.tx is nil): recover rebuilds it from the log.
func (s *Store) checkpoint() error {
	s.fence()
	s.takeFailure()
	if s.tx == nil {
		if err := s.recover(s.durable.Load()); err != nil {
			return err
		}
	}
	salt := newSalt()
	meta := s.tx.Bucket(bMeta)
	if err := meta.Put(metaLSN, u64(s.lsn)); err != nil {
		return err
	}
	if err := meta.Put(metaSalt, u64(salt)); err != nil {
		return err
	}
	if err := s.tx.Commit(); err != nil {
		// The commit may have reached the file in part (its meta page
		// written, the flush failed): no log record is written until a
		// checkpoint succeeds, so none can land in an epoch the disk does
		// not have.
		s.tx = nil
		s.broken = fmt.Errorf("store: the checkpoint failed: %w", err)
		return err
	}
	s.flushes <- &flush{reset: true, salt: salt}
	s.fence()
	s.ckptLSN, s.dirty, s.pending, s.broken, s.failTaken = s.lsn, time.Time{}, nil, nil, 0
	tx, err := s.db.Begin(true)
	if err != nil {
		s.tx = nil
		return err
	}
	s.tx = tx
	return nil
}

// fence waits until the syncer has dealt with everything handed to it.
func (s *Store) fence() {
	f := &flush{fence: make(chan struct{})}
	s.flushes <- f
	<-f.fence
}

// takeFailure undoes, newest first, every group the syncer refused, and
// marks the store broken: no write is taken until a checkpoint succeeds.
// Every group before the first refused one is on disk; the refused ones'
// callers have heard the error.
func (s *Store) takeFailure() {
	first := s.failed.Load()
	if first == 0 || s.failTaken == first {
		return // none, or taken already
	}
	s.fence() // the syncer has answered everything queued
	err := errors.New("store: the log could not be written")
	if p := s.failErr.Load(); p != nil {
		err = *p
	}
	if s.tx != nil {
		w := &wtx{tx: s.tx, counts: s.counts}
		for i := len(s.pending) - 1; i >= 0 && s.pending[i].lsn >= first; i-- {
			w.undo = s.pending[i].undo
			if uerr := w.rollback(0); uerr != nil {
				s.tx.Rollback()
				s.tx = nil // recover() rebuilds it from what is on disk
				break
			}
		}
	}
	n := 0
	for n < len(s.pending) && s.pending[n].lsn < first {
		n++
	}
	s.pending = s.pending[:n]
	s.lsn = first - 1
	s.broken = err
	s.failTaken = first
}

func newSalt() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// Close stops the committer after the queued operations, checkpoints, and
// closes the files.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.done)
	s.wg.Wait()
	var err error
	if s.tx == nil {
		s.fence()
		err = s.recover(s.durable.Load())
	}
	if err == nil {
		err = s.checkpoint() // what it cannot commit stays in the log
	}
	if s.tx != nil {
		s.tx.Rollback()
	}
	close(s.flushes)
	s.syncWG.Wait()
	return errors.Join(err, s.log.close(), s.db.Close())
}

// commitLoop is the committer.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		if !armed && !s.dirty.IsZero() {
			timer.Reset(time.Until(s.dirty.Add(checkpointEvery)))
			armed = true
		}
		var first *op
		select {
		case first = <-s.ops:
		case <-timer.C:
			armed = false
			s.maybeCheckpoint(time.Since(s.dirty) >= checkpointEvery)
			continue
		case <-s.done:
			for { // run what is queued, then stop
				select {
				case o := <-s.ops:
					for b := []*op{o}; len(b) > 0; {
						b = b[s.runGroup(b):]
					}
				default:
					return
				}
			}
		}
		batch := make([]*op, 1, 8)
		batch[0] = first
	fill:
		for len(batch) < maxGroup {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		for len(batch) > 0 {
			batch = batch[s.runGroup(batch):]
		}
		s.maybeCheckpoint(false)
	}
}

// runGroup runs the head of batch as one group against the open
// transaction and hands its changes to the syncer, which answers the group
// once they are on disk. It returns how many operations it took: a group
// ends early once its changes reach groupBytes. An operation that fails is
// undone alone.
func (s *Store) runGroup(batch []*op) int {
	s.takeFailure()
	if s.broken != nil && s.tx != nil {
		_ = s.checkpoint() // on success the log works again (broken is cleared)
	}
	if s.tx == nil { // a failed checkpoint or undo lost the transaction
		if err := s.recover(s.durable.Load()); err != nil {
			for _, o := range batch {
				o.err <- fmt.Errorf("store: %w", err)
			}
			return len(batch)
		}
	}
	w := &wtx{tx: s.tx, refuse: s.broken, counts: s.counts}
	errs := make([]error, 0, len(batch))
	taken := 0
	for _, o := range batch {
		if w.size >= groupBytes {
			break // the rest make the next group
		}
		taken++
		mark, umark, size := len(w.muts), len(w.undo), w.size
		w.readOnly = o.read
		err := o.fn(w)
		if err == nil && w.size-size > maxRecord/2 {
			err = fmt.Errorf("store: one change of %d MiB is too large to write at once", (w.size-size)>>20)
		}
		if err != nil && len(w.undo) > umark {
			if uerr := w.rollback(umark); uerr != nil {
				// the transaction cannot be trusted: drop it, and every
				// change not yet on disk with it
				s.fence()
				s.tx.Rollback()
				s.tx = nil
				for _, o := range batch {
					o.err <- fmt.Errorf("store: undoing a failed operation: %w", uerr)
				}
				return len(batch)
			}
			w.muts, w.size = w.muts[:mark], size
		}
		errs = append(errs, err)
	}
	ops := batch[:taken]
	soon := true
	for _, o := range ops {
		soon = soon && o.soon
	}
	switch {
	case len(w.muts) > 0:
		s.lsn++
		s.pending = append(s.pending, pendingGroup{lsn: s.lsn, undo: w.undo})
		payload := appendMuts(nil, w.muts)
		if s.groupHook != nil {
			s.groupHook(len(w.muts), len(payload))
		}
		s.flushes <- &flush{lsn: s.lsn, payload: payload, ops: ops, errs: errs, soon: soon}
		if s.dirty.IsZero() {
			s.dirty = time.Now()
		}
	case s.lsn > s.durable.Load():
		// reads may have seen changes still on their way to disk
		s.flushes <- &flush{ops: ops, errs: errs, soon: soon}
	default:
		for i, o := range ops {
			o.err <- errs[i]
		}
	}
	// forget the undo logs of groups now on disk
	d := s.durable.Load()
	n := 0
	for n < len(s.pending) && s.pending[n].lsn <= d {
		n++
	}
	if n > 0 {
		s.pending = append(s.pending[:0], s.pending[n:]...)
	}
	return taken
}

// maybeCheckpoint commits to bbolt when the log is big enough, or, when
// due, once the transaction has had changes for checkpointEvery. A failed
// checkpoint is tried again checkpointEvery later (writes are refused
// meanwhile: see checkpoint).
func (s *Store) maybeCheckpoint(due bool) {
	if s.dirty.IsZero() {
		return
	}
	if s.tx != nil && s.log.size() < checkpointBytes && !due {
		return
	}
	if err := s.checkpoint(); err != nil { // it rebuilds a lost transaction first
		if s.tx == nil {
			// the changes are safe in the log: rebuild the transaction
			// from it now if the disk lets us, else at the next operation
			_ = s.recover(s.durable.Load())
		}
		s.dirty = time.Now() // back off
	}
}

// syncLoop is the syncer: it writes the records handed to it, all that
// queued during the previous flush in one write and one fdatasync, then
// answers their operations. A batch of only soon items first waits up to
// soonDelay for another item to flush with (soon.go).
func (s *Store) syncLoop() {
	defer s.syncWG.Done()
	var batch []*flush
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		f, ok := <-s.flushes
		if !ok {
			return
		}
		batch, ok = s.fill(append(batch[:0], f))
		if ok && allSoon(batch) {
			timer.Reset(s.soonDelay)
		wait:
			for allSoon(batch) {
				select {
				case g, more := <-s.flushes:
					if !more {
						ok = false
						break wait
					}
					batch, ok = s.fill(append(batch, g))
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		s.syncBatch(batch)
		if !ok {
			return
		}
	}
}

// fill adds to batch what is queued for the syncer, without waiting; ok
// is false once the queue is closed.
func (s *Store) fill(batch []*flush) ([]*flush, bool) {
	for {
		select {
		case g, ok := <-s.flushes:
			if !ok {
				return batch, false
			}
			batch = append(batch, g)
		default:
			return batch, true
		}
	}
}

// syncBatch writes the records of batch up to each reset or fence, and
// answers each item in order.
func (s *Store) syncBatch(batch []*flush) {
	var buf []byte
	var last uint64
	from := 0
	write := func(to int) {
		var err error
		switch {
		case s.failed.Load() != 0:
			err = *s.failErr.Load()
		case len(buf) > 0:
			start := time.Now()
			err = s.log.write(buf)
			if f := s.flushHook.Load(); f != nil {
				(*f)(time.Since(start))
			}
			if err == nil {
				s.durable.Store(last)
			} else {
				for _, f := range batch[from:to] {
					if f.lsn != 0 {
						s.failErr.Store(&err)
						s.failed.Store(f.lsn)
						break
					}
				}
			}
		}
		for _, f := range batch[from:to] {
			for i, o := range f.ops {
				if err != nil {
					o.err <- err
				} else {
					o.err <- f.errs[i]
				}
			}
		}
		buf, from = buf[:0], to
	}
	for i, f := range batch {
		switch {
		case f.fence != nil:
			write(i)
			from = i + 1
			close(f.fence)
		case f.reset:
			write(i)
			from = i + 1
			s.log.reset(f.salt)
			s.failed.Store(0)
		case f.lsn != 0:
			buf = s.log.frame(buf, f.lsn, f.payload)
			last = f.lsn
		}
	}
	write(len(batch))
}

// update runs fn in the committer and returns once its changes are on
// disk. An error from fn undoes fn's changes (and only fn's).
func (s *Store) update(fn func(*wtx) error) error { return s.run(fn, false) }

// view runs fn in the committer, read-only: it sees every change already
// acknowledged. Slices fn reads are valid only inside fn.
func (s *Store) view(fn func(*wtx) error) error { return s.run(fn, true) }

func (s *Store) run(fn func(*wtx) error, read bool) error {
	return s.start(&op{fn: fn, read: read})()
}

// queue runs o and returns once it is answered (soon.go).
func (s *Store) queue(o *op) error { return s.start(o)() }

// start queues o for the committer and returns a wait for its outcome:
// every operation queued after this one (by any goroutine) runs after it
// and sees its changes; wait returns once they are on disk.
func (s *Store) start(o *op) (wait func() error) {
	o.err = make(chan error, 1)
	// Queue under the read lock: Close cannot start draining until every
	// operation queued before it is in s.ops, so none is left unanswered.
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return func() error { return errors.New("store closed") }
	}
	s.ops <- o
	s.mu.RUnlock()
	return func() error { return <-o.err }
}
