package store

import (
	"encoding/json"
	"time"
)

// bHeard keeps the last word this gateway heard on every remote entity,
// so that a name resolves to the gid it last had across a restart of this
// gateway, and while its host is stopped or silent (gateway/peers.go).
// gid -> Heard JSON. Created on first use.
var bHeard = []byte("heard")

// Heard is what is kept of one remote entity: who and where.
type Heard struct {
	Gid    string    `json:"gid"`
	Name   string    `json:"name"`
	Host   string    `json:"host"`
	Mode   string    `json:"mode"`
	Groups []string  `json:"groups,omitempty"`
	Seen   time.Time `json:"seen,omitzero"` // when its host last spoke of it, as saved
}

// Heard returns every remote entity kept.
func (s *Store) Heard() ([]Heard, error) {
	var out []Heard
	err := s.view(func(tx *wtx) error {
		b := tx.Bucket(bHeard)
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			var h Heard
			if err := json.Unmarshal(v, &h); err != nil {
				return err
			}
			out = append(out, h)
			return nil
		})
	})
	return out, err
}

// SaveHeard stores put and forgets drop, in one transaction.
func (s *Store) SaveHeard(put []Heard, drop []string) error {
	if len(put) == 0 && len(drop) == 0 {
		return nil
	}
	return s.update(func(tx *wtx) error {
		b, err := tx.CreateBucketIfNotExists(bHeard)
		if err != nil {
			return err
		}
		for i := range put {
			if err := save(b, put[i].Gid, &put[i]); err != nil {
				return err
			}
		}
		for _, gid := range drop {
			if err := b.Delete([]byte(gid)); err != nil {
				return err
			}
		}
		return nil
	})
}
