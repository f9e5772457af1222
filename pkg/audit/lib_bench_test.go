package audit

import (
	"encoding/json"
	"testing"
	"time"
)

// BenchmarkLibLine: an audit line written by hand (internal/jsonw)
// beside json.Marshal of the same Line. scripts/bench-libs.sh prints the
// ratio of the two.
func BenchmarkLibLine(b *testing.B) {
	line := Line{
		Time: time.Now().UTC(), Host: "h1", Event: "delivered", TraceID: "01934a2b-7c3d-7e5f-9a1b-2c3d4e5f6a7b",
		MsgID: "01934a2b-7c3d-7e5f-9a1b-2c3d4e5f6a7c", Kind: "msg", Sender: "alice@h1", Recipient: "bob@h2",
		Size: 512, SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", Attempt: 1,
	}
	b.Run("fleet", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = line.appendJSON(buf[:0])
		}
	})
	b.Run("library", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(line); err != nil {
				b.Fatal(err)
			}
		}
	})
}
