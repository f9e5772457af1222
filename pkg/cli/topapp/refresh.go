package topapp

// refresh.go — the live view's pace: when the snapshot is read again,
// and the stream's events taken a burst at a time.

import (
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/fleetd/fleet/pkg/api"
)

// refreshEvery is how often the rows are read again with no event that
// asks for it (pending and dead counts, other hosts' rows, the gateway's
// status); readGap is the least time between two reads. A read of the
// whole roster costs the gateway about 6 ms per 1,000 rows
// (scripts/BENCHMARKS.md, bench-top): a read after every event of a
// burst, and every 2 seconds, was a quarter of the gateway's CPU again.
const (
	refreshEvery = 10 * time.Second
	readGap      = time.Second
)

// reads is when the snapshots are read: one at a time, at most one
// every readGap, and one more after a read for whatever asked for one
// while it ran.
type reads struct {
	running bool      // a snapshot is being read
	again   bool      // one was asked for meanwhile
	last    time.Time // when the last read ended
}

// refresh asks for the snapshot to be read again: now, readGap after
// the last read ended, or once the running read is done.
func (m *model) refresh() tea.Cmd {
	if m.reads.running {
		m.reads.again = true
		return nil
	}
	m.reads.running = true
	wait := time.Until(m.reads.last.Add(readGap))
	return func() tea.Msg {
		if wait > 0 {
			time.Sleep(wait)
		}
		snap, err := m.src.snapshot()
		return snapMsg{snap, err}
	}
}

// read takes a snapshot that was read, and reads again if asked to
// meanwhile.
func (m *model) read(msg snapMsg) tea.Cmd {
	m.reads.running, m.reads.last = false, time.Now()
	if msg.err != nil {
		m.notice = "error: " + clean(msg.err.Error())
	} else {
		m.snap, m.names = msg.snap, msg.snap.names()
	}
	if m.reads.again {
		m.reads.again = false
		return m.refresh()
	}
	return nil
}

// eventLinger is how long the view gathers events after one before it
// takes them, eventBatch how many at most: a frame per burst, not one
// per event (at 100 messages a second a frame per event was 50 frames a
// second and 40% of a CPU for fleet-top, bench-top).
const (
	eventLinger = 100 * time.Millisecond
	eventBatch  = 256
)

// next waits for the stream's next events: the first, and whatever
// follows within eventLinger.
func (m *model) next() tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-m.st.ch
		if !ok {
			return endMsg{m.st.err}
		}
		evs := eventsMsg{ev}
		t := time.NewTimer(eventLinger)
		defer t.Stop()
		for len(evs) < eventBatch {
			select {
			case ev, ok := <-m.st.ch:
				if !ok {
					return evs // the end comes with the next call
				}
				evs = append(evs, ev)
			case <-t.C:
				return evs
			}
		}
		return evs
	}
}

// take is one event of the stream; it says whether the snapshot should
// be read again for it.
func (m *model) take(ev api.WatchEvent) bool {
	if ev.Body != "" { // the --as entity's own mail: the inbox pane
		m.toInbox(ev)
		ev.Body = "" // the flow never shows a text
	}
	m.events = append(m.events, ev)
	if len(m.events) > maxEvents {
		m.events = m.events[len(m.events)-maxEvents:]
	}
	return rowEvents[ev.Event] || askEvents[ev.Kind]
}
