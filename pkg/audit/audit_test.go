package audit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Every line written before Close is in the file, whole and in JSON, one
// per line, from many writers at once; the text never is; writes after
// Close are dropped, not a panic.
func TestLinesFromManyWritersAllLand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, "h1")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				env := envelope.New(envelope.Send, envelope.Party{Gid: "a"}, envelope.Party{Gid: "b"}, "secret text")
				if i%2 == 0 {
					l.Message("accepted", env, 0, "")
				} else {
					l.Messages("delivered", []*envelope.Envelope{env, env}, 1, "drained")
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Write(Line{Event: "late"})
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if want := 8 * (100 + 100*2); len(lines) != want {
		t.Fatalf("%d lines, want %d", len(lines), want)
	}
	for _, ln := range lines {
		var got Line
		if err := json.Unmarshal(ln, &got); err != nil || got.TraceID == "" || got.Host != "h1" {
			t.Fatalf("bad line %q: %v", ln, err)
		}
	}
	if strings.Contains(string(data), "secret text") || strings.Contains(string(data), "late") {
		t.Error("the audit log holds message text, or a line written after Close")
	}
}
