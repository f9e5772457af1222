package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// wtx is what every store operation runs against: the committer's open
// bbolt write transaction, seen through buckets that record each change.
//
// The record serves twice. Each change is also written, in order, as a
// mutation to the write-ahead log (wal.go) — that append, not the bbolt
// commit, is what makes an operation durable. And each change keeps its
// before-image, so an operation that fails halfway is undone without
// touching the other operations that share the transaction.
type wtx struct {
	tx       *bolt.Tx
	readOnly bool
	refuse   error // set: every write fails with it (the log is broken)
	muts     []mut
	undo     []undo
	size     int            // about how many bytes muts take in the log
	counts   map[string]int // inbox gid -> messages in it, where known (the committer's; see Store.Pending)
}

// counted adjusts the known count of the inbox at path by d (a put of a
// new key, a delete of one), or forgets it (d == 0: no longer known).
func (w *wtx) counted(path [][]byte, d int) {
	if w.counts == nil || len(path) != 2 || string(path[0]) != string(bInbox) {
		return
	}
	gid := string(path[1])
	if n, ok := w.counts[gid]; ok && d != 0 {
		w.counts[gid] = n + d
	} else {
		delete(w.counts, gid)
	}
}

// Mutation kinds, as written to the log.
const (
	mutPut byte = iota + 1
	mutDelete
	mutSetSeq
	mutCreateBucket
	mutDeleteBucket
)

// mut is one change: a key put or deleted, a sequence set, a bucket made
// or removed, at a bucket path from the root.
type mut struct {
	kind  byte
	path  [][]byte // bucket path; for bucket kinds, the bucket itself
	key   []byte
	value []byte
	seq   uint64
}

// undo restores what one change replaced.
type undo struct {
	kind  byte // mutPut: put value back (nil value: delete key); mutSetSeq; mutCreateBucket: delete it; mutDeleteBucket: recreate with kvs
	path  [][]byte
	key   []byte
	value []byte
	seq   uint64
	kvs   [][2][]byte
}

var errReadOnly = errors.New("store: write in a read operation")

// writable says why this operation may not write, if it may not.
func (w *wtx) writable() error {
	if w.readOnly {
		return errReadOnly
	}
	return w.refuse
}

// wbucket is a bucket of a wtx.
type wbucket struct {
	w    *wtx
	path [][]byte
	b    *bolt.Bucket
}

func (w *wtx) Bucket(name []byte) *wbucket {
	b := w.tx.Bucket(name)
	if b == nil {
		return nil
	}
	return &wbucket{w: w, path: [][]byte{name}, b: b}
}

func (w *wtx) CreateBucketIfNotExists(name []byte) (*wbucket, error) {
	if b := w.Bucket(name); b != nil {
		return b, nil
	}
	if err := w.writable(); err != nil {
		return nil, err
	}
	b, err := w.tx.CreateBucket(name)
	if err != nil {
		return nil, err
	}
	path := [][]byte{name}
	w.muts = append(w.muts, mut{kind: mutCreateBucket, path: path})
	w.undo = append(w.undo, undo{kind: mutCreateBucket, path: path})
	return &wbucket{w: w, path: path, b: b}, nil
}

func (b *wbucket) sub(name []byte) [][]byte {
	p := make([][]byte, len(b.path)+1)
	copy(p, b.path)
	p[len(b.path)] = name
	return p
}

func (b *wbucket) Bucket(name []byte) *wbucket {
	nb := b.b.Bucket(name)
	if nb == nil {
		return nil
	}
	return &wbucket{w: b.w, path: b.sub(name), b: nb}
}

func (b *wbucket) CreateBucketIfNotExists(name []byte) (*wbucket, error) {
	if nb := b.Bucket(name); nb != nil {
		return nb, nil
	}
	if err := b.w.writable(); err != nil {
		return nil, err
	}
	nb, err := b.b.CreateBucket(name)
	if err != nil {
		return nil, err
	}
	path := b.sub(name)
	b.w.counted(path, 0)
	b.w.muts = append(b.w.muts, mut{kind: mutCreateBucket, path: path})
	b.w.undo = append(b.w.undo, undo{kind: mutCreateBucket, path: path})
	return &wbucket{w: b.w, path: path, b: nb}, nil
}

// DeleteBucket removes a nested bucket of plain keys (an inbox).
func (b *wbucket) DeleteBucket(name []byte) error {
	if err := b.w.writable(); err != nil {
		return err
	}
	nb := b.b.Bucket(name)
	if nb == nil {
		return bolterrors.ErrBucketNotFound
	}
	u := undo{kind: mutDeleteBucket, path: b.sub(name), seq: nb.Sequence()}
	err := nb.ForEach(func(k, v []byte) error {
		if v == nil {
			return fmt.Errorf("store: bucket %q holds a bucket", name)
		}
		u.kvs = append(u.kvs, [2][]byte{clone(k), clone(v)})
		return nil
	})
	if err != nil {
		return err
	}
	if err := b.b.DeleteBucket(name); err != nil {
		return err
	}
	b.w.counted(u.path, 0)
	b.w.muts = append(b.w.muts, mut{kind: mutDeleteBucket, path: u.path})
	b.w.undo = append(b.w.undo, u)
	return nil
}

func (b *wbucket) Get(k []byte) []byte                      { return b.b.Get(k) }
func (b *wbucket) Cursor() *bolt.Cursor                     { return b.b.Cursor() }
func (b *wbucket) ForEach(fn func(k, v []byte) error) error { return b.b.ForEach(fn) }
func (b *wbucket) Stats() bolt.BucketStats                  { return b.b.Stats() }

// Put stores a copy of v under k.
func (b *wbucket) Put(k, v []byte) error {
	if err := b.w.writable(); err != nil {
		return err
	}
	prev := clone(b.b.Get(k))
	k, v = clone(k), clone(v)
	if v == nil {
		v = []byte{}
	}
	if err := b.b.Put(k, v); err != nil {
		return err
	}
	if prev == nil {
		b.w.counted(b.path, +1)
	}
	b.w.muts = append(b.w.muts, mut{kind: mutPut, path: b.path, key: k, value: v})
	b.w.size += 16 + len(k) + len(v) + pathLen(b.path)
	b.w.undo = append(b.w.undo, undo{kind: mutPut, path: b.path, key: k, value: prev})
	return nil
}

func (b *wbucket) Delete(k []byte) error {
	if err := b.w.writable(); err != nil {
		return err
	}
	prev := b.b.Get(k)
	if prev == nil {
		return b.b.Delete(k) // nothing to delete (nil), or a bucket (refused)
	}
	prev, k = clone(prev), clone(k)
	if err := b.b.Delete(k); err != nil {
		return err
	}
	b.w.counted(b.path, -1)
	b.w.muts = append(b.w.muts, mut{kind: mutDelete, path: b.path, key: k})
	b.w.size += 16 + len(k) + pathLen(b.path)
	b.w.undo = append(b.w.undo, undo{kind: mutPut, path: b.path, key: k, value: prev})
	return nil
}

func (b *wbucket) NextSequence() (uint64, error) {
	if err := b.w.writable(); err != nil {
		return 0, err
	}
	prev := b.b.Sequence()
	n, err := b.b.NextSequence()
	if err != nil {
		return 0, err
	}
	b.w.muts = append(b.w.muts, mut{kind: mutSetSeq, path: b.path, seq: n})
	b.w.undo = append(b.w.undo, undo{kind: mutSetSeq, path: b.path, seq: prev})
	return n, nil
}

func pathLen(path [][]byte) int {
	n := 0
	for _, p := range path {
		n += 2 + len(p)
	}
	return n
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// bucketAt finds the bucket at path in tx.
func bucketAt(tx *bolt.Tx, path [][]byte) (*bolt.Bucket, error) {
	if len(path) == 0 {
		return nil, errors.New("store: empty bucket path")
	}
	b := tx.Bucket(path[0])
	for _, p := range path[1:] {
		if b == nil {
			break
		}
		b = b.Bucket(p)
	}
	if b == nil {
		return nil, fmt.Errorf("store: no bucket %q", path)
	}
	return b, nil
}

// createAt makes the bucket at path (its parent must exist).
func createAt(tx *bolt.Tx, path [][]byte) error {
	if len(path) == 1 {
		_, err := tx.CreateBucket(path[0])
		return err
	}
	parent, err := bucketAt(tx, path[:len(path)-1])
	if err != nil {
		return err
	}
	_, err = parent.CreateBucket(path[len(path)-1])
	return err
}

// deleteAt removes the bucket at path.
func deleteAt(tx *bolt.Tx, path [][]byte) error {
	if len(path) == 1 {
		return tx.DeleteBucket(path[0])
	}
	parent, err := bucketAt(tx, path[:len(path)-1])
	if err != nil {
		return err
	}
	return parent.DeleteBucket(path[len(path)-1])
}

// rollback undoes the changes recorded from mark on, newest first.
func (w *wtx) rollback(mark int) error {
	for i := len(w.undo) - 1; i >= mark; i-- {
		w.counted(w.undo[i].path, 0) // recounted when next asked
		if err := applyUndo(w.tx, &w.undo[i]); err != nil {
			return err
		}
	}
	w.undo = w.undo[:mark]
	return nil
}

func applyUndo(tx *bolt.Tx, u *undo) error {
	switch u.kind {
	case mutCreateBucket:
		return deleteAt(tx, u.path)
	case mutDeleteBucket:
		if err := createAt(tx, u.path); err != nil {
			return err
		}
		b, err := bucketAt(tx, u.path)
		if err != nil {
			return err
		}
		for _, kv := range u.kvs {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return b.SetSequence(u.seq)
	}
	b, err := bucketAt(tx, u.path)
	if err != nil {
		return err
	}
	switch u.kind {
	case mutPut:
		if u.value == nil {
			return b.Delete(u.key)
		}
		return b.Put(u.key, u.value)
	case mutSetSeq:
		return b.SetSequence(u.seq)
	}
	return fmt.Errorf("store: unknown undo kind %d", u.kind)
}

// applyMut replays one logged change.
func applyMut(tx *bolt.Tx, m *mut) error {
	switch m.kind {
	case mutCreateBucket:
		return createAt(tx, m.path)
	case mutDeleteBucket:
		return deleteAt(tx, m.path)
	}
	b, err := bucketAt(tx, m.path)
	if err != nil {
		return err
	}
	switch m.kind {
	case mutPut:
		return b.Put(m.key, m.value)
	case mutDelete:
		return b.Delete(m.key)
	case mutSetSeq:
		return b.SetSequence(m.seq)
	}
	return fmt.Errorf("store: unknown mutation kind %d", m.kind)
}

// appendMuts encodes muts onto buf: per mutation its kind, the path
// (count, then each part), then key and value or the sequence, with
// lengths as uvarints.
func appendMuts(buf []byte, muts []mut) []byte {
	for i := range muts {
		m := &muts[i]
		buf = append(buf, m.kind)
		buf = binary.AppendUvarint(buf, uint64(len(m.path)))
		for _, p := range m.path {
			buf = appendBytes(buf, p)
		}
		switch m.kind {
		case mutPut:
			buf = appendBytes(buf, m.key)
			buf = appendBytes(buf, m.value)
		case mutDelete:
			buf = appendBytes(buf, m.key)
		case mutSetSeq:
			buf = binary.AppendUvarint(buf, m.seq)
		}
	}
	return buf
}

func appendBytes(buf, b []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	return append(buf, b...)
}

// decodeMuts is the inverse of appendMuts. The slices it returns point
// into buf.
func decodeMuts(buf []byte) ([]mut, error) {
	var out []mut
	bad := errors.New("store: malformed log record")
	uv := func() (uint64, bool) {
		n, k := binary.Uvarint(buf)
		if k <= 0 {
			return 0, false
		}
		buf = buf[k:]
		return n, true
	}
	bs := func() ([]byte, bool) {
		n, ok := uv()
		if !ok || n > uint64(len(buf)) {
			return nil, false
		}
		b := buf[:n:n]
		buf = buf[n:]
		return b, true
	}
	for len(buf) > 0 {
		m := mut{kind: buf[0]}
		buf = buf[1:]
		np, ok := uv()
		if !ok || np == 0 || np > 16 {
			return nil, bad
		}
		for range np {
			p, ok := bs()
			if !ok {
				return nil, bad
			}
			m.path = append(m.path, p)
		}
		switch m.kind {
		case mutPut:
			if m.key, ok = bs(); !ok {
				return nil, bad
			}
			if m.value, ok = bs(); !ok {
				return nil, bad
			}
		case mutDelete:
			if m.key, ok = bs(); !ok {
				return nil, bad
			}
		case mutSetSeq:
			if m.seq, ok = uv(); !ok {
				return nil, bad
			}
		case mutCreateBucket, mutDeleteBucket:
		default:
			return nil, bad
		}
		out = append(out, m)
	}
	return out, nil
}
