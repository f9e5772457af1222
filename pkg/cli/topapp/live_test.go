package topapp

import (
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/fleetd/fleet/pkg/api"
)

// a model over a fixed snapshot (no gateway: the keys tested here make
// no call)
func testModel(as string) *model {
	now := time.Now()
	snap := &snapshot{
		Status: &api.GatewayStatus{Host: "h1"},
		Rows: []api.EntityRow{
			{Name: "alice", Host: "h1", Gid: "h1.a", Status: "busy", StatusSince: now.Add(-5 * time.Minute), Groups: []string{"ops"}},
			{Name: "bob", Host: "h2", Gid: "h2.b", Status: "idle", Groups: []string{"dev"}},
			{Name: "carol", Host: "h3", Gid: "h3.c", Status: "idle"},
		},
		Asks: []api.OpenAsk{
			{MsgID: "ask-00000001", Kind: "ASK", Asker: "bob@h2", AskerGid: "h2.b", Target: "alice@h1", TargetGid: "h1.a", Size: 3, Opened: now, Deadline: now.Add(time.Minute)},
			{MsgID: "ask-00000002", Kind: "ASK", Asker: "alice@h1", AskerGid: "h1.a", Target: "carol@h3", TargetGid: "h3.c", Size: 3, Opened: now.Add(time.Second), Deadline: now.Add(time.Minute)},
		},
		HasAsks: true,
	}
	src := &source{as: as}
	m := newModel(src, &stream{ch: make(chan api.WatchEvent)}, snap, palette{})
	return m
}

func press(m *model, key string) {
	var k tea.KeyPressMsg
	switch key {
	case "tab":
		k = tea.KeyPressMsg{Code: tea.KeyTab}
	case "down":
		k = tea.KeyPressMsg{Code: tea.KeyDown}
	default:
		k = tea.KeyPressMsg{Code: rune(key[0]), Text: key}
	}
	m.Update(k)
}

func names(its []item) []string {
	var out []string
	for _, it := range its {
		if r, ok := it.ref.(api.EntityRow); ok {
			out = append(out, r.Name)
		}
	}
	return out
}

func TestFilterByHostAndGroup(t *testing.T) {
	m := testModel("")
	if got := names(m.items(paneEntities)); len(got) != 3 {
		t.Fatalf("no filter: %v", got)
	}
	m.filter = "host:h2"
	if got := names(m.items(paneEntities)); len(got) != 1 || got[0] != "bob" {
		t.Fatalf("host:h2: %v", got)
	}
	if its := m.items(paneAsks); len(its) != 1 || its[0].ref.(api.OpenAsk).MsgID != "ask-00000001" {
		t.Fatalf("host:h2 asks: %v", its)
	}
	m.filter = "group:ops"
	if got := names(m.items(paneEntities)); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("group:ops: %v", got)
	}
	m.filter = "group:ops carol"
	if got := names(m.items(paneEntities)); len(got) != 0 {
		t.Fatalf("group:ops and a substring of another: %v", got)
	}
	// h cycles the hosts, then off; g the groups
	m.filter = ""
	for _, want := range []string{"host:h1", "host:h2", "host:h3", ""} {
		press(m, "h")
		if m.filter != want {
			t.Fatalf("h: filter %q, want %q", m.filter, want)
		}
	}
	press(m, "g")
	press(m, "h")
	if m.filter != "host:h1 group:dev" {
		t.Fatalf("g then h: %q", m.filter)
	}
	if q := parseQuery("x host:h2 y group:g"); q != (query{host: "h2", group: "g", text: "x y"}) {
		t.Fatalf("parseQuery: %+v", q)
	}
}

func TestAnswerOnlyOwnAsks(t *testing.T) {
	m := testModel("alice")
	m.focus = paneAsks
	press(m, "down") // the ask put to carol
	press(m, "a")
	if m.over != overNone || !strings.Contains(m.notice, "put to carol@h3, not to alice") {
		t.Fatalf("a on another's ask: over %d, notice %q", m.over, m.notice)
	}
	m.cursor[paneAsks] = 0
	press(m, "a")
	if m.over != overAnswer || m.askID != "ask-00000001" || !strings.Contains(m.input.Prompt, "answer to bob@h2") {
		t.Fatalf("a on own ask: over %d, ask %q, prompt %q", m.over, m.askID, m.input.Prompt)
	}
	n := testModel("")
	n.focus = paneAsks
	press(n, "a")
	if !strings.Contains(n.notice, "--as NAME") {
		t.Fatalf("a without --as: %q", n.notice)
	}
}

func TestInboxTextInertAt80x24(t *testing.T) {
	m := testModel("alice")
	ev := api.WatchEvent{Time: time.Now(), Event: "accepted", Kind: "SEND", MsgID: "m-0000beef", Sender: "h2.b", Recipient: "h1.a",
		Body: "hello \x1b]0;pwned\x07\x1b[2J there"}
	m.Update(eventMsg(ev))
	m.Update(eventMsg(ev)) // taken: the same message once
	if len(m.inbox) != 1 {
		t.Fatalf("inbox: %d messages, want 1", len(m.inbox))
	}
	if m.events[len(m.events)-1].Body != "" {
		t.Fatal("the flow keeps a text")
	}
	screen := m.render()
	lines := strings.Split(screen, "\n")
	if len(lines) != 24 {
		t.Fatalf("%d lines, want 24", len(lines))
	}
	for _, l := range lines {
		if w := ansi.StringWidth(l); w != 80 {
			t.Fatalf("a line of %d cells: %q", w, l)
		}
	}
	if strings.ContainsAny(screen, "\x1b\x07") {
		t.Fatalf("an escape or a bell from a body reached the screen: %q", screen)
	}
	for _, want := range []string{"INBOX (1)", "bob@h2 0000beef: hello ␛]0;pwned␇␛[2J there", "OPEN ASKS (2)", "alice@h1", "busy      5m"} {
		if !strings.Contains(screen, want) {
			t.Fatalf("the screen lacks %q:\n%s", want, screen)
		}
	}
	// s in the inbox replies to the selected message
	m.focus = paneInbox
	press(m, "s")
	if m.over != overReply || m.replyTo != "m-0000beef" || !strings.Contains(m.input.Prompt, "reply to bob@h2") {
		t.Fatalf("s in INBOX: over %d, reply to %q, prompt %q", m.over, m.replyTo, m.input.Prompt)
	}
	// without --as, Tab never stops at INBOX
	n := testModel("")
	for range paneCount * 2 {
		press(n, "tab")
		if n.focus == paneInbox {
			t.Fatal("Tab reached INBOX without --as")
		}
	}
}

// every size draws exactly its lines, each of its width, with and
// without --as (a resize is a WindowSizeMsg)
func TestRenderEverySize(t *testing.T) {
	for _, as := range []string{"", "alice"} {
		m := testModel(as)
		for _, sz := range [][2]int{{80, 24}, {100, 30}, {40, 8}, {12, 6}, {200, 60}, {80, 10}} {
			m.Update(tea.WindowSizeMsg{Width: sz[0], Height: sz[1]})
			lines := strings.Split(m.render(), "\n")
			if len(lines) != sz[1] {
				t.Fatalf("as %q, %dx%d: %d lines", as, sz[0], sz[1], len(lines))
			}
			for _, l := range lines {
				if w := ansi.StringWidth(l); w != sz[0] {
					t.Fatalf("as %q, %dx%d: a line of %d cells: %q", as, sz[0], sz[1], w, l)
				}
			}
		}
	}
}
