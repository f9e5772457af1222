package store

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
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
