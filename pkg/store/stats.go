package store

import (
	"bytes"
	"encoding/json"
	"time"
)

// What the store tells fleet-gw's metrics (pkg/gateway/metrics.go). The
// store knows nothing of how they are exported: it reports its log flushes
// to an observer and answers a question about its inboxes.

// OnFlush sets f to be told how long each write-ahead log flush took (one
// write and one fdatasync, shared by every group it carries): the time a
// caller waits for durability beyond its own work. f runs on the syncer,
// between a flush and the answers it releases: it must not block. nil
// stops it.
func (s *Store) OnFlush(f func(took time.Duration)) {
	if f == nil {
		s.flushHook.Store(nil)
		return
	}
	s.flushHook.Store(&f)
}

// InboxStat is one local inbox at a glance.
type InboxStat struct {
	Gid    string
	Depth  int       // messages waiting in it
	Oldest time.Time // creation time of the message at its head; zero when empty or unreadable
}

// headPrefix is how much of an inbox's head message is copied out of the
// committer to find its creation time. An envelope is encoded with
// "created" before its body, after ids and names of bounded length, so
// the prefix holds it without copying a large body.
const headPrefix = 2048

// Inboxes reports every local inbox: its depth and the creation time of
// its head. One pass in the committer (counts are kept, as for Pending,
// and a head is a cursor's first key), so a scrape at thousands of
// entities holds writers back about a millisecond per thousand inboxes.
func (s *Store) Inboxes() ([]InboxStat, error) {
	type raw struct {
		gid   string
		depth int
		head  []byte
	}
	var rows []raw
	err := s.view(func(tx *wtx) error {
		inbox := tx.Bucket(bInbox)
		return inbox.ForEach(func(k, v []byte) error {
			if v != nil {
				return nil // not a bucket
			}
			ib := inbox.Bucket(k)
			if ib == nil {
				return nil
			}
			gid := string(k)
			c := ib.Cursor()
			first, head := c.First()
			n, ok := tx.counts[gid]
			if !ok {
				for key := first; key != nil; key, _ = c.Next() {
					n++
				}
				tx.counts[gid] = n
			}
			r := raw{gid: gid, depth: n}
			if first != nil {
				r.head = clone(head[:min(len(head), headPrefix)])
			}
			rows = append(rows, r)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	out := make([]InboxStat, len(rows))
	for i, r := range rows {
		out[i] = InboxStat{Gid: r.gid, Depth: r.depth, Oldest: createdOf(r.head)}
	}
	return out, nil
}

// createdOf reads the "created" member of an encoded envelope's top level
// from a prefix of it; zero if the prefix does not hold it.
func createdOf(prefix []byte) time.Time {
	if len(prefix) == 0 {
		return time.Time{}
	}
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return time.Time{}
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return time.Time{}
		}
		if key == "created" {
			var at time.Time
			if dec.Decode(&at) != nil {
				return time.Time{}
			}
			return at
		}
		var skip json.RawMessage // a member before it: ids, the parties
		if dec.Decode(&skip) != nil {
			return time.Time{}
		}
	}
	return time.Time{}
}
