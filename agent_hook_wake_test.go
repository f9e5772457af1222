package fleet_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
)

// The gateway's wake notice (pkg/gateway/wake.go) with the real Codex and
// Gemini CLIs: neither has a hook that can start a turn by itself, so a
// hook entity joined with its pane gets, while mail waits and the agent
// idles at its prompt, one line typed into the pane — a count, no byte of
// the message. The turn it starts runs the CLI's prompt hook (fleet-recv
// --hook CLI --event prompt), which hands the message to the model, framed,
// in that turn's request, once; it reads delivered then, and no second
// notice follows. What the model received is read from the stub's record
// of each request as sent.

// wakeMarker opens the gateway's wake notice (wake.go wakeLine).
const wakeMarker = "(typed by fleet, not by your user)"

// wakeNotice is the notice for n messages.
func wakeNotice(n int) string {
	return fmt.Sprintf("%s %d fleet message(s) wait: they come with this turn", wakeMarker, n)
}

// recipeHas fails the test unless the installed recipe at path runs
// command (the prompt hook that takes the mail in the notice's turn).
func recipeHas(t *testing.T, path, command string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"`+command+`"`) {
		t.Fatalf("the installed recipe %s has no %q:\n%s", path, command, b)
	}
}

// wakeTurn waits for the first turn whose request holds the notice, and
// returns its index among the stub's requests and the requests so far.
func wakeTurn(t *testing.T, r *agentRig, within time.Duration) (int, []stubmodel.Request) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		reqs := r.stub.Requests()
		for i, q := range reqs {
			if q.Turn && strings.Contains(q.Body, jsonText(wakeMarker)) {
				return i, reqs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no turn of the model had the wake notice within %v; turns: %q", within, promptsOf(r.stub.Turns()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkWoken is the common half of both tests: entity name's agent, idle
// at its prompt in pane, gets a message from alice; the notice wakes it,
// the frame is in the notice turn's request exactly once, the message is
// delivered, no second notice follows, and neither the body nor its id
// was ever typed into the pane.
func checkWoken(t *testing.T, r *agentRig, name, pane, idle string) {
	t.Helper()
	body := "the wake body from alice, never typed"
	mark := r.logMark()
	id := r.sendID(name, body)
	header := "[fleet message from alice@h1 · msg " + id + " · send]"
	i, reqs := wakeTurn(t, r, 90*time.Second)
	q := reqs[i]
	if !strings.Contains(q.Body, jsonText(wakeNotice(1))) {
		t.Errorf("the notice turn's request has no %q:\n%s", wakeNotice(1), around(q.Body, jsonText(wakeMarker)))
	}
	if n := strings.Count(q.Body, jsonText(header)); n != 1 {
		t.Errorf("the notice turn's request holds the frame's header %d times, want 1:\n%s", n, q.Body)
	}
	if n := strings.Count(q.Body, jsonText("│ "+body)); n != 1 {
		t.Errorf("the notice turn's request holds the body line %d times, want 1:\n%s", n, q.Body)
	}
	for _, p := range r.stub.Requests() {
		// (side requests too: Gemini's routing request carries the turn)
		if strings.Contains(p.Body, id) && !strings.Contains(p.Body, jsonText(wakeMarker)) {
			t.Errorf("a request without the notice holds the message:\n%s", p.Body)
		}
	}
	r.waitState(id, "delivered", 60*time.Second)
	r.waitStatus(name, "idle", 60*time.Second)
	r.waitScreen(pane, idle, 30*time.Second)
	// the sentinel: the wake loop saw the inbox empty once the message was
	// taken, so no second notice comes (one would be typed, with its turn
	// in the model's requests, before the loop could say so)
	r.waitLog(mark, `"msg":"no wake notice: nothing waits".*"entity":"`+name+`"`, 30*time.Second)
	reqs = r.stub.Requests()
	last := reqs[len(reqs)-1]
	if n := strings.Count(last.Body, jsonText(wakeMarker)); n != 1 {
		t.Errorf("the conversation holds the wake notice %d times, want 1; prompts: %q", n, promptsOf(r.stub.Turns()))
	}
	onceInEach(t, r.stub.Turns(), header, 1)
	if line := r.fleet("fleet-roster", "--json"); !regexp.MustCompile(`"name":"` + name + `".*"pending":0`).MatchString(line) {
		t.Errorf("roster: %s", line)
	}
	s := r.screen(pane)
	for _, leak := range []string{body, id} {
		if strings.Contains(s, leak) {
			t.Errorf("the pane shows %q:\n%s", leak, s)
		}
	}
	if !strings.Contains(s, wakeMarker) {
		t.Errorf("the pane does not show the notice typed:\n%s", s)
	}
	gwLog, _ := os.ReadFile(r.gw.log())
	if n := strings.Count(string(gwLog), `"msg":"wake notice typed"`); n != 1 {
		t.Errorf("the gateway typed %d wake notices, want 1", n)
	}
	if strings.Contains(string(gwLog), "took no mail") {
		t.Errorf("the gateway says the notice's turn took no mail")
	}
}

func TestCodexHookWake(t *testing.T) {
	agentTest(t)
	codex := agentBin(t, "codex")
	r := newCodexRig(t, "FLEET_NUDGE_AFTER=2s", "FLEET_NUDGE_MAX=4s")
	// the shipped recipe, installed and trusted by newCodexRig
	recipeHas(t, filepath.Join(r.codexHome, "hooks.json"), "fleet-recv --hook codex --event prompt")
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	token := filepath.Join(r.dir, "codey.token")
	pane, run := r.gatedPane("codey", "FLEET_TOKEN=$(cat "+token+") exec "+codex+" --no-daemon",
		"CODEX_HOME="+r.codexHome, "STUB_API_KEY=stub-key")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("screen:\n%s", r.screen(pane))
		}
	})
	// Codex runs no hook before its first prompt: idle is read from its
	// still screen (2 s) with its ready prompt, as for inject
	out := r.fleet("fleet-roster", "join", "codey", "--mode", "hook", "--tmux-target", pane,
		"--program", "node", "--paste", "bracketed", "--idle-screen", "2s")
	if err := os.WriteFile(token, []byte(strings.Fields(out)[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	if line := r.rosterLine("codey"); !strings.Contains(line, `"mode":"hook","target":"`+pane+`"`) {
		t.Fatalf("roster after join: %s", line)
	}
	run()
	r.waitScreen(pane, codexReadyRE.String(), 30*time.Second)
	r.waitStatus("codey", "idle", 30*time.Second)
	checkWoken(t, r.agentRig, "codey", pane, codexReadyRE.String())
}

func TestGeminiHookWake(t *testing.T) {
	agentTest(t)
	gemini := agentBin(t, "gemini")
	r := newAgentRig(t, "FLEET_NUDGE_AFTER=2s", "FLEET_NUDGE_MAX=4s")
	events := filepath.Join(r.dir, "events.jsonl")
	geminiSettings(t, r, events)
	recipeHas(t, filepath.Join(r.home, ".gemini", "settings.json"), "fleet-recv --hook gemini --event prompt")
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	token := filepath.Join(r.dir, "gem.token")
	env := append(r.env(), "GEMINI_API_KEY=stub-key", "GOOGLE_GEMINI_BASE_URL="+r.stub.URL())
	pane, run := r.gatedPane("gem", "FLEET_TOKEN=$(cat "+token+") exec "+gemini+" --yolo", env...)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(events)
			t.Logf("screen:\n%s\nhook events:\n%s", r.screen(pane), b)
		}
	})
	// joined before Gemini starts: its program is learnt at its first hook
	out := r.fleet("fleet-roster", "join", "gem", "--mode", "hook", "--tmux-target", pane, "--paste", "bracketed")
	if err := os.WriteFile(token, []byte(strings.Fields(out)[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	run()
	r.waitScreen(pane, geminiIdleRE, 60*time.Second)
	r.waitStatus("gem", "idle", 30*time.Second) // SessionStart → fleet-turn idle
	// (its program learnt from that hook)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(r.rosterLine("gem"), `"program":"node"`); {
		if time.Now().After(deadline) {
			t.Fatalf("roster: %s", r.rosterLine("gem"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkWoken(t, r, "gem", pane, geminiIdleRE)
	var seq []string
	for _, e := range geminiEvents(t, events) {
		seq = append(seq, e["hook_event_name"].(string))
	}
	if got := strings.Join(seq, " "); got != "SessionStart BeforeAgent AfterAgent" {
		t.Errorf("hook events = %q, want one turn: SessionStart BeforeAgent AfterAgent", got)
	}
}
