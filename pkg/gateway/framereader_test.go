package gateway

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

// unixPair is a connected pair of unix sockets: the gateway's end and the
// client's.
func unixPair(t *testing.T) (srv *net.UnixConn, cli net.Conn) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err = net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, err = ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(); cli.Close() })
	return srv, cli
}

func frame(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

// TestFrameReaderReadsAhead holds the frame reader's read-ahead to plain
// reading: frames that come two in one write, a frame larger than what is
// read ahead, a frame whose header and body come in separate writes, and
// a frame cut into single bytes all read back whole and in order; and
// once a frame is read with nothing after it, no buffer is held.
func TestFrameReaderReadsAhead(t *testing.T) {
	srv, cli := unixPair(t)
	fr := newFrameReader(srv, 10*time.Second)
	big := strings.Repeat("b", 3*aheadSize+17)
	want := []string{"one", "two", big, "split", "bytes, one at a time", "last"}
	cli.Write(append(frame("one"), frame("two")...)) // two in one write
	rest := make(chan bool)
	go func() {
		<-rest
		cli.Write(frame(big))
		f := frame("split")
		cli.Write(f[:4]) // the header alone, then the body
		time.Sleep(10 * time.Millisecond)
		cli.Write(f[4:])
		for _, b := range frame("bytes, one at a time") {
			cli.Write([]byte{b})
		}
		cli.Write(frame("last"))
	}()
	for i, w := range want {
		got, err := api.ReadFrame(fr, 1<<20)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if expired := fr.end(); expired {
			t.Fatalf("frame %d: the frame deadline passed", i)
		}
		if string(got) != w {
			t.Fatalf("frame %d: got %d bytes %.40q, want %d bytes %.40q", i, len(got), got, len(w), w)
		}
		if i == 0 && string(fr.ahead) != string(frame("two")) {
			// both came in one write: one read took them in
			t.Fatalf("after the first of two frames written at once, %.40q is read ahead, want the second", fr.ahead)
		}
		if i == 1 {
			close(rest)
		}
	}
	if fr.buf != nil || len(fr.ahead) != 0 {
		t.Fatalf("after the last frame the reader holds a buffer with %d bytes", len(fr.ahead))
	}
	cli.Close()
	if _, err := api.ReadFrame(fr, 1<<20); !errors.Is(err, io.EOF) {
		t.Fatalf("after the client closed: %v, want io.EOF", err)
	}
}

// TestFrameReaderStallsAsBefore: a frame whose body does not all come is
// cut at the frame deadline, what was read ahead of it taken, and a
// connection between frames waits past that deadline.
func TestFrameReaderStallsAsBefore(t *testing.T) {
	srv, cli := unixPair(t)
	fr := newFrameReader(srv, 200*time.Millisecond)
	var b bytes.Buffer
	b.Write(binary.BigEndian.AppendUint32(nil, 100))
	b.WriteString(`{"op":"send"`)
	cli.Write(b.Bytes())
	_, err := api.ReadFrame(fr, 1<<20)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !fr.end() {
		t.Fatalf("a stalled frame: %v, want the frame deadline passed", err)
	}
	// between frames: no deadline, however long the wait
	srv2, cli2 := unixPair(t)
	fr2 := newFrameReader(srv2, 50*time.Millisecond)
	go func() {
		time.Sleep(300 * time.Millisecond)
		cli2.Write(frame("late"))
	}()
	got, err := api.ReadFrame(fr2, 1<<20)
	if err != nil || string(got) != "late" {
		t.Fatalf("a frame after an idle wait: %q, %v", got, err)
	}
}
