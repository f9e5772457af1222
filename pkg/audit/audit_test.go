package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Every line written before Close is in the file, whole and in JSON, one
// per line, from many writers at once; the text never is; writes after
// Close are dropped, not a panic.
func TestLinesFromManyWritersAllLand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path, "h1", Options{})
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

// The log rotates by size with a bounded number of files while many
// writers write: no line is lost or torn within the files kept, no file
// grows past the limit by more than one write, at most Files rotated files
// exist, and Search finds a trace's lines in every file, oldest first.
func TestRotationKeepsBoundedFilesAndSearchCoversThem(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	const maxSize, files = 8 << 10, 3
	l, err := Open(path, "h1", Options{MaxSize: maxSize, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	trace := envelope.NewID()
	// the trace's first hop, then enough traffic to push it into a
	// rotated file, then its last hop; a search in audit.log alone would
	// find one line
	first := envelope.New(envelope.Send, envelope.Party{Gid: "h1.00000000-0000-4000-8000-000000000001", Name: "alice"},
		envelope.Party{Gid: "h2.00000000-0000-4000-8000-000000000002", Name: "bob"}, "x")
	first.TraceID = trace
	l.Message("published", first, 0, "")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				env := envelope.New(envelope.Send, envelope.Party{Gid: "a"}, envelope.Party{Gid: "b"}, "other")
				l.Message("accepted", env, 0, "")
				if w == 0 && i == 20 {
					// a search while writers rotate under it
					if _, err := l.Search(trace, 10); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	l.Message("confirmed", first, 0, "")
	for i := files + 1; i < files+5; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, i)); err == nil {
			t.Errorf("%s.%d exists: more than %d rotated files", path, i, files)
		}
	}
	if _, err := os.Stat(fmt.Sprintf("%s.%d", path, files)); err != nil {
		t.Fatalf("not rotated %d times (the test writes enough for that): %v", files, err)
	}
	for i := 0; i <= files; i++ {
		name := path
		if i > 0 {
			name = fmt.Sprintf("%s.%d", path, i)
		}
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > maxSize {
			t.Errorf("%s is %d bytes, over the %d limit", name, len(data), maxSize)
		}
		if i > 0 && len(data) < maxSize-512 {
			t.Errorf("%s is %d bytes: rotated before it was full (%d)", name, len(data), maxSize)
		}
		fi, _ := os.Stat(name)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", name, fi.Mode().Perm())
		}
		for _, ln := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
			var got Line
			if err := json.Unmarshal(ln, &got); err != nil {
				t.Fatalf("%s: torn line %q: %v", name, ln, err)
			}
		}
	}

	// 240 lines of ~310 bytes cannot fit in 4 files of 8 KiB: the first
	// hop (published) was rotated out of what is kept, for good. Then a
	// hop that is pushed out of audit.log into a rotated file, and one in
	// audit.log.
	l.Message("taken", first, 0, "")
	for range 40 {
		l.Message("accepted", envelope.New(envelope.Send, envelope.Party{Gid: "a"}, envelope.Party{Gid: "b"}, "other"), 0, "")
	}
	l.Message("drained", first, 0, "")
	found, err := l.Search(trace, 10)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, ln := range found.Lines {
		events = append(events, ln.Event)
		if ln.Entity != "alice" || ln.Host != "h1" || ln.TraceID != trace {
			t.Errorf("line %+v: want entity alice (the party on h1), host h1", ln)
		}
	}
	got := strings.Join(events, ",")
	if got != "confirmed,taken,drained" || found.Truncated {
		t.Fatalf("search found %q (truncated %v), want confirmed,taken,drained in order", got, found.Truncated)
	}
	if data, _ := os.ReadFile(path); bytes.Contains(data, []byte(`"event":"taken"`)) {
		t.Fatal("the taken line is still in audit.log: the search did not have to read a rotated file")
	}

	// the limit: the first lines are kept, and it says so
	found, _ = l.Search(trace, 2)
	if len(found.Lines) != 2 || !found.Truncated {
		t.Fatalf("limit 2: %d lines, truncated %v", len(found.Lines), found.Truncated)
	}
	// another trace id, or a prefix of this one, finds nothing
	if found, _ := l.Search(trace[:20], 10); len(found.Lines) != 0 {
		t.Fatalf("a prefix of the trace id found %d lines", len(found.Lines))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// A log reopened after a restart knows its size: it rotates at the
// limit, not the limit past what was there.
func TestReopenedLogRotatesAtItsLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, bytes.Repeat([]byte("{}\n"), 3000), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, "h1", Options{MaxSize: 8 << 10, Files: 1})
	if err != nil {
		t.Fatal(err)
	}
	l.Write(Line{Event: "joined"})
	l.Close()
	if _, err := os.Stat(path + ".1"); err != nil {
		t.Fatalf("a 9000-byte log was not rotated at its first write: %v", err)
	}
	data, _ := os.ReadFile(path)
	if !bytes.Contains(data, []byte(`"event":"joined"`)) || bytes.Count(data, []byte("\n")) != 1 {
		t.Fatalf("audit.log after rotation: %q", data)
	}
}

// TestLineAsEncodingJSON holds the hand-written line encoding to what
// json.Marshal makes of the same Line, on lines with every field set or
// empty, texts that need escaping, and times in several zones.
func TestLineAsEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	texts := []string{"", "a", "drained", "h1-0192", "<b>&\"quote\"\\", "line\nbreak\ttab\x01", "\u2028é😀", "bad \xff utf8"}
	pick := func() string { return texts[r.Intn(len(texts))] }
	nums := []int{0, 1, 512, -3, 1 << 40}
	zones := []*time.Location{time.UTC, time.FixedZone("x", 3600+1800), time.FixedZone("y", -8*3600)}
	for i := range 5000 {
		line := Line{
			Time: time.Unix(r.Int63n(1<<34), r.Int63n(1e9)).In(zones[r.Intn(len(zones))]),
			Host: pick(), Event: pick(), TraceID: pick(), MsgID: pick(), Kind: pick(), Sender: pick(), Recipient: pick(),
			Size: nums[r.Intn(len(nums))], SHA256: pick(), Attempt: nums[r.Intn(len(nums))], Reason: pick(), Entity: pick(),
		}
		if i == 0 {
			line = Line{Time: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)} // encoding/json refuses it: so does the line
		}
		want, err := json.Marshal(line)
		if err != nil {
			want = nil
		}
		if got := line.appendJSON(nil); string(got) != string(want) {
			t.Fatalf("line %+v:\n got %s\nwant %s", line, got, want)
		}
	}
}
