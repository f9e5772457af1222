package topapp

import (
	"fmt"
	"strings"
	"time"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"github.com/fleetd/fleet/pkg/api"
	ucli "github.com/urfave/cli/v2"
)

// live runs the full-screen view until q or Ctrl-C.
func live(c *ucli.Context, src *source) error {
	snap, err := src.snapshot()
	if err != nil {
		return err
	}
	st, err := src.openStream()
	if err != nil {
		return err
	}
	defer st.close()
	m := newModel(src, st, snap, palette{color: !noColor()})
	_, err = tea.NewProgram(m).Run()
	return err
}

// panes, in Tab order.
const (
	paneHosts = iota
	paneEntities
	paneFlow
	paneDead
	paneCount
)

var paneNames = [paneCount]string{"HOSTS", "ENTITIES", "FLOW", "DEAD LETTERS"}

// maxEvents is how many events the flow keeps.
const maxEvents = 500

// overlay kinds: what covers the panes.
const (
	overNone = iota
	overHelp
	overTrace
	overConfirm
	overFilter
	overSendTo
	overSendText
)

type (
	snapMsg   struct{ snap *snapshot }
	errMsg    struct{ err error }
	eventMsg  api.WatchEvent
	endMsg    struct{ err error }
	tickMsg   struct{}
	traceMsg  struct{ tr *api.Trace }
	noticeMsg string
)

type model struct {
	src    *source
	st     *stream
	pal    palette
	snap   *snapshot
	names  map[string]string
	events []api.WatchEvent
	w, h   int
	focus  int
	cursor [paneCount]int
	filter string
	over   int
	input  textinput.Model
	sendTo string
	trace  []string // the trace overlay's lines
	dead   *api.DeadLetter
	notice string
	ended  bool
}

func newModel(src *source, st *stream, snap *snapshot, pal palette) *model {
	in := textinput.New()
	in.CharLimit = 4096
	m := &model{src: src, st: st, pal: pal, snap: snap, names: snap.names(), w: 80, h: 24, focus: paneEntities, input: in}
	return m
}

func (m *model) Init() tea.Cmd { return tea.Batch(m.next(), tick()) }

func tick() tea.Cmd { return tea.Tick(refreshEvery, func(time.Time) tea.Msg { return tickMsg{} }) }

// next waits for the stream's next event.
func (m *model) next() tea.Cmd {
	return func() tea.Msg {
		ev, ok := <-m.st.ch
		if !ok {
			return endMsg{m.st.err}
		}
		return eventMsg(ev)
	}
}

func (m *model) refresh() tea.Cmd {
	return func() tea.Msg {
		snap, err := m.src.snapshot()
		if err != nil {
			return errMsg{err}
		}
		return snapMsg{snap}
	}
}

// rowEvents are the events after which the rows are read again at once.
var rowEvents = map[string]bool{"joined": true, "left": true, "status": true, "peer": true}

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.w, m.h = msg.Width, msg.Height
		return m, nil
	case snapMsg:
		m.snap, m.names = msg.snap, msg.snap.names()
		return m, nil
	case errMsg:
		m.notice = "error: " + clean(msg.err.Error())
		return m, nil
	case noticeMsg:
		m.notice = string(msg)
		return m, m.refresh()
	case tickMsg:
		return m, tea.Batch(m.refresh(), tick())
	case eventMsg:
		m.events = append(m.events, api.WatchEvent(msg))
		if len(m.events) > maxEvents {
			m.events = m.events[len(m.events)-maxEvents:]
		}
		if rowEvents[msg.Event] {
			return m, tea.Batch(m.next(), m.refresh())
		}
		return m, m.next()
	case endMsg:
		m.ended = true
		m.notice = "the watch stream ended"
		if msg.err != nil {
			m.notice += ": " + clean(msg.err.Error())
		}
		return m, nil
	case traceMsg:
		m.trace = traceLines(msg.tr, time.Now())
		m.over, m.notice = overTrace, ""
		return m, nil
	case tea.KeyPressMsg:
		return m.key(msg)
	}
	if m.over == overFilter || m.over == overSendTo || m.over == overSendText {
		var cmd tea.Cmd
		m.input, cmd = m.input.Update(msg)
		return m, cmd
	}
	return m, nil
}

func (m *model) key(k tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	key := k.String()
	if key == "ctrl+c" {
		return m, tea.Quit
	}
	switch m.over {
	case overHelp, overTrace:
		if key == "q" {
			return m, tea.Quit
		}
		m.over = overNone
		return m, nil
	case overConfirm:
		m.over = overNone
		if key == "y" && m.dead != nil {
			id := m.dead.Record.MsgID
			return m, func() tea.Msg {
				sent, err := m.src.replay(id)
				if err != nil {
					return errMsg{err}
				}
				return noticeMsg(fmt.Sprintf("%s replayed as %s to %s: %s", shortID(id), shortID(sent.MsgID), clean(sent.Recipient), clean(sent.State)))
			}
		}
		m.notice = "replay cancelled"
		return m, nil
	case overFilter, overSendTo, overSendText:
		return m.prompt(k)
	}
	switch key {
	case "q":
		return m, tea.Quit
	case "?":
		m.over = overHelp
	case "tab":
		m.focus = (m.focus + 1) % paneCount
	case "shift+tab":
		m.focus = (m.focus + paneCount - 1) % paneCount
	case "up", "k":
		m.move(-1)
	case "down", "j":
		m.move(1)
	case "esc":
		m.filter = ""
	case "/":
		return m, m.ask(overFilter, "filter: ", m.filter)
	case "s":
		if m.src.as == "" {
			m.notice = "sending needs an entity: start fleet-top --as NAME"
			return m, nil
		}
		return m, m.ask(overSendTo, "send to NAME: ", "")
	case "enter":
		return m, m.openTrace()
	case "r":
		if m.focus != paneDead {
			m.notice = "r replays a dead letter: Tab to DEAD LETTERS first"
			return m, nil
		}
		d, ok := m.selectedDead()
		if !ok {
			return m, nil
		}
		m.dead, m.over = &d, overConfirm
	}
	return m, nil
}

// ask opens a one-line prompt.
func (m *model) ask(over int, prompt, value string) tea.Cmd {
	m.over = over
	m.input.Prompt = prompt
	m.input.SetValue(value)
	m.input.CursorEnd()
	return m.input.Focus()
}

func (m *model) prompt(k tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	switch k.String() {
	case "esc":
		if m.over == overFilter {
			m.filter = ""
		}
		m.over = overNone
		m.input.Blur()
		return m, nil
	case "enter":
		v := m.input.Value()
		switch m.over {
		case overFilter:
			m.filter, m.over = v, overNone
			m.cursor = [paneCount]int{}
		case overSendTo:
			if strings.TrimSpace(v) == "" {
				m.over = overNone
				return m, nil
			}
			m.sendTo = strings.TrimSpace(v)
			return m, m.ask(overSendText, "text to "+clean(m.sendTo)+": ", "")
		case overSendText:
			m.over = overNone
			to, body := m.sendTo, v
			return m, func() tea.Msg {
				sent, err := m.src.send(to, body)
				if err != nil {
					return errMsg{err}
				}
				return noticeMsg(fmt.Sprintf("sent %s to %s: %s", shortID(sent.MsgID), clean(sent.Recipient), clean(sent.State)))
			}
		}
		m.input.Blur()
		return m, nil
	}
	var cmd tea.Cmd
	m.input, cmd = m.input.Update(k)
	return m, cmd
}

// openTrace asks for the trace of the selected event or dead letter.
func (m *model) openTrace() tea.Cmd {
	var id string
	switch m.focus {
	case paneFlow:
		if ev, ok := m.selectedEvent(); ok {
			id = ev.TraceID
		}
	case paneDead:
		if d, ok := m.selectedDead(); ok {
			id = d.Record.TraceID
		}
	default:
		m.notice = "Enter shows a trace: Tab to FLOW or DEAD LETTERS"
		return nil
	}
	if id == "" {
		m.notice = "no trace to show here"
		return nil
	}
	m.notice = "gathering trace " + shortID(id) + "…"
	return func() tea.Msg {
		tr, err := m.src.trace(id)
		if err != nil {
			return errMsg{err}
		}
		return traceMsg{tr}
	}
}

// traceLines is a trace as the overlay shows it, one hop a line.
func traceLines(tr *api.Trace, now time.Time) []string {
	out := []string{"trace " + clean(tr.TraceID) + fmt.Sprintf(" · %d hops", len(tr.Hops))}
	for _, h := range tr.Hops {
		ev := h.Event
		if h.Reason != "" {
			ev += " (" + h.Reason + ")"
		}
		out = append(out, clean(fmt.Sprintf("%s %-3s %-10s %-6s %s %s", h.Time.Local().Format("15:04:05.000"), h.Host, h.Entity, h.Kind, shortID(h.MsgID), ev)))
	}
	for _, h := range tr.Hosts {
		if h.State != api.TraceAnswered {
			out = append(out, clean(fmt.Sprintf("host %s: %s %s", h.Host, h.State, h.Detail)))
		}
	}
	return out
}

// item is one row of a pane: its plain text (what the filter matches)
// and how it is drawn.
type item struct {
	text string
	draw func(width int) string
}

func (m *model) matches(s string) bool {
	return m.filter == "" || strings.Contains(strings.ToLower(s), strings.ToLower(m.filter))
}

// items are a pane's rows, filtered.
func (m *model) items(p int) []item {
	now := time.Now()
	var out []item
	add := func(text string, draw func(int) string) {
		if m.matches(text) {
			out = append(out, item{text, draw})
		}
	}
	switch p {
	case paneHosts:
		for _, h := range hostRows(m.snap.Status, now) {
			h := h
			add(strings.Join([]string{h.Host, h.State, h.Heard}, " "), func(w int) string {
				return fit(cell(clean(h.Host), 12, nil)+" "+cell(clean(h.State), 10, m.pal.state)+" "+clean(h.Heard), w)
			})
		}
	case paneEntities:
		for _, r := range m.snap.Rows {
			r := r
			text := fmt.Sprintf("%s %s pending %d dead %d last %s", nameAt(r), r.Status, r.Pending, r.Dead, clock(r.LastDelivery, now))
			add(text, func(w int) string {
				return fit(cell(clean(nameAt(r)), 24, nil)+" "+cell(clean(r.Status), 9, m.pal.state)+" "+
					fmt.Sprintf("pend %-4d dead %-4d last %s", r.Pending, r.Dead, clock(r.LastDelivery, now)), w)
			})
		}
	case paneFlow:
		for i := len(m.events) - 1; i >= 0; i-- { // newest first
			t := eventText(m.events[i], m.names, now)
			add(t, func(w int) string { return fit(t, w) })
		}
	case paneDead:
		for _, d := range m.snap.Dead {
			t := deadText(d, now)
			add(t, func(w int) string { return fit(t, w) })
		}
	}
	return out
}

func (m *model) move(d int) {
	n := len(m.items(m.focus))
	c := m.cursor[m.focus] + d
	if c >= n {
		c = n - 1
	}
	if c < 0 {
		c = 0
	}
	m.cursor[m.focus] = c
}

func (m *model) selectedEvent() (api.WatchEvent, bool) {
	var evs []api.WatchEvent
	now := time.Now()
	for i := len(m.events) - 1; i >= 0; i-- {
		if m.matches(eventText(m.events[i], m.names, now)) {
			evs = append(evs, m.events[i])
		}
	}
	if c := m.cursor[paneFlow]; c < len(evs) {
		return evs[c], true
	}
	return api.WatchEvent{}, false
}

func (m *model) selectedDead() (api.DeadLetter, bool) {
	var ds []api.DeadLetter
	now := time.Now()
	for _, d := range m.snap.Dead {
		if m.matches(deadText(d, now)) {
			ds = append(ds, d)
		}
	}
	if c := m.cursor[paneDead]; c < len(ds) {
		return ds[c], true
	}
	return api.DeadLetter{}, false
}

func (m *model) View() tea.View {
	v := tea.NewView(m.render())
	v.AltScreen = true
	v.WindowTitle = "fleet-top"
	return v
}

// keys is the help overlay.
var keys = []string{
	"q, Ctrl-C   quit",
	"?           these keys (any key closes)",
	"Tab         the next pane (Shift-Tab: the one before)",
	"up, down    move in the pane",
	"/           filter rows and events by a substring (Esc clears)",
	"Enter       the trace of an event or a dead letter",
	"r           replay a dead letter (y/n)",
	"s           send a message as the --as entity",
}

// render is the whole screen: m.h lines, each m.w cells at most.
func (m *model) render() string {
	w, h := m.w, m.h
	if w < 10 || h < 5 {
		return fit("fleet-top: too small", w)
	}
	lines := make([]string, 0, h)
	head := "fleet-top"
	if m.snap.Status != nil {
		head += " · " + clean(m.snap.Status.Host) + " · broker " + clean(m.snap.Status.Broker.State)
	}
	if m.src.as != "" {
		head += " · as " + clean(m.src.as)
	}
	if m.filter != "" {
		head += " · filter " + clean(m.filter)
	}
	head += " · ? keys"
	lines = append(lines, m.pal.title(fit(head, w)))
	body := h - 2
	switch m.over {
	case overHelp:
		lines = append(lines, fit("KEYS", w))
		for _, k := range keys {
			lines = append(lines, fit("  "+k, w))
		}
	case overTrace:
		for _, l := range m.trace {
			lines = append(lines, fit(l, w))
		}
		lines = append(lines, fit(m.pal.dim("any key closes"), w))
	default:
		lines = append(lines, m.panes(body)...)
	}
	for len(lines) > h-1 {
		lines = lines[:h-1]
	}
	for len(lines) < h-1 {
		lines = append(lines, fit("", w))
	}
	lines = append(lines, m.footer())
	return strings.Join(lines, "\n")
}

// panes stacks the four panes into n lines: hosts take what they need
// (at most 4 lines), the rest goes to entities, flow and dead letters.
func (m *model) panes(n int) []string {
	its := [paneCount][]item{}
	for p := range its {
		its[p] = m.items(p)
	}
	size := [paneCount]int{}
	size[paneHosts] = min(len(its[paneHosts])+1, 4)
	rest := n - size[paneHosts]
	size[paneDead] = max(min(len(its[paneDead])+1, rest/5), 2)
	size[paneEntities] = (rest - size[paneDead]) / 2
	size[paneFlow] = rest - size[paneDead] - size[paneEntities]
	var out []string
	for p := 0; p < paneCount; p++ {
		out = append(out, m.pane(p, its[p], size[p])...)
	}
	return out
}

// pane draws pane p in n lines: a title, then the rows around the cursor.
func (m *model) pane(p int, its []item, n int) []string {
	if n <= 0 {
		return nil
	}
	w := m.w
	mark := "  "
	if p == m.focus {
		mark = "▶ "
	}
	title := fmt.Sprintf("%s%s (%d) ", mark, paneNames[p], len(its))
	out := []string{m.pal.title(fit(title+strings.Repeat("─", max(w-len([]rune(title)), 0)), w))}
	rows := n - 1
	c := min(m.cursor[p], max(len(its)-1, 0))
	start := 0
	if c >= rows {
		start = c - rows + 1
	}
	for i := start; i < len(its) && len(out) < n; i++ {
		line := "  " + its[i].draw(w-2)
		if p == m.focus && i == c {
			line = m.pal.selected(fit("> "+its[i].draw(w-2), w))
		}
		out = append(out, fit(line, w))
	}
	for len(out) < n {
		out = append(out, fit("", w))
	}
	return out
}

func (m *model) footer() string {
	switch m.over {
	case overFilter, overSendTo, overSendText:
		m.input.SetWidth(max(m.w-len([]rune(m.input.Prompt))-2, 1))
		return fit(m.input.View(), m.w)
	case overConfirm:
		if m.dead != nil {
			return fit(fmt.Sprintf("replay %s to %s? y/n", shortID(m.dead.Record.MsgID), clean(m.dead.Record.Recipient)), m.w)
		}
	}
	if m.notice != "" {
		return fit(m.notice, m.w)
	}
	return fit(m.pal.dim("Tab pane · ↑↓ move · / filter · Enter trace · r replay · s send · q quit"), m.w)
}
