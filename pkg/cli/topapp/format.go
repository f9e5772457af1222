package topapp

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/cli/table"
	"github.com/fleetd/fleet/pkg/deliver"
)

// fit cuts s (which may hold styles) to width cells, marking a cut with
// "…", and pads it with spaces to width: a line never wraps.
func fit(s string, width int) string {
	if width <= 0 {
		return ""
	}
	if ansi.StringWidth(s) > width {
		s = ansi.Truncate(s, width, "…")
	}
	if pad := width - ansi.StringWidth(s); pad > 0 {
		s += strings.Repeat(" ", pad)
	}
	return s
}

// clean makes a field that came from elsewhere (a name, a reason) safe
// to print: no control characters, no escape sequences.
func clean(s string) string { return deliver.Inert(s, false) }

// palette is the screen's styles; with colour off, none of them adds
// anything to the text.
type palette struct {
	color bool
}

var (
	green  = lipgloss.NewStyle().Foreground(lipgloss.Green)
	yellow = lipgloss.NewStyle().Foreground(lipgloss.Yellow)
	red    = lipgloss.NewStyle().Foreground(lipgloss.Red)
	grey   = lipgloss.NewStyle().Foreground(lipgloss.BrightBlack)
	bold   = lipgloss.NewStyle().Bold(true)
	invert = lipgloss.NewStyle().Reverse(true)
)

// state colours an entity's or a host's state.
func (p palette) state(s string) string {
	if !p.color {
		return s
	}
	switch s {
	case "idle", "live":
		return green.Render(s)
	case "busy", "waiting", "starting":
		return yellow.Render(s)
	case "stuck", "detached", "unhooked", "untrusted":
		return red.Render(s)
	case "stale", "gone", "unknown":
		return grey.Render(s)
	}
	return s
}

// title is a pane's title.
func (p palette) title(s string) string {
	if !p.color {
		return s
	}
	return bold.Render(s)
}

// selected marks the selected row of the focused pane (reverse video,
// an attribute, not a colour: NO_COLOR keeps it).
func (p palette) selected(s string) string {
	if !p.color {
		return s
	}
	return invert.Render(s)
}

// dim is text of less weight (a hint, a time).
func (p palette) dim(s string) string {
	if !p.color {
		return s
	}
	return grey.Render(s)
}

// cell is one column of a row: its text cut or padded to width cells,
// then styled (a style never counts toward the width).
func cell(s string, width int, style func(string) string) string {
	s = fit(s, width)
	if style == nil {
		return s
	}
	trimmed := strings.TrimRight(s, " ")
	return style(trimmed) + s[len(trimmed):]
}

// clock is a time of today as 15:04:05, of another day as 01-02 15:04.
func clock(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	t = t.Local()
	if y, m, d := t.Date(); y == now.Year() && m == now.Month() && d == now.Day() {
		return t.Format("15:04:05")
	}
	return t.Format("01-02 15:04")
}

// ago is a duration for people: 42s, 5m, 3h, 2d.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

// size is a body size: 28B, 4.1K, 2.0M.
func size(n int) string {
	switch {
	case n <= 0:
		return ""
	case n < 1024:
		return strconv.Itoa(n) + "B"
	case n < 1024*1024:
		return fmt.Sprintf("%.1fK", float64(n)/1024)
	}
	return fmt.Sprintf("%.1fM", float64(n)/(1024*1024))
}

// party is a gid as NAME@HOST when the roster knows it, else the gid.
func party(gid string, names map[string]string) string {
	if gid == "" {
		return "?"
	}
	if n, ok := names[gid]; ok {
		return n
	}
	return gid
}

// eventText is one event of the flow as plain text: time, event, kind,
// sender → recipient, size and short msg id for a message's event; the
// entity and its state for the others. Never a body.
func eventText(ev api.WatchEvent, names map[string]string, now time.Time) string {
	t := clock(ev.Time, now)
	switch {
	case ev.MsgID != "":
		s := fmt.Sprintf("%s %-9s %-6s %s → %s", t, ev.Event, ev.Kind, party(ev.Sender, names), party(ev.Recipient, names))
		if z := size(ev.Size); z != "" {
			s += " " + z
		}
		s += " " + shortID(ev.MsgID)
		if ev.Reason != "" {
			s += " (" + ev.Reason + ")"
		}
		return clean(s)
	case ev.Event == "peer":
		return clean(fmt.Sprintf("%s %-9s %s %s", t, ev.Event, ev.Peer, ev.Status))
	}
	s := fmt.Sprintf("%s %-9s %s@%s", t, ev.Event, ev.Entity, ev.Host)
	if ev.Status != "" {
		s += " " + ev.Status
	}
	if ev.Reason != "" {
		s += " (" + ev.Reason + ")"
	}
	return clean(s)
}

// since is how long an entity has had its status: 42s, 5m ("-": its
// row does not say, as another host's row in a held state does not).
func since(r api.EntityRow, now time.Time) string {
	if r.StatusSince.IsZero() {
		return "-"
	}
	return ago(now.Sub(r.StatusSince))
}

// askText is one open ask as plain text: short msg id, asker → askee,
// size, when it was opened and how long it has left; its text only when
// the gateway gave it (an ask put to the --as entity).
func askText(a api.OpenAsk, now time.Time) string {
	s := fmt.Sprintf("%s %s → %s %s %s", shortID(a.MsgID), a.Asker, a.Target, size(a.Size), clock(a.Opened, now))
	if !a.Deadline.IsZero() {
		s += " left " + ago(a.Deadline.Sub(now))
	}
	if a.Body != "" {
		s += ": " + a.Body
	}
	return clean(s)
}

// inboxText is one message of the --as entity's inbox: time, kind,
// sender, then its text (made inert: a body is hostile).
func inboxText(ev api.WatchEvent, names map[string]string, now time.Time) string {
	return clean(fmt.Sprintf("%s %-6s %s %s: %s", clock(ev.Time, now), ev.Kind, party(ev.Sender, names), shortID(ev.MsgID), ev.Body))
}

// deadText is one dead letter as plain text.
func deadText(d api.DeadLetter, now time.Time) string {
	r := d.Record
	return clean(fmt.Sprintf("%s %-6s %s ×%d %s %s", shortID(r.MsgID), r.Kind, r.Recipient, r.Attempts, clock(r.Done, now), r.Reason))
}

// printSnapshot writes snap as three tables: the hosts, the entities
// and the dead letters, each under its title.
func printSnapshot(w io.Writer, snap *snapshot, now time.Time) error {
	hosts := hostRows(snap.Status, now)
	rows := make([][]string, 0, len(hosts))
	for _, h := range hosts {
		rows = append(rows, []string{clean(h.Host), clean(h.State), h.Trusted, clean(h.Heard)})
	}
	fmt.Fprintf(w, "HOSTS (%d)\n", len(hosts))
	if err := table.Render(w, []string{"HOST", "STATE", "TRUSTED", "LAST HEARD"}, rows); err != nil {
		return err
	}
	rows = rows[:0]
	for _, r := range snap.Rows {
		rows = append(rows, []string{clean(nameAt(r)), clean(r.Status), since(r, now), strconv.Itoa(r.Pending), strconv.Itoa(r.Dead), clock(r.LastDelivery, now)})
	}
	fmt.Fprintf(w, "\nENTITIES (%d)\n", len(snap.Rows))
	if len(rows) > 0 {
		if err := table.Render(w, []string{"ENTITY", "STATUS", "SINCE", "PENDING", "DEAD", "LAST DELIVERY"}, rows); err != nil {
			return err
		}
	}
	if snap.HasAsks {
		rows = rows[:0]
		for _, a := range snap.Asks {
			left := "-"
			if !a.Deadline.IsZero() {
				left = ago(a.Deadline.Sub(now))
			}
			rows = append(rows, []string{clean(a.MsgID), clean(a.Asker), clean(a.Target), strconv.Itoa(a.Size), clock(a.Opened, now), left})
		}
		fmt.Fprintf(w, "\nOPEN ASKS (%d)\n", len(snap.Asks))
		if len(rows) > 0 {
			if err := table.Render(w, []string{"MSG ID", "ASKER", "ASKEE", "SIZE", "OPENED", "LEFT"}, rows); err != nil {
				return err
			}
		}
	}
	rows = rows[:0]
	for _, d := range snap.Dead {
		r := d.Record
		rows = append(rows, []string{clean(r.MsgID), clean(r.Kind), clean(r.Recipient), strconv.Itoa(r.Attempts), clock(r.Done, now), clean(r.Reason)})
	}
	fmt.Fprintf(w, "\nDEAD LETTERS (%d)\n", len(snap.Dead))
	if len(rows) > 0 {
		return table.Render(w, []string{"MSG ID", "KIND", "RECIPIENT", "ATTEMPTS", "DIED", "REASON"}, rows)
	}
	return nil
}
