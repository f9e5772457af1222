package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Accept stores env in its recipient's inbox and records it as accepted,
// durably, unless its msg id is already known: then it returns the existing
// record and dup=true and stores nothing. This is the dedup check for every
// path that brings a message in.
func (s *Store) Accept(env *envelope.Envelope, now time.Time) (rec *Record, dup bool, err error) {
	recs, dups, err := s.AcceptBatch([]*envelope.Envelope{env}, now)
	if err != nil {
		return nil, false, err
	}
	return recs[0], dups[0], nil
}

// AcceptBatch is Accept for several messages, in order, in one operation
// (so one log record and one flush): all are stored (or found to be
// duplicates, dups[i]), or, with an error, none is.
func (s *Store) AcceptBatch(envs []*envelope.Envelope, now time.Time) (recs []*Record, dups []bool, err error) {
	raws := make([][]byte, len(envs))
	for i, env := range envs {
		if raws[i], err = envelope.Encode(env); err != nil {
			return nil, nil, err
		}
	}
	recs, dups = make([]*Record, len(envs)), make([]bool, len(envs))
	err = s.update(func(tx *wtx) error {
		for i, env := range envs {
			recs[i] = &Record{}
			var err error
			if dups[i], err = acceptTx(tx, env, raws[i], now, recs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return recs, dups, nil
}

// acceptTx stores one message (raw, its encoding) unless its msg id is
// known (dup: out is the existing record).
func acceptTx(tx *wtx, env *envelope.Envelope, raw []byte, now time.Time, out *Record) (dup bool, err error) {
	recs := tx.Bucket(bRecords)
	if err := load(recs, Key(env), out); err == nil {
		return true, nil
	}
	if env.ReplayOf != "" {
		// one replay of a dead letter per recipient, whichever host
		// replayed it (its sender's, or this one from bridge.dlq)
		rb, err := tx.CreateBucketIfNotExists(bReplayed)
		if err != nil {
			return false, err
		}
		k := []byte(ReplayedKey(env))
		first := rb.Get(k)
		if first == nil {
			first = legacyReplayed(rb, recs, env)
		}
		if first != nil {
			if err := load(recs, string(first), out); err != nil {
				*out = Record{MsgID: string(first), State: Accepted}
			}
			return true, nil
		}
		if err := rb.Put(k, []byte(Key(env))); err != nil {
			return false, err
		}
	}
	ib := tx.Bucket(bInbox).Bucket([]byte(env.Recipient.Gid))
	if ib == nil {
		return false, ErrNotFound
	}
	next, err := ib.NextSequence()
	if err != nil {
		return false, err
	}
	seq := laneKey(next, env.Urgent) // lanes.go
	if err := ib.Put(u64(seq), raw); err != nil {
		return false, err
	}
	if env.Kind == envelope.Reply {
		if err := indexReply(tx, env.Recipient.Gid, env.InReplyTo, seq); err != nil {
			return false, err
		}
	}
	*out = Record{
		MsgID: env.MsgID, Kind: env.Kind, TraceID: env.TraceID,
		Sender: env.Sender.Gid, Recipient: env.Recipient.Gid,
		Seq: seq, State: Accepted, Accepted: now, Hops: env.Hops,
	}
	return false, save(recs, Key(env), out)
}

// Head returns up to n messages at the head of gid's inbox after the
// one at sequence after (0: from the head), in inbox order: urgent mail,
// oldest first, then normal mail, oldest first (lanes.go).
func (s *Store) Head(gid string, after uint64, n int) ([]Item, error) {
	return s.head(gid, afterKey(after), n, false)
}

// HeadAfter is Head from a position kept per lane: a reader paging
// through the inbox sees urgent mail that came since its last page first.
func (s *Store) HeadAfter(gid string, after After, n int) ([]Item, error) {
	return s.head(gid, after, n, false)
}

func (s *Store) head(gid string, after After, n int, soon bool) ([]Item, error) {
	type raw struct {
		seq uint64
		v   []byte
	}
	var rows []raw
	err := s.queue(&op{read: true, soon: soon, fn: func(tx *wtx) error {
		ib := tx.Bucket(bInbox).Bucket([]byte(gid))
		if ib == nil {
			return ErrNotFound
		}
		walk(ib.Cursor(), after, func() bool { return len(rows) >= n }, func(seq uint64, v []byte) bool {
			rows = append(rows, raw{seq, clone(v)})
			return true
		})
		return nil
	}})
	if err != nil {
		return nil, err
	}
	// decoded here, by the caller, not in the committer every caller waits on
	out := make([]Item, 0, len(rows))
	for _, r := range rows {
		var env envelope.Envelope
		if err := envelope.Unmarshal(r.v, &env); err != nil {
			return out, fmt.Errorf("inbox %s seq %d: %w", gid, r.seq, err)
		}
		out = append(out, Item{Seq: r.seq, Env: &env})
	}
	return out, nil
}

// HasPending reports whether anything waits in gid's inbox, without
// counting (Pending walks the whole bucket).
func (s *Store) HasPending(gid string) bool {
	has := false
	_ = s.view(func(tx *wtx) error {
		if ib := tx.Bucket(bInbox).Bucket([]byte(gid)); ib != nil {
			k, _ := ib.Cursor().First()
			has = k != nil
		}
		return nil
	})
	return has
}

// Newest returns the sequence of the newest message waiting in gid's
// inbox, whichever its lane (without the lane's bit), 0 when it is empty.
// Sequences only grow, so a watcher that compares it sees new mail even
// when as many messages left the inbox as arrived since it last looked
// (a count alone misses that).
func (s *Store) Newest(gid string) uint64 {
	var seq uint64
	_ = s.view(func(tx *wtx) error {
		if ib := tx.Bucket(bInbox).Bucket([]byte(gid)); ib != nil {
			c := ib.Cursor()
			last, _ := c.Last() // the urgent lane's newest, if it has any
			if last == nil {
				return nil
			}
			seq = binary.BigEndian.Uint64(last) &^ urgentBit
			if Urgent(binary.BigEndian.Uint64(last)) { // and the normal lane's: the key before the urgent lane
				c.Seek(u64(urgentBit))
				if k, _ := c.Prev(); k != nil {
					seq = max(seq, binary.BigEndian.Uint64(k))
				}
			}
		}
		return nil
	})
	return seq
}

// At returns the message at sequence seq of gid's inbox (an Item's or a
// Record's), or nil when it is not there (any more).
func (s *Store) At(gid string, seq uint64) (*envelope.Envelope, error) {
	var raw []byte
	err := s.view(func(tx *wtx) error {
		if ib := tx.Bucket(bInbox).Bucket([]byte(gid)); ib != nil {
			raw = clone(ib.Get(u64(seq)))
		}
		return nil
	})
	if err != nil || raw == nil {
		return nil, err
	}
	var env envelope.Envelope
	if err := envelope.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("inbox %s seq %d: %w", gid, seq, err)
	}
	return &env, nil
}

// Pending returns how many messages wait in gid's inbox. The committer
// counts an inbox once (a walk) and from then on keeps the count with
// every put and delete, so a long inbox costs its walk once, not at every
// roster row and heartbeat.
func (s *Store) Pending(gid string) int {
	n := 0
	_ = s.view(func(tx *wtx) error {
		if c, ok := tx.counts[gid]; ok {
			n = c
			return nil
		}
		ib := tx.Bucket(bInbox).Bucket([]byte(gid))
		if ib == nil {
			return nil
		}
		c := ib.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			n++
		}
		tx.counts[gid] = n
		return nil
	})
	return n
}

// PendingAll returns how many messages wait in each local inbox (by gid;
// an empty inbox is absent), in one store operation: what Pending says of
// each, for a roster, a heartbeat or a status of every entity at once.
func (s *Store) PendingAll() map[string]int {
	out := map[string]int{}
	_ = s.view(func(tx *wtx) error {
		inbox := tx.Bucket(bInbox)
		return inbox.b.ForEachBucket(func(gid []byte) error {
			n, ok := tx.counts[string(gid)]
			if !ok {
				c := inbox.b.Bucket(gid).Cursor()
				for k, _ := c.First(); k != nil; k, _ = c.Next() {
					n++
				}
				tx.counts[string(gid)] = n
			}
			if n > 0 {
				out[string(gid)] = n
			}
			return nil
		})
	})
	return out
}

// ReplyTo returns the first REPLY to msgID waiting in gid's inbox (the
// lowest sequence), or nil: one seek in the reply index, whatever the
// inbox holds.
func (s *Store) ReplyTo(gid, msgID string) (*envelope.Envelope, error) {
	if msgID == "" {
		return nil, nil
	}
	var raw []byte
	err := s.view(func(tx *wtx) error {
		rb := tx.Bucket(bReplies)
		if rb == nil {
			return nil
		}
		gb, ib := rb.Bucket([]byte(gid)), tx.Bucket(bInbox).Bucket([]byte(gid))
		if gb == nil || ib == nil {
			return nil
		}
		c := gb.Cursor()
		for k, v := c.Seek([]byte(msgID)); k != nil && len(k) == len(msgID)+8 && string(k[:len(msgID)]) == msgID; k, v = c.Next() {
			if m := ib.Get(v); m != nil {
				raw = clone(m)
				return nil
			}
		}
		return nil
	})
	if err != nil || raw == nil {
		return nil, err
	}
	var env envelope.Envelope
	if err := envelope.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("inbox %s: reply to %s: %w", gid, msgID, err)
	}
	if env.Kind != envelope.Reply || env.InReplyTo != msgID {
		return nil, fmt.Errorf("inbox %s: the reply index names %s for %s", gid, env.MsgID, msgID)
	}
	return &env, nil
}

// replyKey is a reply's key in its inbox's reply index: the msg id it
// answers, then its sequence (several replies to one message sort by it).
func replyKey(inReplyTo string, seq uint64) []byte {
	return append([]byte(inReplyTo), u64(seq)...)
}

// indexReply enters the REPLY at seq in gid's inbox under the msg id it
// answers.
func indexReply(tx *wtx, gid, inReplyTo string, seq uint64) error {
	if inReplyTo == "" {
		return nil
	}
	rb, err := tx.CreateBucketIfNotExists(bReplies)
	if err != nil {
		return err
	}
	gb, err := rb.CreateBucketIfNotExists([]byte(gid))
	if err != nil {
		return err
	}
	return gb.Put(replyKey(inReplyTo, seq), u64(seq))
}

// unindexReply removes the REPLY at seq (raw, its stored envelope) from
// gid's reply index, as it leaves the inbox.
func unindexReply(tx *wtx, gid string, raw []byte, seq uint64) error {
	rb := tx.Bucket(bReplies)
	if rb == nil || raw == nil {
		return nil
	}
	gb := rb.Bucket([]byte(gid))
	if gb == nil {
		return nil
	}
	var env struct {
		InReplyTo string `json:"in_reply_to"`
	}
	if json.Unmarshal(raw, &env) != nil || env.InReplyTo == "" {
		return nil
	}
	return gb.Delete(replyKey(env.InReplyTo, seq))
}

// buildReplyIndex makes the reply index of every inbox afresh, from what
// the inboxes hold: at open, for a store written before the index was
// kept (meta "replies" unset). It runs on the raw transaction the
// checkpoint after recovery commits.
func buildReplyIndex(tx *bolt.Tx) error {
	if tx.Bucket(bReplies) != nil {
		if err := tx.DeleteBucket(bReplies); err != nil {
			return err
		}
	}
	rb, err := tx.CreateBucket(bReplies)
	if err != nil {
		return err
	}
	err = tx.Bucket(bInbox).ForEachBucket(func(gid []byte) error {
		ib := tx.Bucket(bInbox).Bucket(gid)
		var gb *bolt.Bucket
		return ib.ForEach(func(k, v []byte) error {
			var env envelope.Envelope
			if v == nil || envelope.Unmarshal(v, &env) != nil || env.Kind != envelope.Reply || env.InReplyTo == "" {
				return nil
			}
			if gb == nil {
				var err error
				if gb, err = rb.CreateBucketIfNotExists(gid); err != nil {
					return err
				}
			}
			return gb.Put(replyKey(env.InReplyTo, binary.BigEndian.Uint64(k)), clone(k))
		})
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bMeta).Put(metaReplies, []byte("1"))
}
