package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fleetd/fleet/scripts/internal/benchkit"
	"golang.org/x/sys/unix"
)

// ---- b'. the group-commit disk floor ----

// groupLog is the simplest good durable appender: writers hand it records,
// and a record is durable once an fdatasync that covers it returns. The
// first writer to find no flush under way becomes the leader: it takes
// everything queued so far, writes it in one pwrite at the end of the
// file, fdatasyncs, marks those records durable and wakes their writers,
// then leads again while records are queued. Everyone else waits. So the
// disk sees one write and one flush per group, and a group is whatever
// queued during the previous flush — what fleet's store log does, minus
// everything else a gateway does.
type groupLog struct {
	f *os.File

	mu       sync.Mutex
	cond     *sync.Cond
	buf      []byte // queued, not yet taken by a leader
	queued   uint64 // records queued so far
	durable  uint64 // records on disk
	flushing bool
	off      int64
	err      error
	flushes  int
}

// append queues rec and returns once it is on disk.
func (l *groupLog) append(rec []byte) error {
	l.mu.Lock()
	l.buf = append(l.buf, rec...)
	l.queued++
	me := l.queued
	for l.durable < me && l.err == nil {
		if l.flushing {
			l.cond.Wait()
			continue
		}
		// lead: flush what is queued (this record included)
		l.flushing = true
		buf, upTo, off := l.buf, l.queued, l.off
		l.buf = make([]byte, 0, cap(buf))
		l.mu.Unlock()
		_, err := l.f.WriteAt(buf, off)
		if err == nil {
			err = unix.Fdatasync(int(l.f.Fd()))
		}
		l.mu.Lock()
		l.flushing = false
		l.flushes++
		if err != nil {
			l.err = err
		} else {
			l.off += int64(len(buf))
			l.durable = upTo
		}
		l.cond.Broadcast()
	}
	err := l.err
	l.mu.Unlock()
	return err
}

type groupResult struct {
	writers int
	n       int
	flushes int
	elapsed time.Duration
	cpu     time.Duration // this process's, over the run: the floor's CPU
}

func (r groupResult) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// plus is two runs as one: the floor is run before and after the gateway's
// run, so drift in the disk's speed hits both sides alike.
func (r groupResult) plus(o groupResult) groupResult {
	r.n += o.n
	r.flushes += o.flushes
	r.elapsed += o.elapsed
	r.cpu += o.cpu
	return r
}

// groupCommit has `writers` goroutines append n records of size bytes in
// all, each record waited for before the writer's next, to a fresh file in
// dir. The file is zero-filled and flushed beforehand, as fleet's log is
// (appends into allocated blocks flush only data), and checked afterwards.
func groupCommit(dir string, writers, n, size int) (groupResult, error) {
	res := groupResult{writers: writers, n: n}
	path := filepath.Join(dir, fmt.Sprintf("group-commit-%d.log", writers))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return res, err
	}
	defer os.Remove(path)
	defer f.Close()
	total := int64(n) * int64(size)
	zero := make([]byte, 1<<20)
	for off := int64(0); off < total; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero, off); err != nil {
			return res, err
		}
	}
	if err := f.Sync(); err != nil {
		return res, err
	}
	l := &groupLog{f: f}
	l.cond = sync.NewCond(&l.mu)
	rec := []byte(makeBody(size))
	var wg sync.WaitGroup
	errs := make([]error, writers)
	start := make(chan struct{})
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			k := benchkit.Split(n, writers, w)
			<-start
			for i := 0; i < k; i++ {
				if err := l.append(rec); err != nil {
					errs[w] = err
					return
				}
			}
		}(w)
	}
	t0, cpu0 := time.Now(), benchkit.SelfCPU()
	close(start)
	wg.Wait()
	res.elapsed, res.cpu = time.Since(t0), benchkit.SelfCPU()-cpu0
	res.flushes = l.flushes
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if l.off != total || l.durable != uint64(n) {
		return res, fmt.Errorf("group commit: %d bytes, %d records durable, want %d and %d", l.off, l.durable, total, n)
	}
	return res, nil
}

// fsyncCost times one small overwrite + fdatasync, calls times, in dir:
// the disk's share of one durable send.
func fsyncCost(dir string, calls int) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rec := []byte(makeBody(512))
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, calls)
	for i := 0; i < calls; i++ {
		t := time.Now()
		if _, err := f.WriteAt(rec, int64(i%2000)*512); err != nil {
			return nil, err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return benchkit.Sorted(out), nil
}
