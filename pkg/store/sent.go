package store

import (
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Sent bytes: a large message this host published to another host keeps
// the bytes it was signed as (its envelope, as published) beside its
// outbound record until the record settles. A refusal notice too big to
// quote them carries their digest only (gateway/refusals.go); these bytes
// are what the sender matches it against, and become its dead letter (so
// fleet-dlq replay works). Small messages keep nothing: their notice
// quotes them whole.

var bSent = []byte("sent") // msg id -> the envelope as published

// RecordOutboundKeep is RecordOutboundStart, keeping raw (the envelope as
// published; nil: nothing) with the record until it settles.
func (s *Store) RecordOutboundKeep(env *envelope.Envelope, now time.Time, raw []byte) (wait func() error) {
	return s.start(&op{fn: func(tx *wtx) error {
		if tx.Bucket(bRecords).Get([]byte(env.MsgID)) != nil {
			return nil // a retransmit: the record (maybe settled) stays
		}
		if raw != nil {
			b, err := tx.CreateBucketIfNotExists(bSent)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(env.MsgID), raw); err != nil {
				return err
			}
		}
		return save(tx.Bucket(bRecords), env.MsgID, &Record{
			MsgID: env.MsgID, Kind: env.Kind, TraceID: env.TraceID,
			Sender: env.Sender.Gid, Recipient: env.Recipient.Gid, Named: named(env.Recipient),
			State: Accepted, Accepted: now, Hops: env.Hops,
		})
	}})
}

// Sent returns the bytes kept for msgID (RecordOutboundKeep), or nil.
func (s *Store) Sent(msgID string) []byte {
	var out []byte
	_ = s.view(func(tx *wtx) error {
		if b := tx.Bucket(bSent); b != nil {
			out = append([]byte(nil), b.Get([]byte(msgID))...)
		}
		return nil
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// dropSent forgets the bytes kept for msgID, if any.
func dropSent(tx *wtx, msgID string) error {
	if b := tx.Bucket(bSent); b != nil {
		return b.Delete([]byte(msgID))
	}
	return nil
}

// pruneSent forgets kept bytes whose record settled or is gone (a settle
// drops them as it happens; this catches what a crash or an older build
// left).
func (s *Store) pruneSent() (int, error) {
	return s.pruneBucket(bSent, func(tx *wtx, k, _ []byte) bool {
		var r Record
		if err := load(tx.Bucket(bRecords), string(k), &r); err != nil {
			return true
		}
		return r.State != Accepted && r.State != Unknown
	})
}
