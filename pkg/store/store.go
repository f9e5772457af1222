// Package store is the host's durable embedded store (bbolt): the entity
// registry, every local inbox in FIFO order, one delivery record per msg id
// (which is also the dedup window), the in-flight markers that make a crash
// during injection visible, and the dead letters.
//
// Every operation runs in one goroutine, the committer (commit.go), against
// an open bbolt transaction; concurrent callers' changes are made durable
// together by one append to a write-ahead log (wal.go), so throughput does
// not collapse to one flush per message, and no caller hears "done" before
// its change is on disk. bbolt is brought up to date from time to time (a
// checkpoint), and after a crash the log is replayed into it.
//
// What the log pays beside bbolt's own group commit (db.Batch), in the same
// runs of scripts/bench-libs.sh (BenchmarkLibCommit: 8 writers, a 512-byte
// message's inbox put and delivery record each; 2026-12-02, a busy 2-core
// VM): db.Batch at its best for that load (MaxBatchSize 8) took 1.38-1.71x
// the log's time per durable message (medians of three sets of 5-9 runs),
// with its defaults (a 10 ms MaxBatchDelay) 8x.
package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
)

// Buckets. Inboxes are nested: inbox/<gid>/<seq> -> envelope JSON.
var (
	bEntities = []byte("entities") // gid -> Entity JSON
	bNames    = []byte("names")    // name -> gid
	bInbox    = []byte("inbox")    // gid -> bucket of seq -> envelope JSON
	bRecords  = []byte("records")  // msg id -> Record JSON (the dedup window)
	bInflight = []byte("inflight") // msg id -> nil while an injection runs
	bDead     = []byte("dead")     // msg id -> DeadLetter JSON
	bMeta     = []byte("meta")     // schema, host
	// gid -> bucket of in_reply_to+seq -> seq: the REPLYs waiting in each
	// inbox by the msg id they answer (ReplyTo), kept with every put and
	// delete of one
	bReplies = []byte("replies")
)

// Delivery states. A record only moves forward: accepted -> delivered|dead.
// An outbound message whose broker confirm was lost is unknown until a
// receipt settles it (unknown -> delivered|dead) or a retry under its msg id
// is confirmed (unknown -> accepted).
const (
	Accepted  = "accepted"
	Unknown   = "unknown"
	Delivered = "delivered"
	Dead      = "dead"
)

// ErrNotFound is returned for an unknown entity or message.
var ErrNotFound = errors.New("not found")

// ErrNameTaken is returned when registering a name already in use.
var ErrNameTaken = errors.New("name already registered")

// Entity is one registered local entity.
type Entity struct {
	Gid        string   `json:"gid"`
	Name       string   `json:"name"`
	Host       string   `json:"host"`
	Mode       string   `json:"mode"` // pull | inject
	TmuxTarget string   `json:"tmux_target,omitempty"`
	Exec       string   `json:"exec,omitempty"`
	Nudge      string   `json:"nudge,omitempty"`
	Groups     []string `json:"groups,omitempty"`
	TokenHash  string   `json:"token_hash"`
	// tmux inject: the agent in the pane (pkg/gateway/agent.go)
	PaneID     string `json:"pane_id,omitempty"`     // %N, read at join
	PanePID    int    `json:"pane_pid,omitempty"`    // the pane's first process: a hook is the agent's if it descends from it
	Program    string `json:"program,omitempty"`     // the foreground program a paste needs; "" until the agent's first hook
	Turns      string `json:"turns,omitempty"`       // hooks (default): busy and idle come from the agent's hooks; none: a program without turns
	Paste      string `json:"paste,omitempty"`       // auto (default), line or bracketed (deliver.Tmux)
	Header     string `json:"header,omitempty"`      // before (default), after or off
	IdleScreen int64  `json:"idle_screen,omitempty"` // ms: a stuck agent whose screen is unchanged this long is idle (0: never)
	// the agent's own process, as its hook proved it (the process below
	// the pane's first one) and when it started: the program in front
	// must be that process, not only a program of the same name
	AgentPID   int    `json:"agent_pid,omitempty"`
	AgentStart uint64 `json:"agent_start,omitempty"`
	// Follows: a pull entity read by a follower (fleet-recv --follow, no
	// --max), set when one opens and cleared by a plain drain: after a
	// restart of the gateway, one must come back (pkg/gateway/follow.go)
	Follows bool `json:"follows,omitempty"`
	// Status is idle or busy (from the agent's hooks or a paste), or one
	// of the safety net's: starting, stuck, detached, unhooked.
	Status       string    `json:"status"`
	StatusReason string    `json:"status_reason,omitempty"`
	StatusAt     time.Time `json:"status_at"`
	HookAt       time.Time `json:"hook_at,omitzero"` // the agent's last hook
	Created      time.Time `json:"created"`
	LastDelivery time.Time `json:"last_delivery,omitzero"`
}

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
}

// DeadLetter is a message that will not be delivered, with why. It is
// kept until PruneDead forgets it (dead-retention, prune.go).
type DeadLetter struct {
	Record   Record          `json:"record"`
	Envelope json.RawMessage `json:"envelope"`
}

// Key is the record key of a message: its msg id, or for a broadcast copy
// the msg id and the member's gid (one publish, one record per member).
func Key(env *envelope.Envelope) string {
	if env.Recipient.Group != "" {
		return env.MsgID + "/" + env.Recipient.Gid
	}
	return env.MsgID
}

// Item is one message at the head of an inbox.
type Item struct {
	Seq uint64
	Env *envelope.Envelope
}

func u64(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}

// load reads the value at key into v: a delivery record in its binary
// form (record.go), anything else as JSON.
func load(b *wbucket, key string, v any) error {
	data := b.Get([]byte(key))
	if data == nil {
		return ErrNotFound
	}
	if r, ok := v.(*Record); ok {
		return decodeRecord(data, r)
	}
	return json.Unmarshal(data, v)
}

// save stores v at key, as load reads it.
func save(b *wbucket, key string, v any) error {
	if r, ok := v.(*Record); ok {
		return b.Put([]byte(key), encodeRecord(r))
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// ---- entities ----

// CreateEntity registers a new entity; its name must be free.
func (s *Store) CreateEntity(e *Entity) error {
	return s.update(func(tx *wtx) error {
		names := tx.Bucket(bNames)
		if g := names.Get([]byte(e.Name)); g != nil {
			return fmt.Errorf("%w: %s is %s", ErrNameTaken, e.Name, g)
		}
		if err := names.Put([]byte(e.Name), []byte(e.Gid)); err != nil {
			return err
		}
		if _, err := tx.Bucket(bInbox).CreateBucketIfNotExists([]byte(e.Gid)); err != nil {
			return err
		}
		return save(tx.Bucket(bEntities), e.Gid, e)
	})
}

// UpdateEntity applies fn to the stored entity and saves it.
func (s *Store) UpdateEntity(gid string, fn func(*Entity) error) (*Entity, error) {
	var out Entity
	err := s.update(func(tx *wtx) error {
		var e Entity
		if err := load(tx.Bucket(bEntities), gid, &e); err != nil {
			return err
		}
		if err := fn(&e); err != nil {
			return err
		}
		out = e
		return save(tx.Bucket(bEntities), gid, &e)
	})
	return &out, err
}

// DeleteEntity removes an entity and dead-letters what waits in its inbox
// with the given reason. It returns how many messages were dead-lettered.
func (s *Store) DeleteEntity(gid, reason string) (int, error) {
	var n int
	err := s.update(func(tx *wtx) error {
		n = 0
		var e Entity
		if err := load(tx.Bucket(bEntities), gid, &e); err != nil {
			return err
		}
		if ib := tx.Bucket(bInbox).Bucket([]byte(gid)); ib != nil {
			var ids []string
			err := ib.ForEach(func(_, v []byte) error {
				var env envelope.Envelope
				if err := json.Unmarshal(v, &env); err != nil {
					return err
				}
				ids = append(ids, Key(&env))
				return nil
			})
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := deadTx(tx, id, reason, -1); err != nil && !errors.Is(err, ErrNotFound) {
					return err
				}
			}
			n = len(ids)
			if err := tx.Bucket(bInbox).DeleteBucket([]byte(gid)); err != nil {
				return err
			}
		}
		if rb := tx.Bucket(bReplies); rb != nil && rb.Bucket([]byte(gid)) != nil {
			if err := rb.DeleteBucket([]byte(gid)); err != nil {
				return err
			}
		}
		if err := tx.Bucket(bNames).Delete([]byte(e.Name)); err != nil {
			return err
		}
		return tx.Bucket(bEntities).Delete([]byte(gid))
	})
	return n, err
}

// Entities lists every registered entity, by name.
func (s *Store) Entities() ([]*Entity, error) {
	var out []*Entity
	err := s.view(func(tx *wtx) error {
		return tx.Bucket(bEntities).ForEach(func(_, v []byte) error {
			var e Entity
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, &e)
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// ---- messages ----

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
	seq, err := ib.NextSequence()
	if err != nil {
		return false, err
	}
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
		Seq: seq, State: Accepted, Accepted: now,
	}
	return false, save(recs, Key(env), out)
}

// Head returns up to n messages at the head of gid's inbox with a sequence
// greater than after, oldest first.
func (s *Store) Head(gid string, after uint64, n int) ([]Item, error) {
	return s.head(gid, after, n, false)
}

func (s *Store) head(gid string, after uint64, n int, soon bool) ([]Item, error) {
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
		c := ib.Cursor()
		for k, v := c.Seek(u64(after + 1)); k != nil && len(rows) < n; k, v = c.Next() {
			rows = append(rows, raw{binary.BigEndian.Uint64(k), clone(v)})
		}
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
// inbox, 0 when it is empty. Sequences only grow, so a watcher that
// compares it sees new mail even when as many messages left the inbox
// as arrived since it last looked (a count alone misses that).
func (s *Store) Newest(gid string) uint64 {
	var seq uint64
	_ = s.view(func(tx *wtx) error {
		if ib := tx.Bucket(bInbox).Bucket([]byte(gid)); ib != nil {
			if k, _ := ib.Cursor().Last(); k != nil {
				seq = binary.BigEndian.Uint64(k)
			}
		}
		return nil
	})
	return seq
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

// metaReplies is set once every inbox's reply index is kept.
var metaReplies = []byte("replies")

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
		c := ib.Cursor()
		for k, v := c.First(); k != nil && len(keys) < n; k, v = c.Next() {
			var env envelope.Envelope
			if err := envelope.Unmarshal(v, &env); err != nil {
				return fmt.Errorf("inbox %s seq %d: %w", gid, binary.BigEndian.Uint64(k), err)
			}
			key := Key(&env)
			seqs = append(seqs, clone(k))
			if !all {
				var r Record
				if load(recs, key, &r) != nil || r.State != Accepted || !r.Accepted.Before(cutoff) {
					break
				}
				if tx.Bucket(bInflight).Get([]byte(key)) != nil || (held != nil && held(key)) {
					break
				}
			}
			keys = append(keys, key)
			out = append(out, &env)
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

// bReplays remembers each dead letter replayed (fleet-dlq replay): its msg
// id and its sender's host ("msgid/host") -> the new envelope, as first
// made. A second replay sends that same envelope again, which the
// recipient's dedup by msg id drops: a dead letter is never delivered
// twice. A bridge.dlq copy that another host signed with the same msg id
// is that host's dead letter, never this one. Made before the host was
// in the key, an entry is the msg id alone: it counts for the host its
// envelope's sender names. Created on first use.
var bReplays = []byte("replays")

// bReplayed is the recipient's side of replays: the dead letter (its
// msg id and its sender's host) and the recipient gid -> the key of the
// first replay taken in (ReplayedKey). Created on first use.
var bReplayed = []byte("replayed")

// ReplayedKey names the dead letter a replay delivers again, for one
// recipient: its msg id, its recipient's gid and the host of its sender.
// A replay keeps the original's sender, and a message from another host
// is admitted only when its sender's host signed it, so the host in the
// key is the host that signed the replay (or, for a replay made here from
// bridge.dlq, the one whose signature proved the copy). A msg id is only
// what a host says it is: another host naming it in replay_of names a
// dead letter of its own, which never stands in for the real one's
// replay.
func ReplayedKey(env *envelope.Envelope) string {
	return env.ReplayOf + "/" + env.Recipient.Gid + "/" + env.Sender.Host
}

// legacyReplayed is the first replay of env's dead letter taken in
// before replays were keyed by their sender's host (msg id/recipient
// only): it counts when its record shows the same sender's host, and is
// nil otherwise (a record no longer kept proves nothing).
func legacyReplayed(rb, recs *wbucket, env *envelope.Envelope) []byte {
	first := rb.Get([]byte(env.ReplayOf + "/" + env.Recipient.Gid))
	if first == nil {
		return nil
	}
	var r Record
	if err := load(recs, string(first), &r); err != nil || ident.GidHost(r.Sender) != env.Sender.Host {
		return nil
	}
	return first
}

// Replay returns the envelope a replay of msgID, sent from host, made,
// or nil.
func (s *Store) Replay(msgID, host string) []byte {
	var out []byte
	_ = s.view(func(tx *wtx) error {
		if b := tx.Bucket(bReplays); b != nil {
			_, v := replayOf(b, msgID, host)
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// PutReplay records that msgID, sent from host, is replayed as raw, unless
// it already is: then it returns what was recorded before.
func (s *Store) PutReplay(msgID, host string, raw []byte) (prev []byte, err error) {
	err = s.update(func(tx *wtx) error {
		b, err := tx.CreateBucketIfNotExists(bReplays)
		if err != nil {
			return err
		}
		if _, v := replayOf(b, msgID, host); v != nil {
			prev = append([]byte(nil), v...)
			return nil
		}
		return b.Put([]byte(msgID+"/"+host), raw)
	})
	return prev, err
}

// DropReplay forgets a replay that did not happen (its recipient is gone).
func (s *Store) DropReplay(msgID, host string) error {
	return s.update(func(tx *wtx) error {
		if b := tx.Bucket(bReplays); b != nil {
			if k, v := replayOf(b, msgID, host); v != nil {
				return b.Delete(k)
			}
		}
		return nil
	})
}

// replayOf finds the replay of msgID sent from host: its key and value,
// or nil.
func replayOf(b *wbucket, msgID, host string) (key, v []byte) {
	key = []byte(msgID + "/" + host)
	if v = b.Get(key); v != nil {
		return key, v
	}
	key = []byte(msgID) // before the host was in the key
	if v = b.Get(key); v != nil {
		var env envelope.Envelope
		if envelope.Unmarshal(v, &env) == nil && env.Sender.Host == host {
			return key, v
		}
	}
	return nil, nil
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

// Meta returns a metadata value ("" if unset).
func (s *Store) Meta(key string) string {
	var v string
	_ = s.view(func(tx *wtx) error {
		v = string(tx.Bucket(bMeta).Get([]byte(key)))
		return nil
	})
	return v
}

// SetMeta stores a metadata value.
func (s *Store) SetMeta(key, value string) error {
	return s.update(func(tx *wtx) error { return tx.Bucket(bMeta).Put([]byte(key), []byte(value)) })
}

// RecordOutbound records a message this host sent to another host through
// the broker, once the broker confirmed it: the sender can look up its
// state, and a reply to it finds its trace.
func (s *Store) RecordOutbound(env *envelope.Envelope, now time.Time) error {
	return s.RecordOutboundStart(env, now)()
}

// named is p as NAME@HOST ("" when its name or host is not known).
func named(p envelope.Party) string {
	if p.Name == "" || p.Host == "" || p.Group != "" {
		return ""
	}
	return p.Name + "@" + p.Host
}

// RecordOutboundStart is RecordOutbound in two halves, so the caller can
// publish while the record goes to disk: the record is queued before it
// returns — a later operation (the receipt's SettleOutbound) finds it —
// and wait returns once it is on disk.
func (s *Store) RecordOutboundStart(env *envelope.Envelope, now time.Time) (wait func() error) {
	return s.RecordOutboundKeep(env, now, nil)
}

// MarkOutbound moves an outbound record between accepted and unknown (a
// lost confirm; a retry confirmed): a settled record stays as it is. It
// returns the record after.
func (s *Store) MarkOutbound(msgID, state string) (*Record, error) {
	if state != Accepted && state != Unknown {
		return nil, fmt.Errorf("MarkOutbound: %q is not accepted or unknown", state)
	}
	var r Record
	err := s.update(func(tx *wtx) error {
		b := tx.Bucket(bRecords)
		if err := load(b, msgID, &r); err != nil {
			return err
		}
		if r.State != Accepted && r.State != Unknown || r.State == state {
			return nil
		}
		r.State = state
		return save(b, msgID, &r)
	})
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// ForgetRecord drops the record of a message that was never sent.
func (s *Store) ForgetRecord(msgID string) error {
	return s.update(func(tx *wtx) error {
		if err := dropSent(tx, msgID); err != nil {
			return err
		}
		return tx.Bucket(bRecords).Delete([]byte(msgID))
	})
}

// DeadOutbound dead-letters a message that no inbox took for good: the
// remote inbox was full (the broker refused it), or the local one was
// (inbox-max-length). It is recorded under its record key (Key), so a
// broadcast copy refused for one member is that member's.
func (s *Store) DeadOutbound(env *envelope.Envelope, reason string, now time.Time) error {
	raw, err := envelope.Encode(env)
	if err != nil {
		return err
	}
	key := Key(env)
	return s.update(func(tx *wtx) error {
		r := Record{
			MsgID: env.MsgID, Kind: env.Kind, TraceID: env.TraceID,
			Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Named: named(env.Recipient),
			State: Dead, Reason: reason, Accepted: now, Done: now,
		}
		if err := save(tx.Bucket(bDead), key, &DeadLetter{Record: r, Envelope: raw}); err != nil {
			return err
		}
		return save(tx.Bucket(bRecords), key, &r)
	})
}

// KillOutbound records that a message this host sent died elsewhere (in a
// broker inbox): its outbound record goes from accepted (or unknown) to dead with
// reason, and raw (the envelope as sent) is kept as a dead letter here, so
// the sender's host lists it. dead is false when the record had already
// settled (a receipt, or this death told before) or is unknown.
func (s *Store) KillOutbound(msgID string, raw []byte, reason string, at time.Time) (dead bool, err error) {
	err = s.update(func(tx *wtx) error {
		var r Record
		if err := load(tx.Bucket(bRecords), msgID, &r); err != nil {
			if errors.Is(err, ErrNotFound) {
				return nil
			}
			return err
		}
		if r.State != Accepted && r.State != Unknown { // unknown: a confirm lost, as SettleOutboundAll
			return nil
		}
		r.State, r.Reason, r.Done = Dead, reason, at
		if err := save(tx.Bucket(bDead), msgID, &DeadLetter{Record: r, Envelope: raw}); err != nil {
			return err
		}
		if err := dropSent(tx, msgID); err != nil {
			return err
		}
		dead = true
		return save(tx.Bucket(bRecords), msgID, &r)
	})
	return dead, err
}

// SettleOutbound moves an outbound record forward on a receipt from the
// recipient's host: accepted -> delivered|dead, never back.
func (s *Store) SettleOutbound(msgID, state, reason string, attempts int, at time.Time) (*Record, error) {
	recs, errs := s.SettleOutboundAll([]Settle{{MsgID: msgID, State: state, Reason: reason, Attempts: attempts, At: at}})
	return recs[0], errs[0]
}

// Settle is one outbound message's outcome on another host (a receipt).
type Settle struct {
	MsgID    string
	State    string
	Reason   string
	Attempts int
	At       time.Time
}

// SettleOutboundAll is SettleOutbound for several messages in one store
// operation (one flush): each one's record after, or its error (a message
// this store does not know). An error writing the store is every one's.
func (s *Store) SettleOutboundAll(settles []Settle) ([]*Record, []error) {
	recs := make([]*Record, len(settles))
	errs := make([]error, len(settles))
	err := s.update(func(tx *wtx) error {
		b := tx.Bucket(bRecords)
		for i, st := range settles {
			var r Record
			recs[i], errs[i] = nil, nil
			if err := load(b, st.MsgID, &r); err != nil {
				errs[i] = err
				continue
			}
			if (r.State == Accepted || r.State == Unknown) && (st.State == Delivered || st.State == Dead) {
				r.State, r.Reason, r.Attempts, r.Done = st.State, st.Reason, st.Attempts, st.At
				if err := save(b, st.MsgID, &r); err != nil {
					return err
				}
				if err := dropSent(tx, st.MsgID); err != nil {
					return err
				}
			}
			recs[i] = &r
		}
		return nil
	})
	if err != nil {
		for i := range errs {
			recs[i], errs[i] = nil, err
		}
	}
	return recs, errs
}

// ---- control requests (fleet-spawn, fleet-stop) ----
//
// A SPAWN or STOP is carried out at most once per request id, however often
// it is delivered: the control bucket remembers each request id handled on
// this host, and its answer, for the dedup window. The launched bucket
// keeps how a spawned entity's process was started, so fleet-stop can stop
// it after a gateway restart too. Both buckets are created on first use.

var (
	bControl  = []byte("control")  // request id -> Control JSON
	bLaunched = []byte("launched") // gid -> launcher info JSON (opaque here)
)

// Control request states: running from the moment it is claimed, done once
// its answer is recorded. A request found running by a later delivery was
// cut short by a crash: what it did is unknown.
const (
	ControlRunning = "running"
	ControlDone    = "done"
)

// Control is one control request handled on this host.
type Control struct {
	RequestID string          `json:"request_id"`
	Kind      envelope.Kind   `json:"kind"`
	Subject   string          `json:"subject"` // what it acts on (a name, a gid): a reused id is told apart
	State     string          `json:"state"`
	Result    json.RawMessage `json:"result,omitempty"` // the answer, as sent
	Started   time.Time       `json:"started"`
	Done      time.Time       `json:"done,omitzero"`
}

// BeginControl claims request id for handling. A new id is recorded as
// running, durably, and BeginControl returns nil: go ahead. A known id is
// left as it is and returned: it was handled (or cut short) before and must
// not be carried out again.
func (s *Store) BeginControl(id string, kind envelope.Kind, subject string, now time.Time) (*Control, error) {
	var prev *Control
	err := s.update(func(tx *wtx) error {
		prev = nil
		b, err := tx.CreateBucketIfNotExists(bControl)
		if err != nil {
			return err
		}
		var c Control
		switch err := load(b, id, &c); {
		case err == nil:
			prev = &c
			return nil
		case !errors.Is(err, ErrNotFound):
			return err
		}
		return save(b, id, &Control{RequestID: id, Kind: kind, Subject: subject, State: ControlRunning, Started: now})
	})
	return prev, err
}

// EndControl records the answer of request id: from now on every delivery
// of it gets this answer.
func (s *Store) EndControl(id string, result []byte, now time.Time) error {
	return s.update(func(tx *wtx) error {
		b, err := tx.CreateBucketIfNotExists(bControl)
		if err != nil {
			return err
		}
		var c Control
		if err := load(b, id, &c); err != nil {
			return err
		}
		c.State, c.Result, c.Done = ControlDone, append(json.RawMessage(nil), result...), now
		return save(b, id, &c)
	})
}

// ForgetControl drops request id: it had no effect (it failed cleanly), so
// a later delivery may carry it out anew.
func (s *Store) ForgetControl(id string) error {
	return s.update(func(tx *wtx) error {
		if b := tx.Bucket(bControl); b != nil {
			return b.Delete([]byte(id))
		}
		return nil
	})
}

// ControlRequest returns the record of request id.
func (s *Store) ControlRequest(id string) (*Control, error) {
	var c Control
	err := s.view(func(tx *wtx) error {
		b := tx.Bucket(bControl)
		if b == nil {
			return ErrNotFound
		}
		return load(b, id, &c)
	})
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// PutLaunched records how the process of spawned entity gid was started.
func (s *Store) PutLaunched(gid string, info []byte) error {
	return s.update(func(tx *wtx) error {
		b, err := tx.CreateBucketIfNotExists(bLaunched)
		if err != nil {
			return err
		}
		return b.Put([]byte(gid), append([]byte(nil), info...))
	})
}

// Launched returns what PutLaunched recorded for gid (ErrNotFound for an
// entity that was not spawned, but joined).
func (s *Store) Launched(gid string) ([]byte, error) {
	var out []byte
	err := s.view(func(tx *wtx) error {
		if b := tx.Bucket(bLaunched); b != nil {
			out = append([]byte(nil), b.Get([]byte(gid))...)
		}
		if out == nil {
			return ErrNotFound
		}
		return nil
	})
	return out, err
}

// DeleteLaunched forgets how gid was started.
func (s *Store) DeleteLaunched(gid string) error {
	return s.update(func(tx *wtx) error {
		if b := tx.Bucket(bLaunched); b != nil {
			return b.Delete([]byte(gid))
		}
		return nil
	})
}

// PaneTarget is how tmux is told which pane: its id once known.
func (e *Entity) PaneTarget() string {
	if e.PaneID != "" {
		return e.PaneID
	}
	return e.TmuxTarget
}
