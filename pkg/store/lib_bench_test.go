package store

import (
	"encoding/binary"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetd/fleet/pkg/envelope"
)

// BenchmarkLibCommit is what the store's write-ahead log (wal.go, commit.go)
// pays for itself against the library's own group commit: 8 writers each
// storing a 512-byte message durably, one after another — "fleet" through
// Store.Accept (its inbox put and delivery record, made durable by one log
// append and fdatasync per group), "library" through bbolt's db.Batch
// with the same two puts (a bbolt commit per batch: its pages and two
// flushes; MaxBatchSize 8, so no batch waits for its delay), opened as
// the store opens bbolt, in the same folder.
// scripts/bench-libs.sh prints the ratio of the two (ns per message).
func BenchmarkLibCommit(b *testing.B) {
	body := strings.Repeat("x", 512)
	b.Run("fleet", func(b *testing.B) {
		s, err := Open(filepath.Join(b.TempDir(), "fleet.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if err := s.CreateEntity(&Entity{Gid: "gid-b", Name: "b", Host: "h1", Mode: "pull", Created: t0}); err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(4) // 8 writers on 2 cores
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				e := envelope.New(envelope.Send, envelope.Party{Gid: "gid-a"}, envelope.Party{Gid: "gid-b"}, body)
				if _, _, err := s.Accept(e, t0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("library", func(b *testing.B) {
		db, err := bolt.Open(filepath.Join(b.TempDir(), "bolt.db"), 0o600, &bolt.Options{
			Timeout: 200 * time.Millisecond, NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
		})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		// at its best for this load: a batch commits as soon as all 8
		// writers are in it, not after MaxBatchDelay (10 ms by default)
		db.MaxBatchSize = 8
		if err := db.Update(func(tx *bolt.Tx) error {
			for _, n := range [][]byte{bInbox, bRecords} {
				if _, err := tx.CreateBucketIfNotExists(n); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		var seq atomic.Uint64
		b.SetParallelism(4)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				e := envelope.New(envelope.Send, envelope.Party{Gid: "gid-a"}, envelope.Party{Gid: "gid-b"}, body)
				raw, err := envelope.Encode(e)
				if err != nil {
					b.Error(err)
					return
				}
				var k [8]byte
				binary.BigEndian.PutUint64(k[:], seq.Add(1))
				rec := encodeRecord(&Record{MsgID: e.MsgID, Kind: e.Kind, Recipient: "gid-b", Seq: seq.Load(), State: Accepted, Accepted: t0})
				if err := db.Batch(func(tx *bolt.Tx) error {
					if tx.Bucket(bRecords).Get([]byte(e.MsgID)) != nil {
						return nil
					}
					if err := tx.Bucket(bInbox).Put(k[:], raw); err != nil {
						return err
					}
					return tx.Bucket(bRecords).Put([]byte(e.MsgID), rec)
				}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
