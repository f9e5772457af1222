package store

// lanes.go — urgent mail (issue 37.3). Every inbox has two lanes in its
// one bucket: normal mail under its sequence, urgent mail under its
// sequence with the top bit set (urgentBit). Both take their sequence
// from the bucket's one counter, so a sequence names one message of the
// inbox whichever its lane, and everything that finds a message by its
// record's Seq (a delivery, a death, the reply index) works on both.
//
// Inbox order is the urgent lane, oldest first, then the normal lane,
// oldest first: FIFO within each lane, urgent before normal. Every reader
// of an inbox's head walks it in that order (walk), and a reader that
// pages through it keeps one position per lane (After), so an urgent
// message that arrives while normal mail is being paged through comes
// first in the next page. A store written before lanes has no key with
// the top bit: its mail is all normal, and nothing needs migrating.

import (
	"encoding/binary"
	"math"
)

// urgentBit marks an urgent message's key in its inbox.
const urgentBit = uint64(1) << 63

// Urgent reports whether seq (an Item's or a Record's) is in the urgent
// lane.
func Urgent(seq uint64) bool { return seq&urgentBit != 0 }

// After is a reading position in an inbox: the last urgent and the last
// normal sequence read (0: none of that lane). The zero value is the
// inbox's head.
type After struct{ Urgent, Normal uint64 }

// Advance moves the position past seq, in its lane.
func (a After) Advance(seq uint64) After {
	if Urgent(seq) {
		a.Urgent = max(a.Urgent, seq)
	} else {
		a.Normal = max(a.Normal, seq)
	}
	return a
}

// afterKey is After for the single position of Head: past an urgent
// sequence, the rest of the urgent lane and all of the normal one; past a
// normal one, only the normal lane after it (the urgent lane comes first
// in inbox order, so it is behind that position).
func afterKey(seq uint64) After {
	if seq == 0 || Urgent(seq) {
		return After{Urgent: seq}
	}
	return After{Urgent: math.MaxUint64, Normal: seq}
}

// cursor is the part of a bbolt cursor walk uses.
type cursor interface {
	Seek(seek []byte) (key []byte, value []byte)
	Next() (key []byte, value []byte)
}

// walk calls fn for each message of an inbox after from, in inbox order:
// the urgent lane, then the normal lane. fn returns whether to go on in
// that lane; walk stops when done says so (checked before each message).
// The keys and values are the cursor's: valid only during fn.
func walk(c cursor, from After, done func() bool, fn func(seq uint64, v []byte) bool) {
	if from.Urgent != math.MaxUint64 {
		for k, v := c.Seek(u64(max(from.Urgent+1, urgentBit))); k != nil && !done(); k, v = c.Next() {
			if !fn(binary.BigEndian.Uint64(k), v) {
				break
			}
		}
	}
	for k, v := c.Seek(u64(from.Normal + 1)); k != nil && !Urgent(binary.BigEndian.Uint64(k)) && !done(); k, v = c.Next() {
		if !fn(binary.BigEndian.Uint64(k), v) {
			break
		}
	}
}

// laneKey is the key a new message of inbox sequence seq goes under.
func laneKey(seq uint64, urgent bool) uint64 {
	if urgent {
		return seq | urgentBit
	}
	return seq
}
