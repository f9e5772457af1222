package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/fleetd/fleet/pkg/private"
)

// The write-ahead log: where a change becomes durable.
//
// Each group of operations the committer runs is appended as one record and
// fdatasync'd before any of its callers hears "done": one small sequential
// write and one flush, where a bbolt commit costs two flushes and a page
// write per touched page. bbolt holds the same changes in a transaction that
// stays open across groups and is committed (a checkpoint) every few
// megabytes of log or every second; a checkpoint stores the last log
// sequence number it holds, and the log then starts again at offset 0.
//
// On open, the records after the checkpoint's sequence number are applied
// again (replay), in order, then checkpointed. A record counts only if its
// checksum holds and its sequence number is the next one: a torn tail, or
// an older epoch's leftovers further on, end the replay. The checksum is
// seeded with a random salt per epoch, kept in the checkpoint, so message
// bytes that happen to look like a record can never pass for one.
//
// Record: u32 payload length | u32 crc32c(salt, lsn, payload) | u64 lsn | payload.
const walHeader = 16

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// walPrealloc is how much of the log is written with zeros up front, when
// the disk has room to spare: appends into blocks that exist flush only
// data, not the file's block map.
const walPrealloc = 8 << 20

// wal is the log file. Only one goroutine at a time writes it (the
// syncer; at open and after a failure, the committer while the syncer is
// idle).
type wal struct {
	f    *os.File
	off  int64
	salt uint64
	end  atomic.Int64 // off, for other goroutines

	failWrite func(*wal, []byte) error // tests: stands in for the write
}

func openWAL(path string) (*wal, error) {
	_, statErr := os.Stat(path)
	f, err := private.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if os.IsNotExist(statErr) {
		preallocate(f, path)
		// the new name must survive a crash too
		if d, err := os.Open(filepath.Dir(path)); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return &wal{f: f}, nil
}

// preallocate zero-fills the log's first walPrealloc bytes when the
// filesystem has at least eight times that free; on a tight disk the log
// grows as it is written instead.
func preallocate(f *os.File, path string) {
	var st unix.Statfs_t
	if unix.Statfs(filepath.Dir(path), &st) != nil || int64(st.Bavail)*int64(st.Bsize) < 8*walPrealloc {
		return
	}
	zero := make([]byte, 1<<20)
	for off := int64(0); off < walPrealloc; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero, off); err != nil {
			_ = f.Truncate(0)
			return
		}
	}
	_ = f.Sync()
}

func (l *wal) sum(lsn uint64, payload []byte) uint32 {
	var h [16]byte
	binary.LittleEndian.PutUint64(h[:8], l.salt)
	binary.LittleEndian.PutUint64(h[8:], lsn)
	return crc32.Update(crc32.Checksum(h[:], crcTable), crcTable, payload)
}

// frame appends to dst the record of payload as number lsn.
func (l *wal) frame(dst []byte, lsn uint64, payload []byte) []byte {
	var h [walHeader]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], l.sum(lsn, payload))
	binary.LittleEndian.PutUint64(h[8:], lsn)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// write puts records at the end of the log and flushes them. On error the
// log's end does not move, and what may have reached the file is made
// unreadable before write returns: records whose writers hear an error
// must never be replayed.
func (l *wal) write(records []byte) error {
	first := int64(len(records))
	if len(records) >= walHeader {
		first = walHeader + int64(binary.LittleEndian.Uint32(records))
	}
	if l.failWrite != nil {
		if err := l.failWrite(l, records); err != nil {
			return l.refused(err, first)
		}
	} else if _, err := l.f.WriteAt(records, l.off); err != nil {
		return l.refused(err, first)
	}
	if err := fdatasync(l.f); err != nil {
		return l.refused(err, first)
	}
	l.off += int64(len(records))
	l.end.Store(l.off)
	return nil
}

// refused zeroes the header at the log's end, where a failed write may
// have left a whole record, and flushes that: replay stops there. If that
// fails too while the file is long enough to hold the first record whole,
// nobody can say whether the refused changes survive a crash, and the
// error says so.
func (l *wal) refused(err error, first int64) error {
	var zero [walHeader]byte
	_, zerr := l.f.WriteAt(zero[:], l.off)
	if zerr == nil {
		zerr = fdatasync(l.f)
	}
	if zerr == nil {
		return err
	}
	if fi, serr := l.f.Stat(); serr == nil && fi.Size() < l.off+first {
		return err // the record is torn: replay stops there anyway
	}
	return fmt.Errorf("%w (and the failed log record could not be cleared: the change may or may not survive a restart)", err)
}

// size is how far the log has been written in this epoch; safe to call
// from any goroutine.
func (l *wal) size() int64 { return l.end.Load() }

// reset starts a new epoch at offset 0 with salt (after a checkpoint).
func (l *wal) reset(salt uint64) {
	l.off, l.salt = 0, salt
	l.end.Store(0)
}

// replay reads the records of the epoch with salt, from offset 0, and
// calls fn for each one whose sequence number is next (from after+1, up to
// limit: records past what is known to be on disk are left alone). It
// returns the last sequence number applied, and leaves the log's end
// after it.
func (l *wal) replay(salt, after, limit uint64, fn func([]mut) error) (uint64, error) {
	l.salt = salt
	l.off = 0
	lsn := after
	r := io.NewSectionReader(l.f, 0, 1<<62)
	var hdr [walHeader]byte
	for lsn < limit {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if endOfLog(err) {
				break // end of file, or a torn header
			}
			return lsn, fmt.Errorf("store: reading the log: %w", err)
		}
		n := binary.LittleEndian.Uint32(hdr[0:])
		if n == 0 || n > maxRecord {
			break
		}
		if binary.LittleEndian.Uint64(hdr[8:]) != lsn+1 {
			break
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			if endOfLog(err) {
				break // a torn record
			}
			return lsn, fmt.Errorf("store: reading the log: %w", err)
		}
		if binary.LittleEndian.Uint32(hdr[4:]) != l.sum(lsn+1, payload) {
			break
		}
		muts, err := decodeMuts(payload)
		if err != nil {
			return lsn, err // a record that checks out but does not parse: a bug, not a torn write
		}
		if err := fn(muts); err != nil {
			return lsn, err
		}
		lsn++
		l.off += walHeader + int64(n)
	}
	l.end.Store(l.off)
	return lsn, nil
}

// endOfLog tells a log that simply ends (or ends torn) from one that
// cannot be read: only the first ends a replay quietly.
func endOfLog(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// maxRecord bounds one record (a group of up to maxGroup operations, each
// carrying at most a body-sized envelope, many times over).
const maxRecord = 1 << 30

func (l *wal) close() error { return l.f.Close() }

func fdatasync(f *os.File) error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}
