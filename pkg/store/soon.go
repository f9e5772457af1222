package store

import "time"

// Soon operations: writes that must reach the disk before their caller
// goes on, but that nobody else waits for — a pull client's
// acknowledgement, the read of the next batch behind it. Alone, such an
// operation costs an fdatasync of its own. Marked soon, its flush waits
// up to soonDelay for another operation to share it (a send, which is
// never kept waiting); whichever comes first, nothing is answered before
// it is on disk, and a read still sees every change acknowledged before
// it. A barrier, fence or checkpoint never waits.
//
// So a sender and its receiver, one message at a time, cost one flush per
// message instead of two: the acknowledgement of message n is written
// with the send of message n+1.
const soonDelay = 2 * time.Millisecond

// allSoon says whether every item of a syncer batch may wait.
func allSoon(batch []*flush) bool {
	for _, f := range batch {
		if !f.soon {
			return false
		}
	}
	return true
}

// DeliveredSoon is DeliveredAll as a soon operation: on disk when it
// returns, but its flush may wait up to soonDelay to be shared.
func (s *Store) DeliveredSoon(msgIDs []string, now time.Time) error {
	return s.queue(&op{fn: deliveredAll(msgIDs, now), soon: true})
}

// HeadSoon is HeadAfter as a soon operation: when changes are still on
// their way to disk, it is answered with them, whenever they go.
func (s *Store) HeadSoon(gid string, after After, n int) ([]Item, error) {
	return s.head(gid, after, n, true)
}
