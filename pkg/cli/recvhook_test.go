package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/ident"
)

func hookBatchOf(bodies ...string) []api.Delivery {
	var out []api.Delivery
	for i, b := range bodies {
		out = append(out, api.Delivery{Envelope: &envelope.Envelope{Kind: envelope.Send, MsgID: fmt.Sprintf("m%d", i),
			Sender: envelope.Party{Name: "alice", Host: "h1"}, Body: b}})
	}
	return out
}

// One hook's output stays under the limit, whatever waits: the messages
// that do not fit wait, in order, for the next hook and are not
// acknowledged; a long body is a pointer; a message already handed into
// this conversation is acknowledged and not shown again.
func TestPickHookBudget(t *testing.T) {
	dir := t.TempDir()
	token, _ := ident.Issue(ident.NewGid("h1"))
	frame := func(env *envelope.Envelope) (string, error) { return hookFrame(dir, token, env) }
	none := func(string) bool { return false }
	for _, cliName := range []string{"claude", "codex", "gemini", "opencode", "copilot"} {
		for ev, shape := range hookShapes[cliName] {
			// 1.5 KB bodies: five fit in 9,000 characters, not sixteen
			bodies := make([]string, 16)
			for i := range bodies {
				bodies[i] = strings.Repeat(fmt.Sprintf("%x", i), 1500)
			}
			d := pickHook(shape, hookBatchOf(bodies...), none, frame, io.Discard)
			if len(d.out) > hookLimit || len(d.out) > 10000 {
				t.Errorf("%s %s: %d bytes out", cliName, ev, len(d.out))
			}
			if len(d.handed) == 0 || len(d.handed) == 16 || d.left != 16-len(d.handed) {
				t.Errorf("%s %s: handed %d, left %d", cliName, ev, len(d.handed), d.left)
			}
			for i, id := range d.acks {
				if id != fmt.Sprintf("m%d", i) {
					t.Errorf("%s %s: acks %v are not the oldest in order", cliName, ev, d.acks)
				}
			}
			if shape.wake || shape.plain { // plain text
				if !strings.HasPrefix(string(d.out), hookIntro) || !strings.Contains(string(d.out), "more fleet message(s) wait") {
					t.Errorf("%s %s: %s", cliName, ev, d.out)
				}
				continue
			}
			var v map[string]any
			if err := json.Unmarshal(d.out, &v); err != nil {
				t.Fatalf("%s %s: not JSON: %v", cliName, ev, err)
			}
			text := fmt.Sprint(v["reason"])
			if shape.flat { // Copilot's: {"additionalContext": TEXT}, nothing else
				text, _ = v["additionalContext"].(string)
				if len(v) != 1 {
					t.Errorf("%s %s: %s", cliName, ev, d.out)
				}
			} else if !shape.stop {
				text = v["hookSpecificOutput"].(map[string]any)["additionalContext"].(string)
				if v["hookSpecificOutput"].(map[string]any)["hookEventName"] != shape.event {
					t.Errorf("%s %s: %s", cliName, ev, d.out)
				}
			} else if v["decision"] != shape.block {
				t.Errorf("%s %s: %s", cliName, ev, d.out)
			}
			if !strings.Contains(text, fmt.Sprintf("(%d more fleet message(s) wait", d.left)) {
				t.Errorf("%s %s: no line for the %d waiting: %s", cliName, ev, d.left, text)
			}
		}
	}

	// a 50 KiB body: a pointer to the command that prints it, its
	// message kept whole in a private file of the entity's
	big := strings.Repeat("y", 50<<10)
	d := pickHook(hookShapes["claude"]["tool"], hookBatchOf(big), none, frame, io.Discard)
	if len(d.handed) != 1 || len(d.out) > 1000 || !strings.Contains(string(d.out), "(a body of 51200 bytes, too long for this hook: read it with fleet-recv --id m0)") {
		t.Fatalf("50 KiB: handed %v, %d bytes: %s", d.handed, len(d.out), d.out)
	}
	path, err := keptPath(dir, token, "m0")
	if err != nil {
		t.Fatal(err)
	}
	var kept message
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &kept) != nil || kept.Type != "message" || kept.Body != big || kept.MsgID != "m0" {
		t.Fatalf("the kept copy %s: %v (%d bytes)", path, err, len(b))
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s is %v", path, fi.Mode())
	}
	if strings.Contains(path, "m0") || filepath.Dir(path) != filepath.Join(dir, "hook-bodies") {
		t.Errorf("kept at %s", path)
	}

	// seen in this conversation: acknowledged, not shown
	d = pickHook(hookShapes["claude"]["prompt"], hookBatchOf("old", "new"), func(id string) bool { return id == "m0" }, frame, io.Discard)
	if strings.Join(d.acks, ",") != "m0,m1" || strings.Join(d.handed, ",") != "m1" || strings.Contains(string(d.out), "old") {
		t.Fatalf("seen m0: acks %v handed %v out %s", d.acks, d.handed, d.out)
	}
	if !strings.Contains(string(d.out), deliver.FrameOpen+"alice@h1 · msg m1 · send]") {
		t.Errorf("out %s", d.out)
	}
}

// The seen file of a session survives the hook process.
func TestSeenFile(t *testing.T) {
	dir := t.TempDir()
	s := openSeen(dir, "sess-1")
	if err := s.add([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	s2 := openSeen(dir, "sess-1")
	if !s2.has("a") || !s2.has("b") || s2.has("c") || openSeen(dir, "sess-2").has("a") {
		t.Fatal("seen file not per session")
	}
}

// runRecvApp runs fleet-recv in this process with args, FLEET_TOKEN token
// and the state folder dir; it returns the exit code, stdout and stderr.
func runRecvApp(t *testing.T, dir, token, stdin string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("FLEET_STATE_DIR", dir)
	t.Setenv("FLEET_SOCKET", filepath.Join(dir, "no-gateway.sock"))
	t.Setenv("FLEET_TOKEN", token)
	app := NewRecvApp()
	var out, errb strings.Builder
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(stdin), &out, &errb
	code := Main(app, append([]string{"fleet-recv"}, args...))
	return code, out.String(), errb.String()
}

// fleet-recv --id prints the caller's own kept copy, framed or as JSON;
// another entity's credential finds nothing (67), a msg id out of its
// grammar is refused before any file is looked at (64), and a link
// planted where the copy would be is refused, not read through.
func TestRecvID(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	mine, _ := ident.Issue(ident.NewGid("h1"))
	theirs, _ := ident.Issue(ident.NewGid("h1"))
	id := envelope.NewID()
	body := strings.Repeat("line of a long body \x1b[2J\n", 200)
	env := &envelope.Envelope{Kind: envelope.Send, MsgID: id, Sender: envelope.Party{Name: "alice", Host: "h1"}, Body: body}
	if f, err := hookFrame(dir, mine, env); err != nil || !strings.Contains(f, "read it with fleet-recv --id "+id+")") {
		t.Fatalf("hookFrame: %v\n%s", err, f)
	}

	code, out, errs := runRecvApp(t, dir, mine, "", "--id", id)
	if code != 0 || out != deliver.Frame(env)+"\n" || errs != "" {
		t.Fatalf("--id: exit %d, stderr %q, stdout\n%s", code, errs, out)
	}
	if !strings.Contains(out, "\n│ line of a long body ␛[2J\n") {
		t.Errorf("the body is not whole and inert:\n%s", out[:200])
	}
	code, out, _ = runRecvApp(t, dir, mine, "", "--id", id, "--json")
	var m message
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil || m.Type != "message" || m.Body != body || m.MsgID != id {
		t.Fatalf("--id --json: exit %d: %.200s", code, out)
	}

	for _, c := range []struct {
		token, id string
		code      int
		err       string
	}{
		{theirs, id, 67, "no kept copy of message " + id},
		{mine, envelope.NewID(), 67, "no kept copy"},
		{mine, "../../credentials/x", 64, "is not a msg id"},
		{mine, "a b", 64, "is not a msg id"},
		{mine, "", 64, "is not a msg id"},
		{"", id, 77, "no credential"},
		{"fleet1.nonsense", id, 77, "credential"},
	} {
		code, out, errs := runRecvApp(t, dir, c.token, "", "--id", c.id)
		if code != c.code || out != "" || !strings.Contains(errs, c.err) || !strings.Contains(errs, "fleet-recv: hint: ") && c.code != 77 {
			t.Errorf("--id %q (token %.20s): exit %d, stdout %q, stderr %q; want %d, %q", c.id, c.token, code, out, errs, c.code, c.err)
		}
	}
	if code, _, errs := runRecvApp(t, dir, mine, "", "--id", id, "--follow"); code != 64 || !strings.Contains(errs, "--id takes no --follow") {
		t.Errorf("--id --follow: %d %s", code, errs)
	}

	// a link where another entity's copy would be: refused, not followed
	other := envelope.NewID()
	target := filepath.Join(dir, "secret")
	os.WriteFile(target, []byte(`{"type":"message","msg_id":"`+other+`","body":"stolen"}`), 0o600)
	path, _ := keptPath(dir, mine, other)
	os.Symlink(target, path)
	if code, out, errs := runRecvApp(t, dir, mine, "", "--id", other); code != 77 || strings.Contains(out, "stolen") || !strings.Contains(errs, "symbolic link") {
		t.Errorf("--id through a link: exit %d, %q, %q", code, out, errs)
	}
}

// A turn's end prunes: kept copies older than 7 days, per-session records
// older than 30 days; the rest stays — even when the hook takes nothing
// (no gateway), and the hook still exits 0.
func TestHookStopPrunes(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	token, _ := ident.Issue(ident.NewGid("h1"))
	now := time.Now()
	files := map[string]time.Duration{
		"hook-bodies/old.json":   8 * 24 * time.Hour,
		"hook-bodies/young.json": 6 * 24 * time.Hour,
		"hook-seen/old":          31 * 24 * time.Hour,
		"hook-seen/young":        8 * 24 * time.Hour,
		"hook-turn/old":          31 * 24 * time.Hour,
		"hook-wake/old":          31 * 24 * time.Hour,
		"hook-wake/young":        time.Hour,
	}
	for name, age := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, now.Add(-age), now.Add(-age))
	}
	for _, ev := range []string{"prompt", "tool"} {
		if code, _, _ := runRecvApp(t, dir, token, `{"session_id":"s1"}`, "--hook", "gemini", "--event", ev); code != 0 {
			t.Fatalf("%s: exit %d", ev, code)
		}
		if _, err := os.Stat(filepath.Join(dir, "hook-bodies/old.json")); err != nil {
			t.Fatalf("the %s hook pruned: %v", ev, err)
		}
	}
	code, out, errs := runRecvApp(t, dir, token, `{"session_id":"s1"}`, "--hook", "gemini", "--event", "stop")
	if code != 0 || out != "{}\n" || !strings.Contains(errs, "no gateway") {
		t.Fatalf("stop with no gateway: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for name := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if gone := err != nil; gone != strings.HasSuffix(strings.TrimSuffix(name, ".json"), "old") {
			t.Errorf("%s: gone %v", name, gone)
		}
	}
}

// The human view of an ASK (fleet-recv on a terminal) says by when and
// with which command to answer it, as the frame does.
func TestPrintHumanAsk(t *testing.T) {
	ask := &envelope.Envelope{Kind: envelope.Ask, MsgID: "m1", Sender: envelope.Party{Name: "alice", Host: "h1"},
		Body: "ready?", Created: time.Now(), Expires: time.Date(2026, 12, 1, 14, 30, 5, 0, time.UTC)}
	var b strings.Builder
	w := bufio.NewWriter(&b)
	if err := printHuman(w, ask); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	head, _, _ := strings.Cut(b.String(), "\n")
	deadline := ask.Expires.Local().Format("2006-01-02 15:04:05 Z07:00")
	if !strings.Contains(head, " · answer by "+deadline+" · answer: fleet-send --answer m1 TEXT") {
		t.Errorf("ASK header %q", head)
	}
	b.Reset()
	ask.Kind = envelope.Send
	printHuman(w, ask)
	w.Flush()
	if strings.Contains(b.String(), "answer") {
		t.Errorf("a SEND says answer: %q", b.String())
	}
}

// Copilot CLI names the session sessionId; the others session_id. Either
// keys the seen file; session_id wins when both come.
func TestReadHookInputSession(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"session_id":"s1"}`, "s1"},
		{`{"sessionId":"c1","timestamp":1,"prompt":"x"}`, "c1"},
		{`{"session_id":"s1","sessionId":"c1"}`, "s1"},
		{`not json`, ""},
	} {
		if got := readHookInput(strings.NewReader(c.in)).SessionID; got != c.want {
			t.Errorf("readHookInput(%s) = %q, want %q", c.in, got, c.want)
		}
	}
}
