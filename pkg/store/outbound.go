package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

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
			State: Dead, Reason: reason, Accepted: now, Done: now, Hops: env.Hops,
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
