package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
)

// gidAt is a gid made on host at ms (a v7 uuid begins with its time).
func gidAt(host string, ms int64, rest string) string {
	return host + "." + strings.Join([]string{
		// 48 bits of time: 8 hex, then 4
		hex(ms>>16, 8), hex(ms&0xffff, 4), "7" + rest[:3], "8" + rest[3:6], rest[6:] + strings.Repeat("0", 12-len(rest[6:])),
	}, "-")
}

func hex(v int64, n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := n - 1; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b)
}

// The name's holder is the entity made first, whichever order the rows
// come in, on every host alike; within one ms, by the rest of the uuid.
func TestNameHolderFirstMade(t *testing.T) {
	early, late := gidAt("c", 1_700_000_000_000, "abcdef123"), gidAt("b", 1_700_000_000_001, "000000000")
	for _, g := range []string{early, late} {
		if !ident.IsGid(g) {
			t.Fatalf("%s is not a gid", g)
		}
	}
	rows := []api.EntityRow{{Name: "main2", Host: "b", Gid: late}, {Name: "main2", Host: "c", Gid: early}}
	for i := 0; i < 2; i++ {
		if h := holder(rows); h.Gid != early {
			t.Fatalf("holder of %v: %s", rows, h.Gid)
		}
		rows[0], rows[1] = rows[1], rows[0]
	}
	// the same ms: the rest of the uuid decides, the same everywhere
	a, b := gidAt("a", 5, "000000001"), gidAt("z", 5, "000000000")
	if !firstMade(b, a) || firstMade(a, b) {
		t.Fatalf("within one ms: %s before %s?", b, a)
	}
	if !firstMade(ident.NewGid("x"), ident.NewGid("a")) {
		t.Fatal("a gid made later reads as made first")
	}
}

// Join's check: a name a trusted host has is refused, naming NAME@HOST;
// while that host is away, the hint says how to retire it.
func TestNameFree(t *testing.T) {
	n := newNameBook(slog.New(slog.DiscardHandler), time.Minute)
	if err := n.Free("main2", nil, nil); err != nil {
		t.Fatal(err)
	}
	remote := []api.EntityRow{{Name: "main2", Host: "c", Gid: ident.NewGid("c")}}
	err := n.Free("main2", remote, func(string) string { return "" })
	if fault.CodeOf(err) != fault.Usage || fault.KindOf(err) != fault.KindNameTaken ||
		!strings.Contains(err.Error(), "main2@c") || !strings.Contains(fault.HintOf(err), "main2@c") {
		t.Fatalf("join of a name c has: %v (%s; hint %q)", err, fault.KindOf(err), fault.HintOf(err))
	}
	err = n.Free("main2", remote, func(string) string { return "host c is gone: last heard 1m0s ago" })
	if !strings.Contains(err.Error(), "host c is gone") || !strings.Contains(fault.HintOf(err), "fleet-gw trust remove c") {
		t.Fatalf("join of a name of a gone host: %v (hint %q)", err, fault.HintOf(err))
	}
}

// A conflict is told once — an error on the host of the one that joined
// later, a warning elsewhere — and its end once; mark puts the holder on
// every row of the name, and only there.
func TestNameConflictTold(t *testing.T) {
	var logs bytes.Buffer
	n := newNameBook(slog.New(slog.NewJSONHandler(&logs, nil)), time.Minute)
	first, second := ident.NewGid("c"), ident.NewGid("b")
	rows := []api.EntityRow{
		{Name: "main2", Host: "b", Gid: second}, {Name: "main2", Host: "c", Gid: first},
		{Name: "solo", Host: "b", Gid: ident.NewGid("b")}, {Host: "z", Status: "untrusted"},
	}
	n.TellAll("b", rows)
	n.TellAll("b", rows)
	n.Tell("b", "main2", rows[:2])
	if c := strings.Count(logs.String(), `"level":"ERROR","msg":"name conflict`); c != 1 || strings.Contains(logs.String(), "solo") {
		t.Fatalf("told %d times on b:\n%s", c, logs.String())
	}
	if !strings.Contains(logs.String(), `"holder":"main2@c"`) || !strings.Contains(logs.String(), `"gid":"`+second+`"`) {
		t.Fatalf("the error names neither the holder nor this host's entity:\n%s", logs.String())
	}
	logs.Reset()
	other := newNameBook(slog.New(slog.NewJSONHandler(&logs, nil)), time.Minute)
	other.TellAll("a", rows)
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"name conflict`) {
		t.Fatalf("a third host:\n%s", logs.String())
	}
	marked := append([]api.EntityRow(nil), rows...)
	mark(marked)
	for _, r := range marked {
		want := ""
		if r.Name == "main2" {
			want = "main2@c"
		}
		if r.NameHolder != want {
			t.Fatalf("row %+v marked %q, want %q", r, r.NameHolder, want)
		}
	}
	// main2@b leaves: over, said once
	logs.Reset()
	other.TellAll("a", rows[1:])
	other.TellAll("a", rows[1:])
	if c := strings.Count(logs.String(), "name conflict over"); c != 1 {
		t.Fatalf("the end told %d times:\n%s", c, logs.String())
	}
}

// presenceOf is a presence message as host would publish it.
func presenceOf(t *testing.T, host string, b presenceBody) *envelope.Envelope {
	t.Helper()
	b.Host = host
	body, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return envelope.New(envelope.Presence, envelope.Party{Host: host}, envelope.Party{Group: "roster"}, string(body))
}

func rawRows(t *testing.T, rows ...api.EntityRow) []json.RawMessage {
	var out []json.RawMessage
	for _, r := range rows {
		j, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	return out
}

// What an untrusted host announces is kept only as a hint: names of its
// own gids, in the grammar, replaced by its next snapshot, dropped when
// it leaves or is trusted, and forgotten past the TTL.
func TestNameRumours(t *testing.T) {
	n := newNameBook(slog.New(slog.DiscardHandler), 200*time.Millisecond)
	none := func(string) bool { return false }
	main2 := api.EntityRow{Name: "main2", Gid: ident.NewGid("c"), Mode: "pull", Status: "idle"}
	claimed := api.EntityRow{Name: "alice", Gid: ident.NewGid("a"), Mode: "pull", Status: "idle"} // not c's own
	bad := api.EntityRow{Name: "no such name!", Gid: ident.NewGid("c")}
	n.Heard("c", presenceOf(t, "c", presenceBody{Snapshot: &snapshotPage{Pages: 1, Rows: rawRows(t, main2, claimed, bad)}}))
	if h := n.Rumoured("main2", "", none); len(h) != 1 || h[0] != "c" {
		t.Fatalf("rumoured main2: %v", h)
	}
	if h := n.Rumoured("main2", "d", none); len(h) != 0 {
		t.Fatalf("main2@d: %v", h)
	}
	if h := n.Rumoured("alice", "", none); len(h) != 0 {
		t.Fatalf("c speaks for a's alice: %v", h)
	}
	if h := n.Rumoured("main2", "", func(h string) bool { return h == "c" }); len(h) != 0 {
		t.Fatalf("a trusted host's rumour: %v", h)
	}
	// a body that names another host than its header: nothing
	n.Heard("d", presenceOf(t, "c", presenceBody{Snapshot: &snapshotPage{Pages: 1, Rows: rawRows(t, main2)}}))
	if h := n.Rumoured("main2", "d", none); len(h) != 0 {
		t.Fatalf("d by c's word: %v", h)
	}
	// gone, by its change notice
	n.Heard("c", presenceOf(t, "c", presenceBody{Change: &presenceChange{Gone: main2.Gid}}))
	if h := n.Rumoured("main2", "", none); len(h) != 0 {
		t.Fatalf("after gone: %v", h)
	}
	n.Heard("c", presenceOf(t, "c", presenceBody{Change: &presenceChange{Row: &main2}}))
	if h := n.Rumoured("main2", "", none); len(h) != 1 {
		t.Fatalf("after a join notice: %v", h)
	}
	n.Heard("c", presenceOf(t, "c", presenceBody{Snapshot: &snapshotPage{Pages: 1, Rows: rawRows(t)}}))
	if h := n.Rumoured("main2", "", none); len(h) != 0 {
		t.Fatalf("after a snapshot without it: %v", h)
	}
	n.Heard("c", presenceOf(t, "c", presenceBody{Change: &presenceChange{Row: &main2}}))
	time.Sleep(300 * time.Millisecond)
	if h := n.Rumoured("main2", "", none); len(h) != 0 {
		t.Fatalf("past the TTL: %v", h)
	}
	// what to say: the host, that it is not trusted, and how to trust it
	err := untrustedName("main2", "main2", "", []string{"c"})
	if fault.CodeOf(err) != fault.NoRecipient || fault.KindOf(err) != fault.KindUntrustedHost ||
		!strings.Contains(err.Error(), "host c, which this gateway does not trust") || strings.Contains(fault.HintOf(err), "did you mean") ||
		!strings.Contains(fault.HintOf(err), "fleet-gw trust add c KEY") {
		t.Fatalf("%v (hint %q)", err, fault.HintOf(err))
	}
}
