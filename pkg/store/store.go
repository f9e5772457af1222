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

	"github.com/fleetd/fleet/pkg/envelope"
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
	// Accept is who may reach it (pkg/accept patterns) when OwnAccept:
	// its own policy, empty for "nobody"; else the host's accept-default
	Accept    []string `json:"accept,omitempty"`
	OwnAccept bool     `json:"own_accept,omitempty"`
	// tmux inject: the agent in the pane (pkg/gateway/agent.go)
	PaneID     string `json:"pane_id,omitempty"`     // %N, read at join
	PanePID    int    `json:"pane_pid,omitempty"`    // the pane's first process: a hook is the agent's if it descends from it
	Program    string `json:"program,omitempty"`     // the foreground program a paste needs; "" until the agent's first hook
	Turns      string `json:"turns,omitempty"`       // hooks (default): busy and idle come from the agent's hooks; none: a program without turns
	Paste      string `json:"paste,omitempty"`       // auto (default), line or bracketed (deliver.Tmux)
	Header     string `json:"header,omitempty"`      // before (default), after or off
	IdleScreen int64  `json:"idle_screen,omitempty"` // ms: a stuck agent whose screen is unchanged this long is idle (0: never)
	// InterruptOnUrgent is the agent CLI whose own interrupt is pressed
	// when urgent mail waits while it is in a turn ("": never; only a CLI
	// measured safe: pkg/gateway/urgent.go)
	InterruptOnUrgent string `json:"interrupt_on_urgent,omitempty"`
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

// metaReplies is set once every inbox's reply index is kept.
var metaReplies = []byte("replies")

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

// PaneTarget is how tmux is told which pane: its id once known.
func (e *Entity) PaneTarget() string {
	if e.PaneID != "" {
		return e.PaneID
	}
	return e.TmuxTarget
}
