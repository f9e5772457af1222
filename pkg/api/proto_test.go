package api

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// header returns the 4-byte header of a frame of n bytes.
func header(n uint32) []byte {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], n)
	return h[:]
}

func wantBadFrame(t *testing.T, err error, contains string) {
	t.Helper()
	if err == nil {
		t.Fatal("got no error, want a bad frame")
	}
	if fault.CodeOf(err) != fault.Data || fault.KindOf(err) != fault.KindBadFrame {
		t.Fatalf("error %v: code %d kind %q, want %d %q", err, fault.CodeOf(err), fault.KindOf(err), fault.Data, fault.KindBadFrame)
	}
	if !strings.Contains(err.Error(), contains) {
		t.Fatalf("error %q does not say %q", err, contains)
	}
}

func TestReadFrameRoundTrip(t *testing.T) {
	big := strings.Repeat("ü-é", 700_000) // about 3.5 MB of JSON string: many chunks
	for _, tc := range []struct {
		name string
		req  *SendRequest
	}{
		{"empty-ish", &SendRequest{Head: Head{Op: OpSend}}},
		{"small", &SendRequest{Head: Head{Op: OpSend}, To: "bob", Body: "hi"}},
		{"exactly-one-chunk", &SendRequest{Head: Head{Op: OpSend}, Body: strings.Repeat("x", frameChunk-len(`{"op":"send","body":""}`))}},
		{"large", &SendRequest{Head: Head{Op: OpSend}, To: "bob", Body: big}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tc.req); err != nil {
				t.Fatal(err)
			}
			want := buf.Bytes()[4:]
			for _, rd := range []struct {
				name string
				r    func() io.Reader
			}{
				{"whole", func() io.Reader { return bytes.NewReader(buf.Bytes()) }},
				{"byte-by-byte", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(buf.Bytes())) }},
				{"half-reads", func() io.Reader { return iotest.HalfReader(bytes.NewReader(buf.Bytes())) }},
				{"data-with-eof", func() io.Reader { return iotest.DataErrReader(bytes.NewReader(buf.Bytes())) }},
			} {
				if tc.name == "large" && rd.name == "byte-by-byte" {
					continue // correct, but slow
				}
				data, err := ReadFrame(rd.r(), MaxFrame(1<<20))
				if err != nil {
					t.Fatalf("%s: %v", rd.name, err)
				}
				if !bytes.Equal(data, want) {
					t.Fatalf("%s: read %d bytes, want the %d written", rd.name, len(data), len(want))
				}
				if cap(data) > 2*len(data) && cap(data) > frameChunk {
					t.Errorf("%s: buffer cap %d for a %d-byte frame", rd.name, cap(data), len(data))
				}
				req, err := DecodeRequest(data)
				if sr, ok := req.(*SendRequest); err != nil || !ok || sr.Op != tc.req.Op || sr.Body != tc.req.Body {
					t.Fatalf("%s: decoded %v, %v", rd.name, req, err)
				}
			}
		})
	}
}

func TestReadFrameSequence(t *testing.T) {
	var buf bytes.Buffer
	for _, body := range []string{"one", strings.Repeat("two", 50_000), "three"} {
		WriteFrame(&buf, &SendRequest{Head: Head{Op: OpSend}, Body: body})
	}
	r := iotest.HalfReader(&buf)
	for _, want := range []string{"one", strings.Repeat("two", 50_000), "three"} {
		data, err := ReadFrame(r, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		req, err := DecodeRequest(data)
		sr, ok := req.(*SendRequest)
		if err != nil || !ok || sr.Body != want {
			t.Fatalf("got %#.20v, %v; want %.20q", req, err, want)
		}
	}
	if _, err := ReadFrame(r, 1<<20); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// TestReadFrameClaimCostsNothing: a header that claims a frame just under
// the limit, followed by a few bytes and the end, makes ReadFrame allocate
// about what arrived, not what was claimed.
func TestReadFrameClaimCostsNothing(t *testing.T) {
	const claim = 6 << 20
	input := append(header(claim), []byte(`{"op":"send","body":"`)...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const rounds = 20
	for range rounds {
		_, err := ReadFrame(bytes.NewReader(input), MaxFrame(1<<20))
		wantBadFrame(t, err, "truncated frame")
	}
	runtime.ReadMemStats(&after)
	perRead := (after.TotalAlloc - before.TotalAlloc) / rounds
	if perRead > 2*frameChunk {
		t.Errorf("a truncated %d-byte claim allocated %d bytes per read, want at most %d", claim, perRead, 2*frameChunk)
	}

	// And in allocations: one frame buffer (plus the error).
	allocs := testing.AllocsPerRun(50, func() { ReadFrame(bytes.NewReader(input), MaxFrame(1<<20)) })
	if allocs > 8 {
		t.Errorf("a truncated claim cost %v allocations", allocs)
	}
}

// TestReadFrameGrowsWithData: the buffer of a frame that is cut short is
// bounded by twice what arrived.
func TestReadFrameGrowsWithData(t *testing.T) {
	const claim = 6 << 20
	for _, got := range []int{0, 1, frameChunk - 1, frameChunk + 1, 1 << 20, 3 << 20} {
		r := &capReader{r: io.MultiReader(bytes.NewReader(header(claim)), bytes.NewReader(make([]byte, got)))}
		_, err := ReadFrame(r, MaxFrame(1<<20))
		wantBadFrame(t, err, "truncated frame")
		if limit := max(frameChunk, 2*got); r.maxCap > limit {
			t.Errorf("%d of %d bytes arrived: buffer grew to %d, want at most %d", got, claim, r.maxCap, limit)
		}
	}
}

// capReader records the largest buffer ReadFrame reads into (the capacity
// behind the slice it passes is at least its length).
type capReader struct {
	r      io.Reader
	maxCap int
}

func (c *capReader) Read(p []byte) (int, error) {
	if cap(p) > c.maxCap {
		c.maxCap = cap(p)
	}
	return c.r.Read(p)
}

func TestReadFrameRefusesOverMax(t *testing.T) {
	r := bytes.NewReader(append(header(1<<30), "whatever"...))
	_, err := ReadFrame(r, MaxFrame(1<<20))
	wantBadFrame(t, err, "over the")
	// the limit is inclusive
	exact := append(header(10), "0123456789"...)
	if data, err := ReadFrame(bytes.NewReader(exact), 10); err != nil || string(data) != "0123456789" {
		t.Fatalf("a frame of exactly max bytes: %q, %v", data, err)
	}
	_, err = ReadFrame(bytes.NewReader(append(header(11), "01234567890"...)), 10)
	wantBadFrame(t, err, "over the 10-byte limit")
}

func TestReadFrameRefusesTruncated(t *testing.T) {
	// clean end between frames
	if _, err := ReadFrame(bytes.NewReader(nil), 100); err != io.EOF {
		t.Fatalf("empty input: %v, want io.EOF", err)
	}
	// header cut short
	_, err := ReadFrame(bytes.NewReader([]byte{0, 0}), 100)
	wantBadFrame(t, err, "truncated frame header")
	// body cut short, small and large
	_, err = ReadFrame(bytes.NewReader(append(header(100), `{"op":"ro`...)), 1000)
	wantBadFrame(t, err, "truncated frame: 9 of 100 bytes")
	_, err = ReadFrame(bytes.NewReader(append(header(200_000), make([]byte, 150_000)...)), 1<<20)
	wantBadFrame(t, err, "truncated frame: 150000 of 200000 bytes")
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated body: %v does not wrap io.ErrUnexpectedEOF", err)
	}
}

// A read error mid-frame (a deadline) stays visible through the fault.
func TestReadFrameKeepsReadError(t *testing.T) {
	r := io.MultiReader(bytes.NewReader(append(header(100), "abc"...)), iotest.ErrReader(os.ErrDeadlineExceeded))
	_, err := ReadFrame(r, 1000)
	wantBadFrame(t, err, "truncated frame")
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%v does not wrap the deadline", err)
	}
	r = io.MultiReader(bytes.NewReader([]byte{0}), iotest.ErrReader(os.ErrDeadlineExceeded))
	_, err = ReadFrame(r, 1000)
	wantBadFrame(t, err, "truncated frame header")
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%v does not wrap the deadline", err)
	}
}

// TestAppendEventFrame: an event's frame reads back as the Response
// WriteFrame writes for it, byte for byte once decoded and encoded again.
func TestAppendEventFrame(t *testing.T) {
	ev := &WatchEvent{Time: time.Date(2026, 12, 7, 17, 0, 0, 5, time.UTC), Host: "h1", Event: "accepted", Kind: "SEND",
		MsgID: "m1", Sender: "h1.a", Recipient: "h2.b", Size: 512, Reason: "a \"quoted\" <reason>\n", Body: "text"}
	var want bytes.Buffer
	if err := WriteFrame(&want, &Response{OK: true, Event: ev}); err != nil {
		t.Fatal(err)
	}
	got, err := AppendEventFrame([]byte("x"), ev)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 'x' {
		t.Fatal("AppendEventFrame did not append")
	}
	data, err := ReadFrame(bytes.NewReader(got[1:]), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var r Response
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(&r)
	wantData, _ := ReadFrame(&want, 1<<20)
	if string(again) != string(wantData) {
		t.Fatalf("the event's frame reads back as\n%s\nwant\n%s", again, wantData)
	}
}
