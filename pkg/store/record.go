package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// A delivery record is read and rewritten inside the committer for every
// message (accepted, then delivered), so it is stored in a compact binary
// form rather than JSON: version byte 1, then the strings as uvarint length
// and bytes, the numbers as uvarints, the times as a flag byte and the
// Unix nanoseconds as a varint; then, optionally, the recipient's name
// (Named) as a string, and after it, optionally, the hop count (Hops) as a
// uvarint (Named is then written, empty or not). Records written as JSON by earlier versions
// (they start with '{') are still read.
const recordV1 = 1

var errBadRecord = errors.New("store: malformed delivery record")

func encodeRecord(r *Record) []byte {
	b := make([]byte, 0, 1+5*40+48)
	b = append(b, recordV1)
	for _, s := range []string{r.MsgID, string(r.Kind), r.TraceID, r.Sender, r.Recipient, r.State, r.Reason} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.AppendUvarint(b, uint64(max(r.Attempts, 0)))
	for _, t := range []time.Time{r.Accepted, r.Done} {
		if t.IsZero() {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.AppendVarint(b, t.UnixNano())
	}
	if r.Named != "" || r.Hops > 0 {
		// optional, last: a record without it reads as before, and an
		// older reader stops before it
		b = binary.AppendUvarint(b, uint64(len(r.Named)))
		b = append(b, r.Named...)
	}
	if r.Hops > 0 {
		// optional, after Named (then written, empty or not): the hop
		// count in its trace (issue 37.2); an older reader stops before it
		b = binary.AppendUvarint(b, uint64(r.Hops))
	}
	return b
}

func decodeRecord(data []byte, r *Record) error {
	if len(data) > 0 && data[0] == '{' {
		return json.Unmarshal(data, r)
	}
	if len(data) == 0 || data[0] != recordV1 {
		return errBadRecord
	}
	p := data[1:]
	str := func() (string, bool) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return "", false
		}
		s := string(p[k : k+int(n)])
		p = p[k+int(n):]
		return s, true
	}
	var kind string
	ok := true
	for _, dst := range []*string{&r.MsgID, &kind, &r.TraceID, &r.Sender, &r.Recipient, &r.State, &r.Reason} {
		var good bool
		if *dst, good = str(); !good {
			ok = false
			break
		}
	}
	if !ok {
		return errBadRecord
	}
	r.Kind = envelope.Kind(kind)
	seq, k := binary.Uvarint(p)
	if k <= 0 {
		return errBadRecord
	}
	p = p[k:]
	att, k := binary.Uvarint(p)
	if k <= 0 {
		return errBadRecord
	}
	p = p[k:]
	r.Seq, r.Attempts = seq, int(att)
	for _, dst := range []*time.Time{&r.Accepted, &r.Done} {
		if len(p) == 0 {
			return errBadRecord
		}
		flag := p[0]
		p = p[1:]
		if flag == 0 {
			*dst = time.Time{}
			continue
		}
		ns, k := binary.Varint(p)
		if k <= 0 {
			return errBadRecord
		}
		p = p[k:]
		*dst = time.Unix(0, ns).UTC()
	}
	r.Named, r.Hops = "", 0
	if len(p) > 0 {
		if r.Named, ok = str(); !ok {
			return errBadRecord
		}
	}
	if len(p) > 0 {
		hops, k := binary.Uvarint(p)
		if k <= 0 || hops > 1<<31 {
			return errBadRecord
		}
		r.Hops = int(hops)
	}
	return nil
}
