package topapp

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
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
	if path := os.Getenv(framesEnv); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fleetcli.Usage("%s: %v", framesEnv, err).WithHint("point " + framesEnv + " at a file fleet-top may write, or unset it")
		}
		defer f.Close()
		m.frames = f
	}
	_, err = tea.NewProgram(m).Run()
	return err
}

// framesEnv names a file fleet-top appends each frame's render time to,
// in microseconds, one a line (scripts/bench-top.sh reads it).
const framesEnv = "FLEET_TOP_FRAMES"

// panes, in Tab order.
const (
	paneHosts = iota
	paneEntities
	paneFlow
	paneAsks
	paneDead
	paneInbox // only with --as
	paneCount
)

var paneNames = [paneCount]string{"HOSTS", "ENTITIES", "FLOW", "OPEN ASKS", "DEAD LETTERS", "INBOX"}

// maxEvents is how many events the flow keeps, maxInbox how many
// messages the inbox pane.
const (
	maxEvents = 500
	maxInbox  = 200
)

// overlay kinds: what covers the panes.
const (
	overNone = iota
	overHelp
	overTrace
	overConfirm
	overFilter
	overSendTo
	overSendText
	overAnswer
	overReply
)

type (
	snapMsg struct {
		snap *snapshot
		err  error
	}
	errMsg    struct{ err error }
	eventMsg  api.WatchEvent
	eventsMsg []api.WatchEvent
	endMsg    struct{ err error }
	tickMsg   struct{}
	traceMsg  struct{ tr *api.Trace }
	noticeMsg string
)

type model struct {
	src     *source
	st      *stream
	pal     palette
	snap    *snapshot
	names   map[string]string
	events  []api.WatchEvent
	inbox   []api.WatchEvent // with --as: the messages of its inbox, with their text, newest last
	w, h    int
	focus   int
	cursor  [paneCount]int
	filter  string
	over    int
	input   textinput.Model
	sendTo  string
	askID   string   // the ask the answer prompt answers
	replyTo string   // the message the reply prompt replies to
	trace   []string // the trace overlay's lines
	dead    *api.DeadLetter
	notice  string
	ended   bool
	frames  io.Writer // FLEET_TOP_FRAMES: each frame's render time (nil: none)
	reads   reads     // the snapshots read (refresh.go)
}

func newModel(src *source, st *stream, snap *snapshot, pal palette) *model {
	in := textinput.New()
	in.CharLimit = 4096
	m := &model{src: src, st: st, pal: pal, snap: snap, names: snap.names(), w: 80, h: 24, focus: paneEntities, input: in}
	return m
}

func (m *model) Init() tea.Cmd { return tea.Batch(m.next(), tick()) }

func tick() tea.Cmd { return tea.Tick(refreshEvery, func(time.Time) tea.Msg { return tickMsg{} }) }

// rowEvents are the events after which the rows are read again at once.
var rowEvents = map[string]bool{"joined": true, "left": true, "status": true, "peer": true}

// askEvents are the kinds of message whose events open or close an ask:
// the open asks are read again at once.
var askEvents = map[string]bool{"ASK": true, "ANSWER": true, "TOO_LATE": true}

// toInbox keeps a message of the --as entity's inbox, once (its
// accepted and taken events both carry the text).
func (m *model) toInbox(ev api.WatchEvent) {
	for _, e := range m.inbox {
		if e.MsgID == ev.MsgID {
			return
		}
	}
	m.inbox = append(m.inbox, ev)
	if len(m.inbox) > maxInbox {
		m.inbox = m.inbox[len(m.inbox)-maxInbox:]
	}
}

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.w, m.h = msg.Width, msg.Height
		return m, nil
	case snapMsg:
		return m, m.read(msg)
	case errMsg:
		m.notice = "error: " + clean(msg.err.Error())
		return m, nil
	case noticeMsg:
		m.notice = string(msg)
		return m, m.refresh()
	case tickMsg:
		return m, tea.Batch(m.refresh(), tick())
	case eventMsg:
		if m.take(api.WatchEvent(msg)) {
			return m, tea.Batch(m.next(), m.refresh())
		}
		return m, m.next()
	case eventsMsg:
		read := false
		for _, ev := range msg {
			read = m.take(ev) || read
		}
		if read {
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
	if m.prompting() {
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
	case overFilter, overSendTo, overSendText, overAnswer, overReply:
		return m.prompt(k)
	}
	switch key {
	case "q":
		return m, tea.Quit
	case "?":
		m.over = overHelp
	case "tab":
		m.focus = m.nextPane(1)
	case "shift+tab":
		m.focus = m.nextPane(-1)
	case "up", "k":
		m.move(-1)
	case "down", "j":
		m.move(1)
	case "esc":
		m.filter = ""
	case "/":
		return m, m.ask(overFilter, "filter: ", m.filter)
	case "h":
		m.cycle("host", m.hosts())
	case "g":
		m.cycle("group", m.groups())
	case "s":
		if m.src.as == "" {
			m.notice = "sending needs an entity: start fleet-top --as NAME"
			return m, nil
		}
		if m.focus == paneInbox {
			ev, ok := m.selected(paneInbox).(api.WatchEvent)
			if !ok {
				m.notice = "no message to reply to"
				return m, nil
			}
			m.replyTo = ev.MsgID
			return m, m.ask(overReply, "reply to "+clean(party(ev.Sender, m.names))+": ", "")
		}
		return m, m.ask(overSendTo, "send to NAME: ", "")
	case "a":
		return m, m.startAnswer()
	case "enter":
		return m, m.openTrace()
	case "r":
		if m.focus != paneDead {
			m.notice = "r replays a dead letter: Tab to DEAD LETTERS first"
			return m, nil
		}
		d, ok := m.selected(paneDead).(api.DeadLetter)
		if !ok {
			return m, nil
		}
		m.dead, m.over = &d, overConfirm
	}
	return m, nil
}

// nextPane is the pane d steps from the focused one (the inbox only
// with --as).
func (m *model) nextPane(d int) int {
	p := m.focus
	for {
		p = (p + d + paneCount) % paneCount
		if p != paneInbox || m.src.as != "" {
			return p
		}
	}
}

// me is the --as entity's gid, from the rows ("": not known).
func (m *model) me() string {
	if m.src.as == "" || m.snap.Status == nil {
		return ""
	}
	for _, r := range m.snap.Rows {
		if r.Name == m.src.as && r.Host == m.snap.Status.Host {
			return r.Gid
		}
	}
	return ""
}

// startAnswer opens the answer prompt for the selected open ask, if it
// is put to the --as entity.
func (m *model) startAnswer() tea.Cmd {
	if m.src.as == "" {
		m.notice = "answering needs an entity: start fleet-top --as NAME"
		return nil
	}
	if m.focus != paneAsks {
		m.notice = "a answers an ask: Tab to OPEN ASKS first"
		return nil
	}
	a, ok := m.selected(paneAsks).(api.OpenAsk)
	if !ok {
		m.notice = "no ask to answer"
		return nil
	}
	if a.TargetGid != m.me() {
		m.notice = "that ask is put to " + clean(a.Target) + ", not to " + clean(m.src.as)
		return nil
	}
	m.askID = a.MsgID
	return m.ask(overAnswer, "answer to "+clean(a.Asker)+": ", "")
}

// cycle moves the filter's key (host or group) to the next of values:
// none, then each, then none again.
func (m *model) cycle(key string, values []string) {
	q := parseQuery(m.filter)
	cur := q.host
	if key == "group" {
		cur = q.group
	}
	next := ""
	if len(values) > 0 {
		i := slices.Index(values, cur)
		if i+1 < len(values) {
			next = values[i+1]
		}
	}
	if key == "group" {
		q.group = next
	} else {
		q.host = next
	}
	m.filter = q.String()
	m.cursor = [paneCount]int{}
	if next == "" {
		m.notice = key + " filter off"
	} else {
		m.notice = key + " " + clean(next)
	}
}

// hosts are the hosts on screen: this one and its peers, sorted.
func (m *model) hosts() []string {
	var out []string
	for _, h := range hostRows(m.snap.Status, time.Now()) {
		out = append(out, h.Host)
	}
	for _, r := range m.snap.Rows {
		out = append(out, r.Host)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// groups are the groups of the entities on screen, sorted.
func (m *model) groups() []string {
	var out []string
	for _, r := range m.snap.Rows {
		out = append(out, r.Groups...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// prompting says whether a one-line prompt has the keys.
func (m *model) prompting() bool {
	switch m.over {
	case overFilter, overSendTo, overSendText, overAnswer, overReply:
		return true
	}
	return false
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
			m.cursor = [paneCount]int{}
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
		case overAnswer, overReply:
			over, id, body := m.over, m.askID, v
			m.over = overNone
			m.input.Blur()
			if strings.TrimSpace(body) == "" {
				m.notice = "nothing sent: the text is empty"
				return m, nil
			}
			return m, func() tea.Msg {
				what, call := "answered", m.src.answer
				if over == overReply {
					what, id, call = "replied", m.replyTo, m.src.reply
				}
				sent, err := call(id, body)
				if err != nil {
					return errMsg{err}
				}
				return noticeMsg(fmt.Sprintf("%s %s with %s to %s: %s", what, shortID(id), shortID(sent.MsgID), clean(sent.Recipient), clean(sent.State)))
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
	switch ref := m.selected(m.focus).(type) {
	case api.WatchEvent: // the flow, the inbox
		id = ref.TraceID
	case api.DeadLetter:
		id = ref.Record.TraceID
	case api.OpenAsk:
		id = ref.TraceID
	default:
		if m.focus != paneFlow && m.focus != paneDead && m.focus != paneAsks && m.focus != paneInbox {
			m.notice = "Enter shows a trace: Tab to FLOW, OPEN ASKS, DEAD LETTERS or INBOX"
			return nil
		}
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

// item is one row of a pane: its plain text (what the substring filter
// matches), the hosts and gids it concerns (what host: and group:
// match), what it is (ref: an event, a dead letter, an ask) and how it
// is drawn.
type item struct {
	text  string
	hosts []string
	gids  []string
	ref   any
	draw  func(width int) string
}

// items are a pane's rows, filtered.
func (m *model) items(p int) []item {
	now := time.Now()
	q := parseQuery(m.filter)
	// what a frame does for every row is what it must: the texts a
	// filter searches, the groups and the hosts' entities only when a
	// filter or the pane asks (BenchmarkRender: 1,000 rows)
	var groups, byHost map[string][]string
	if q.group != "" {
		groups = map[string][]string{}
		for _, r := range m.snap.Rows {
			groups[r.Gid] = r.Groups
		}
	}
	if p == paneHosts && q.group != "" {
		byHost = map[string][]string{}
		for _, r := range m.snap.Rows {
			byHost[r.Host] = append(byHost[r.Host], r.Gid)
		}
	}
	var out []item
	add := func(it item) {
		if it.matches(q, groups) {
			out = append(out, it)
		}
	}
	parties := func(gids ...string) (hosts, kept []string) {
		for _, g := range gids {
			if g != "" {
				hosts, kept = append(hosts, hostOf(g)), append(kept, g)
			}
		}
		return hosts, kept
	}
	switch p {
	case paneHosts:
		for _, h := range hostRows(m.snap.Status, now) {
			add(item{text: strings.Join([]string{h.Host, h.State, h.Heard}, " "), hosts: []string{h.Host}, gids: byHost[h.Host],
				draw: func(w int) string {
					return fit(cell(clean(h.Host), 12, nil)+" "+cell(clean(h.State), 10, m.pal.state)+" "+clean(h.Heard), w)
				}})
		}
	case paneEntities:
		for _, r := range m.snap.Rows {
			text := ""
			if q.text != "" {
				text = fmt.Sprintf("%s %s %s pending %d dead %d last %s %s", nameAt(r), r.Status, since(r, now), r.Pending, r.Dead,
					clock(r.LastDelivery, now), strings.Join(r.Groups, " "))
			}
			add(item{text: text, hosts: []string{r.Host}, gids: []string{r.Gid}, ref: r, draw: func(w int) string {
				return fit(cell(clean(nameAt(r)), 24, nil)+" "+cell(clean(r.Status), 9, m.pal.state)+" "+cell(since(r, now), 4, nil)+" "+
					fmt.Sprintf("pend %-4d dead %-4d last %s", r.Pending, r.Dead, clock(r.LastDelivery, now)), w)
			}})
		}
	case paneFlow:
		for i := len(m.events) - 1; i >= 0; i-- { // newest first
			ev := m.events[i]
			t := ""
			if q.text != "" {
				t = eventText(ev, m.names, now)
			}
			hosts, gids := parties(ev.Sender, ev.Recipient, ev.Gid)
			hosts = append(hosts, ev.Host)
			if ev.Peer != "" {
				hosts = append(hosts, ev.Peer)
			}
			add(item{text: t, hosts: hosts, gids: gids, ref: ev, draw: func(w int) string { return fit(eventText(ev, m.names, now), w) }})
		}
	case paneAsks:
		for _, a := range m.snap.Asks {
			t := askText(a, now)
			hosts, gids := parties(a.AskerGid, a.TargetGid)
			add(item{text: t, hosts: hosts, gids: gids, ref: a, draw: func(w int) string { return fit(t, w) }})
		}
	case paneDead:
		for _, d := range m.snap.Dead {
			t := deadText(d, now)
			var sender string
			if d.Envelope != nil {
				sender = d.Envelope.Sender.Gid
			}
			hosts, gids := parties(sender, d.Record.Gid)
			add(item{text: t, hosts: hosts, gids: gids, ref: d, draw: func(w int) string { return fit(t, w) }})
		}
	case paneInbox:
		for i := len(m.inbox) - 1; i >= 0; i-- { // newest first
			ev := m.inbox[i]
			t := inboxText(ev, m.names, now)
			hosts, gids := parties(ev.Sender, ev.Recipient)
			add(item{text: t, hosts: hosts, gids: gids, ref: ev, draw: func(w int) string { return fit(t, w) }})
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

// selected is what the cursor of pane p is on (nil: nothing).
func (m *model) selected(p int) any {
	its := m.items(p)
	if c := min(m.cursor[p], len(its)-1); c >= 0 {
		return its[c].ref
	}
	return nil
}

func (m *model) View() tea.View {
	t := time.Now()
	screen := m.render()
	if m.frames != nil {
		fmt.Fprintln(m.frames, time.Since(t).Microseconds())
	}
	v := tea.NewView(screen)
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
	"/           filter by a substring, host:H, group:G (Esc clears)",
	"h, g        filter by the next host, the next group (then none)",
	"Enter       the trace of an event, an ask or a dead letter",
	"r           replay a dead letter (y/n)",
	"a           answer the open ask (one put to the --as entity)",
	"s           send as the --as entity; in INBOX, reply to the message",
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
	size[paneAsks] = max(min(len(its[paneAsks])+1, rest/6), 2)
	size[paneDead] = max(min(len(its[paneDead])+1, rest/6), 2)
	if m.src.as != "" {
		size[paneInbox] = max(min(len(its[paneInbox])+1, rest/5), 2)
	}
	left := rest - size[paneAsks] - size[paneDead] - size[paneInbox]
	// the entities what they need, up to three fifths; the flow the rest
	size[paneEntities] = max(min(len(its[paneEntities])+1, left*3/5), 2)
	size[paneFlow] = left - size[paneEntities]
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
	case overFilter, overSendTo, overSendText, overAnswer, overReply:
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
	return fit(m.pal.dim("Tab pane ↑↓ move / filter h host g group Enter trace r replay a answer s send"), m.w)
}
