package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Record is the delivery state of one message, keyed by msg id.
type Record struct {
	MsgID     string        `json:"msg_id"`
	Kind      envelope.Kind `json:"kind"`
	TraceID   string        `json:"trace_id"`
	Sender    string        `json:"sender"`    // gid
	Recipient string        `json:"recipient"` // gid
	Seq       uint64        `json:"seq"`
	State     string        `json:"state"`
	Attempts  int           `json:"attempts"`
	Reason    string        `json:"reason,omitempty"`
	Accepted  time.Time     `json:"accepted"`
	Done      time.Time     `json:"done,omitzero"` // delivered or dead

	// Named: an outbound message's recipient as NAME@HOST when it was
	// sent (as this host then knew it), so its record still names it
	// once the entity has left and been forgotten; "" if sent unnamed.
	Named string `json:"named,omitempty"`

	// Hops: the message's hop count in its trace (envelope.Hops), so a
	// reply to it, or a send made while it is delivered, counts one more.
	Hops int `json:"hops,omitempty"`
}

// DeadLetter is a message that will not be delivered, with why. It is
// kept until PruneDead forgets it (dead-retention, prune.go).
type DeadLetter struct {
	Record   Record          `json:"record"`
	Envelope json.RawMessage `json:"envelope"`
}

// Record returns the delivery record of msgID.
func (s *Store) Record(msgID string) (*Record, error) {
	var r Record
	err := s.view(func(tx *wtx) error { return load(tx.Bucket(bRecords), msgID, &r) })
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// BeginInject durably marks msgID as being injected and counts the attempt.
// If the gateway dies before EndInject or Fail, the marker survives and
// Uncertain finds it on the next start.
func (s *Store) BeginInject(msgID string) (attempt int, err error) {
	err = s.update(func(tx *wtx) error {
		var r Record
		if err := load(tx.Bucket(bRecords), msgID, &r); err != nil {
			return err
		}
		if r.State != Accepted {
			return fmt.Errorf("message %s is already %s", msgID, r.State)
		}
		r.Attempts++
		attempt = r.Attempts
		if err := tx.Bucket(bInflight).Put([]byte(msgID), nil); err != nil {
			return err
		}
		return save(tx.Bucket(bRecords), msgID, &r)
	})
	return attempt, err
}

// Failed clears the in-flight marker of a failed attempt and keeps the
// reason; the message stays at the head of its inbox.
func (s *Store) Failed(msgID, reason string) error {
	return s.update(func(tx *wtx) error {
		var r Record
		if err := load(tx.Bucket(bRecords), msgID, &r); err != nil {
			return err
		}
		if err := tx.Bucket(bInflight).Delete([]byte(msgID)); err != nil {
			return err
		}
		if r.State != Accepted {
			return nil // died meanwhile: keep the reason it died with
		}
		r.Reason = reason
		return save(tx.Bucket(bRecords), msgID, &r)
	})
}

// Delivered records msgID as delivered and removes it from its inbox, in one
// transaction: there is no moment where it is recorded but still queued.
func (s *Store) Delivered(msgID string, now time.Time) error {
	return s.update(func(tx *wtx) error {
		gid, err := deliveredTx(tx, msgID, now)
		if err != nil || gid == "" {
			return err
		}
		return touchEntity(tx, gid, now)
	})
}

// deliveredTx records one delivery and returns the recipient's gid ("" if
// it was recorded already).
func deliveredTx(tx *wtx, msgID string, now time.Time) (string, error) {
	var r Record
	if err := load(tx.Bucket(bRecords), msgID, &r); err != nil {
		return "", err
	}
	if r.State == Delivered {
		return "", nil
	}
	if r.State != Accepted {
		return "", fmt.Errorf("message %s is %s, not deliverable", msgID, r.State)
	}
	if ib := tx.Bucket(bInbox).Bucket([]byte(r.Recipient)); ib != nil {
		if r.Kind == envelope.Reply {
			if err := unindexReply(tx, r.Recipient, ib.Get(u64(r.Seq)), r.Seq); err != nil {
				return "", err
			}
		}
		if err := ib.Delete(u64(r.Seq)); err != nil {
			return "", err
		}
	}
	if err := tx.Bucket(bInflight).Delete([]byte(msgID)); err != nil {
		return "", err
	}
	r.State, r.Done, r.Reason = Delivered, now, ""
	if r.Attempts == 0 {
		r.Attempts = 1
	}
	return r.Recipient, save(tx.Bucket(bRecords), msgID, &r)
}

// touchEntity records an entity's last delivery.
func touchEntity(tx *wtx, gid string, now time.Time) error {
	var e Entity
	if load(tx.Bucket(bEntities), gid, &e) != nil {
		return nil
	}
	e.LastDelivery = now
	return save(tx.Bucket(bEntities), gid, &e)
}

// Kill dead-letters msgID with its reason: out of the inbox, into the dead
// letters, state dead. attempts < 0 keeps the recorded count.
func (s *Store) Kill(msgID, reason string, attempts int) error {
	return s.update(func(tx *wtx) error { return deadTx(tx, msgID, reason, attempts) })
}

func deadTx(tx *wtx, msgID, reason string, attempts int) error {
	var r Record
	if err := load(tx.Bucket(bRecords), msgID, &r); err != nil {
		return err
	}
	if r.State != Accepted {
		return nil
	}
	var raw []byte
	if ib := tx.Bucket(bInbox).Bucket([]byte(r.Recipient)); ib != nil {
		raw = append([]byte(nil), ib.Get(u64(r.Seq))...)
		if r.Kind == envelope.Reply {
			if err := unindexReply(tx, r.Recipient, raw, r.Seq); err != nil {
				return err
			}
		}
		if err := ib.Delete(u64(r.Seq)); err != nil {
			return err
		}
	}
	if err := tx.Bucket(bInflight).Delete([]byte(msgID)); err != nil {
		return err
	}
	r.State, r.Reason, r.Done = Dead, reason, time.Now().UTC()
	if attempts >= 0 {
		r.Attempts = attempts
	}
	if err := save(tx.Bucket(bDead), msgID, &DeadLetter{Record: r, Envelope: raw}); err != nil {
		return err
	}
	return save(tx.Bucket(bRecords), msgID, &r)
}

// ExpireHead dead-letters the messages at the head of gid's inbox that
// were accepted before cutoff, with reason, as Kill does, all in one
// operation, and returns them (at most n, in inbox order). It stops at
// the first message accepted since cutoff, and at one being handed over:
// being injected (its in-flight marker), or one held says is (a pull
// batch waiting for its acknowledgement, a reply going to an open send) —
// held runs inside the operation, so nothing hands a message over between
// the check and the death; it must be quick and must not use the store.
func (s *Store) ExpireHead(gid string, cutoff time.Time, reason string, n int, held func(key string) bool) ([]*envelope.Envelope, error) {
	return s.killHead(gid, cutoff, reason, n, held, false)
}

// KillHead dead-letters up to n messages at the head of gid's inbox with
// reason, whatever their age or state of hand-over, in one operation, and
// returns them in inbox order: an inbox emptied a page at a time (an
// entity that leaves), never read whole into memory.
func (s *Store) KillHead(gid, reason string, n int) ([]*envelope.Envelope, error) {
	return s.killHead(gid, time.Time{}, reason, n, nil, true)
}

func (s *Store) killHead(gid string, cutoff time.Time, reason string, n int, held func(key string) bool, all bool) ([]*envelope.Envelope, error) {
	var out []*envelope.Envelope
	err := s.update(func(tx *wtx) error {
		out = out[:0]
		ib := tx.Bucket(bInbox).Bucket([]byte(gid))
		if ib == nil {
			return ErrNotFound
		}
		recs := tx.Bucket(bRecords)
		var keys []string
		var seqs [][]byte
		var bad error
		// in inbox order, urgent lane first (lanes.go); an expiry stops
		// in each lane at its first message that stays
		walk(ib.Cursor(), After{}, func() bool { return len(keys) >= n || bad != nil }, func(seq uint64, v []byte) bool {
			var env envelope.Envelope
			if err := envelope.Unmarshal(v, &env); err != nil {
				bad = fmt.Errorf("inbox %s seq %d: %w", gid, seq, err)
				return false
			}
			key := Key(&env)
			if !all {
				var r Record
				if load(recs, key, &r) != nil || r.State != Accepted || !r.Accepted.Before(cutoff) {
					return false
				}
				if tx.Bucket(bInflight).Get([]byte(key)) != nil || (held != nil && held(key)) {
					return false
				}
			}
			seqs = append(seqs, u64(seq))
			keys = append(keys, key)
			out = append(out, &env)
			return true
		})
		if bad != nil {
			return bad
		}
		for i, k := range keys { // after the walk: a cursor does not survive deletes
			if err := deadTx(tx, k, reason, -1); err != nil && !(all && errors.Is(err, ErrNotFound)) {
				return err
			}
			if all { // out of the inbox even without a record to say so: the next page moves on
				if err := ib.Delete(seqs[i]); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeadLetters lists the dead letters, optionally only those to gid.
func (s *Store) DeadLetters(gid string) ([]*DeadLetter, error) {
	var out []*DeadLetter
	err := s.view(func(tx *wtx) error {
		return tx.Bucket(bDead).ForEach(func(_, v []byte) error {
			var d DeadLetter
			if err := json.Unmarshal(v, &d); err != nil {
				return err
			}
			if gid == "" || d.Record.Recipient == gid {
				out = append(out, &d)
			}
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Record.Done.Before(out[j].Record.Done) })
	return out, err
}

// DeadLetter returns the dead letter of msgID (its record key).
func (s *Store) DeadLetter(msgID string) (*DeadLetter, error) {
	var d DeadLetter
	err := s.view(func(tx *wtx) error {
		v := tx.Bucket(bDead).Get([]byte(msgID))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &d)
	})
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// ForgetDead removes dead letters (fleet-dlq purge, or once replayed);
// their records stay dead. It returns how many there were.
func (s *Store) ForgetDead(msgIDs []string) (int, error) {
	n := 0
	err := s.update(func(tx *wtx) error {
		n = 0
		b := tx.Bucket(bDead)
		for _, id := range msgIDs {
			if b.Get([]byte(id)) == nil {
				continue
			}
			if err := b.Delete([]byte(id)); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// Inflight returns the msg ids whose injection was begun and never ended:
// the gateway died between starting an injection and recording its outcome.
func (s *Store) Inflight() ([]string, error) {
	var out []string
	err := s.view(func(tx *wtx) error {
		return tx.Bucket(bInflight).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// ClearInflight drops the in-flight marker of msgID (re-inject policy).
func (s *Store) ClearInflight(msgID string) error {
	return s.update(func(tx *wtx) error { return tx.Bucket(bInflight).Delete([]byte(msgID)) })
}

// DeliveredAll records several messages as delivered in one transaction
// (a pull client's acknowledgement of a batch).
func (s *Store) DeliveredAll(msgIDs []string, now time.Time) error {
	return s.update(deliveredAll(msgIDs, now))
}

func deliveredAll(msgIDs []string, now time.Time) func(*wtx) error {
	return func(tx *wtx) error {
		touched := map[string]bool{}
		for _, id := range msgIDs {
			gid, err := deliveredTx(tx, id, now)
			if err != nil {
				return err
			}
			if gid != "" {
				touched[gid] = true
			}
		}
		for gid := range touched { // the entity once per batch, not per message
			if err := touchEntity(tx, gid, now); err != nil {
				return err
			}
		}
		return nil
	}
}

// DeadCounts returns the number of dead letters per recipient gid.
func (s *Store) DeadCounts() map[string]int {
	m := map[string]int{}
	_ = s.view(func(tx *wtx) error {
		return tx.Bucket(bDead).ForEach(func(_, v []byte) error {
			var d DeadLetter
			if json.Unmarshal(v, &d) == nil {
				m[d.Record.Recipient]++
			}
			return nil
		})
	})
	return m
}
