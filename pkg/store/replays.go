package store

import (
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
)

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
