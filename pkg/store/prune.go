package store

import (
	"bytes"
	"encoding/json"
	"time"
)

// Pruning: forgetting what is past its window (delivery records and
// control requests past the dedup window, dead letters past their
// retention) without stalling anyone.
//
// Every store operation runs in the committer, one after another, so one
// operation that deletes a million records holds up every sender for as
// long as it runs, and one change that large cannot even be written to the
// log (the log refuses an operation past half of maxRecord). So a prune is
// cut into chunks, each its own store operation: a chunk looks at no more
// than pruneScan keys and deletes no more than pruneChunk of them, or
// pruneChunkBytes of values (the operation keeps what it deleted in memory,
// to undo it, until its log record is on disk). The next chunk is queued
// only once the previous one is done, behind whatever other callers queued
// meanwhile: a sender waits for one chunk at most, never for the whole
// prune. Each chunk takes up the walk where the last one stopped (by key).

const (
	pruneChunk      = 1000
	pruneScan       = 8 * pruneChunk
	pruneChunkBytes = 4 << 20
)

// Prune forgets delivery records finished before cutoff: the end of the
// dedup window. Records of queued messages are kept, and so are records of
// dead letters while their dead letter is (PruneDead forgets it). Outbound
// records (Seq 0: in no local inbox) go once accepted before cutoff. It
// returns how many records it forgot.
func (s *Store) Prune(cutoff time.Time) (int, error) {
	n, err := s.pruneBucket(bRecords, func(tx *wtx, k, v []byte) bool {
		var r Record
		if decodeRecord(v, &r) != nil {
			return false
		}
		finished := r.State != Accepted && !r.Done.IsZero() && r.Done.Before(cutoff)
		// an outbound record is done with once its recipient's host has
		// had the dedup window for it
		outbound := r.State == Accepted && r.Seq == 0 && r.Accepted.Before(cutoff)
		return (finished || outbound) && tx.Bucket(bDead).Get(k) == nil
	})
	if err == nil {
		_, err = s.pruneSent() // the bytes kept with records gone or settled
	}
	return n, err
}

// PruneDead forgets dead letters that died before cutoff (the end of
// dead-retention): their envelopes go, and they leave the listing
// (DeadLetters, fleet-roster dead) and the counts. A dead letter is kept
// in the dead bucket alone (the inbox and in-flight entries went when it
// died), so nothing is left pointing at it. Its delivery record stays —
// state dead, reason, attempts — and the next Prune forgets it like any
// finished record once it is past the dedup window too: a msg id inside
// the dedup window stays a duplicate however short dead-retention is.
func (s *Store) PruneDead(cutoff time.Time) (int, error) {
	return s.pruneBucket(bDead, func(_ *wtx, _, v []byte) bool {
		at, ok := deadAt(v)
		return ok && at.Before(cutoff)
	})
}

// PruneControl forgets requests answered before cutoff (the end of the
// dedup window). Running ones are kept.
func (s *Store) PruneControl(cutoff time.Time) (int, error) {
	return s.pruneBucket(bControl, func(_ *wtx, _, v []byte) bool {
		var c Control
		return json.Unmarshal(v, &c) == nil && c.State == ControlDone && c.Done.Before(cutoff)
	})
}

// pruneBucket deletes every key of the top-level bucket name for which
// doomed says so, a chunk per store operation (see above), and returns how
// many it deleted. A bucket that does not exist has nothing to prune.
func (s *Store) pruneBucket(name []byte, doomed func(tx *wtx, k, v []byte) bool) (int, error) {
	total := 0
	var from []byte // the last key looked at; nil: start at the first
	for chunk := 0; ; chunk++ {
		var last []byte
		n := 0
		err := s.update(func(tx *wtx) error {
			last, n = nil, 0
			if s.chunkHook != nil {
				s.chunkHook(tx, chunk)
			}
			b := tx.Bucket(name)
			if b == nil {
				return nil
			}
			c := b.Cursor()
			k, v := c.First()
			if from != nil {
				if k, v = c.Seek(from); bytes.Equal(k, from) {
					k, v = c.Next()
				}
			}
			var del [][]byte
			scanned, size := 0, 0
			for ; k != nil; k, v = c.Next() {
				if scanned == pruneScan || len(del) == pruneChunk || size >= pruneChunkBytes {
					break // the next chunk goes on after last
				}
				scanned++
				last = k
				if v != nil && doomed(tx, k, v) {
					del = append(del, clone(k))
					size += len(k) + len(v)
				}
			}
			if k == nil {
				last = nil // the walk reached the end
			} else {
				last = clone(last)
			}
			for _, k := range del {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			n = len(del)
			return nil
		})
		if err != nil {
			return total, err
		}
		total += n
		if last == nil {
			return total, nil
		}
		from = last
	}
}

// deadAt reads when a stored dead letter died (when it was accepted, for
// one without a death time), without decoding its envelope: the record
// comes first in its JSON.
func deadAt(v []byte) (time.Time, bool) {
	dec := json.NewDecoder(bytes.NewReader(v))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return time.Time{}, false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return time.Time{}, false
		}
		if key, _ := t.(string); key == "record" {
			var r Record
			if dec.Decode(&r) != nil {
				return time.Time{}, false
			}
			at := r.Done
			if at.IsZero() {
				at = r.Accepted
			}
			return at, !at.IsZero()
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return time.Time{}, false
		}
	}
	return time.Time{}, false
}
