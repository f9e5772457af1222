package fleet_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/stubmodel"
)

// An ASK across two gateways, answered by the real Claude Code in hook
// mode through its own tool call: boss on h2 runs fleet-ask hooked@h1 and
// waits; the ask crosses the real broker into hooked's inbox on h1, where
// the recipe's hooks hand it to the model (the idle wake, or after a tool
// call), framed with its deadline and the command that answers it; the
// model's Bash call runs fleet-send --answer ID with the entity's
// credential, and boss's fleet-ask prints the answer. An ask no hook takes
// expires: the asker is told so, and the record says where it stopped.
func TestClaudeCodeHookAskAcrossHosts(t *testing.T) {
	agentBrokerTest(t)
	agentBin(t, "claude")
	rig, h2 := twoHostRig(t, "t-go-agent-hookask")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(h2.log())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("h2's log (its end):\n%s", b)
		}
	})
	bossTok := h2.join("boss")
	boss := func(args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(binDir, args[0]), args[1:]...)
		cmd.Env = append(h2.env, "FLEET_TOKEN="+bossTok, "PATH="+binDir+":"+os.Getenv("PATH"))
		return cmd
	}

	c := &claudeRun{r: rig, name: "hooked", hooks: filepath.Join(rig.dir, "claude-hooks.jsonl")}
	claudeConfig(t, rig, c.hooks)
	out := rig.fleet("fleet-roster", "join", c.name, "--mode", "hook")
	c.token = strings.Fields(out)[0]
	// h2 hears of hooked@h1 within a presence interval or two
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := boss("fleet-roster", "--json").Output()
		if regexp.MustCompile(`"name":"hooked","host":"h1"`).Match(b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h2 never listed hooked@h1:\n%s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// ask runs boss's fleet-ask hooked@h1 in the background
	type result struct {
		out, err string
		code     int
	}
	ask := func(t *testing.T, ttl time.Duration, question string) (wait func() result) {
		cmd := boss("fleet-ask", "--ttl", ttl.String(), "hooked@h1", question)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan result, 1)
		go func() {
			err := cmd.Wait()
			done <- result{o.String(), e.String(), exitCode(err)}
		}()
		t.Cleanup(func() { cmd.Process.Kill() })
		return func() result {
			select {
			case r := <-done:
				return r
			case <-time.After(ttl + 30*time.Second):
				cmd.Process.Kill()
				t.Fatalf("fleet-ask did not end within its TTL and 30s:\n%s", rig.screen(c.pane))
				return result{}
			}
		}
	}
	// askFrame is the ask's frame as the model must get it: who asks,
	// the id, the deadline (UTC, to the second), the body, the answer
	askFrame := regexp.MustCompile(`\[fleet message from boss@h2 · msg ([0-9a-f-]{36}) · ask · answer by ` +
		`(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\]\n│ ([^\n]*)\n\[end of fleet message ([0-9a-f-]{36}) · answer: fleet-send --answer ([0-9a-f-]{36}) TEXT\]`)
	// handed finds the frame of the ask whose body is body in the
	// requests, checks it, and returns the ask's id and the index of the
	// first request that holds it
	handed := func(t *testing.T, reqs []stubmodel.Request, body string, asked time.Time, ttl time.Duration) (string, int) {
		t.Helper()
		for i, q := range reqs {
			for _, m := range askFrame.FindAllStringSubmatch(stubText(q.Body), -1) {
				if m[3] != body {
					continue
				}
				if m[1] != m[4] || m[1] != m[5] {
					t.Errorf("the frame names three ids: %q", m[0])
				}
				by, err := time.Parse(time.RFC3339, m[2])
				if err != nil || by.Before(asked.Add(ttl).Add(-time.Second).Truncate(time.Second)) || by.After(time.Now().Add(ttl)) {
					t.Errorf("the ask's deadline %s (%v) is not its TTL %v after it was asked at %s", m[2], err, ttl, asked.UTC().Format(time.RFC3339))
				}
				return m[1], i
			}
		}
		t.Fatalf("no request holds the ask's frame with body %q", body)
		return "", 0
	}
	// traceOf is the trace id of ask id, from h2's audit log
	traceOf := func(t *testing.T, id string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(rig.dir, "h2", "audit.log"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`"trace_id":"([^"]+)","msg_id":"` + id + `"`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("h2's audit log holds no line of ask %s", id)
		}
		return string(m[1])
	}
	// trace is fleet-trace of a flow as boss on h2 sees it, once it holds
	// every hop of want
	trace := func(t *testing.T, id string, want ...string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var o, e strings.Builder
			cmd := boss("fleet-trace", "--json", id)
			cmd.Stdout, cmd.Stderr = &o, &e
			if err := cmd.Run(); err != nil {
				t.Fatalf("fleet-trace %s: %v\n%s%s", id, err, o.String(), e.String())
			}
			missing := ""
			for _, w := range want {
				if !strings.Contains(o.String(), w) {
					missing = w
				}
			}
			if missing == "" {
				return o.String()
			}
			if time.Now().After(deadline) {
				t.Fatalf("the trace lacks %s:\n%s", missing, o.String())
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// no hook runs (the agent is not started yet): the ask waits in
	// hooked's inbox on h1 until it expires; the asker is told, and the
	// record says the askee never took it
	t.Run("no-hook-expires", func(t *testing.T) {
		const ttl = 6 * time.Second
		q := "anyone there? STUB:TOOL=fleet-send --answer {MSGID} too late"
		wait := ask(t, ttl, q)
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(rig.fleet("fleet-roster", "whoami", "--json", "--as", c.name), `"asks_waiting":1`) {
			if time.Now().After(deadline) {
				t.Fatalf("the ask never waited in hooked's inbox: %s", rig.fleet("fleet-roster", "whoami", "--json", "--as", c.name))
			}
			time.Sleep(100 * time.Millisecond)
		}
		r := wait()
		m := regexp.MustCompile(`^fleet-ask: error: no answer to ask ([0-9a-f-]{36}) within 6s\n` +
			`fleet-ask: hint: fleet-trace ([0-9a-f-]{36}) shows where the ask stopped \(drained or injected: the askee was shown it; expired: it never was\)\n$`).FindStringSubmatch(r.err)
		if r.code != 75 || r.out != "" || m == nil {
			t.Fatalf("fleet-ask: exit %d, stdout %q, stderr %q; want 75, nothing, the error and a hint", r.code, r.out, r.err)
		}
		t.Logf("fleet-ask said:\n%s", r.err)
		if tid := traceOf(t, m[1]); tid != m[2] {
			t.Errorf("the hint names trace %s, the ask's is %s", m[2], tid)
		}
		// the hint's command, as the asker would run it
		tr := trace(t, m[2],
			`"host":"h2","entity":"boss","kind":"ASK","msg_id":"`+m[1]+`","event":"asked"`,
			`"host":"h1","entity":"hooked","kind":"ASK","msg_id":"`+m[1]+`","event":"taken"`,
			`"host":"h1","entity":"hooked","kind":"ASK","msg_id":"`+m[1]+`","event":"expired"`)
		t.Logf("fleet-trace:\n%s", tr)
		if strings.Contains(tr, `"event":"drained"`) {
			t.Errorf("the trace says the unseen ask was drained")
		}
		if me := rig.fleet("fleet-roster", "whoami", "--json", "--as", c.name); !strings.Contains(me, `"name":"hooked"`) || strings.Contains(me, `"asks_waiting"`) {
			t.Errorf("the expired ask still waits: %s", me)
		}
	})

	// Claude Code starts with the entity's credential; a first turn of
	// its own runs the recipe's hooks — the expired ask is not handed —
	// and its end starts the wake hook
	c.startInPane(t)
	prompt := c.prompt
	count := func(event string) int { return c.hookCount(t, event) }
	prompt("a first turn of its own")
	c.waitHook(t, "Stop", 1)
	rig.waitScreen(c.pane, claudeReady, 20*time.Second)
	for i, q := range rig.stub.Requests() {
		if strings.Contains(q.Body, "anyone there?") {
			t.Fatalf("request %d holds the expired ask", i)
		}
	}

	// idle: the wake hook takes the ask and wakes the agent with it; the
	// model's tool call answers, and fleet-ask on h2 prints the answer
	t.Run("idle-wakes", func(t *testing.T) {
		const ttl = 90 * time.Second
		before := len(rig.stub.Requests())
		body := "which branch, idle? STUB:TOOL=fleet-send --answer {MSGID} main, from the idle agent"
		asked := time.Now()
		r := ask(t, ttl, body)()
		if r.code != 0 || r.out != "main, from the idle agent\n" || r.err != "" {
			t.Fatalf("fleet-ask: exit %d, stdout %q, stderr %q; want 0 and the answer\nscreen:\n%s", r.code, r.out, r.err, rig.screen(c.pane))
		}
		reqs := rig.stub.Requests()
		id, i := handed(t, reqs, body, asked, ttl)
		if i < before {
			t.Fatalf("a request before the ask holds it")
		}
		checkAnswered(t, rig, i, id, "main, from the idle agent")
		onceInEach(t, rig.stub.Requests(), "[fleet message from boss@h2 · msg "+id+" · ask", 1)
		tr := trace(t, traceOf(t, id), `"msg_id":"`+id+`","event":"drained"`, `"kind":"ANSWER"`)
		if strings.Contains(tr, `"event":"expired"`) {
			t.Errorf("the trace of the answered ask:\n%s", tr)
		}
	})

	// mid-turn: the ask arrives during a slow tool call; the hook after
	// the call hands it, and the model answers before it ends its turn
	t.Run("mid-turn", func(t *testing.T) {
		const ttl = 90 * time.Second
		p := "run a slow tool STUB:TOOL=sleep 4"
		stops := count("Stop")
		prompt(p)
		c.waitHook(t, "PreToolUse", count("PreToolUse")+1)
		body := "which branch, mid-turn? STUB:TOOL=fleet-send --answer {MSGID} main, from the busy agent"
		asked := time.Now()
		r := ask(t, ttl, body)()
		if r.code != 0 || r.out != "main, from the busy agent\n" || r.err != "" {
			t.Fatalf("fleet-ask: exit %d, stdout %q, stderr %q; want 0 and the answer\nscreen:\n%s", r.code, r.out, r.err, rig.screen(c.pane))
		}
		c.waitHook(t, "Stop", stops+1)
		turns := waitTurnsWith(t, rig, p, 3)
		id, _ := handed(t, turns, body, asked, ttl)
		_, at := handed(t, rig.stub.Requests(), body, asked, ttl)
		if strings.Contains(turns[0].Body, id) || turns[0].Answer != "tool_use Bash: sleep 4" {
			t.Errorf("the turn's first request: answer %q, holds the ask: %v", turns[0].Answer, strings.Contains(turns[0].Body, id))
		}
		if turns[1].ToolResult == "" || !strings.Contains(turns[1].Body, jsonText("[fleet message from boss@h2 · msg "+id)) {
			t.Fatalf("the request after the slow tool call (tool result %q) does not hold the ask", turns[1].ToolResult)
		}
		if turns[1].Time != rig.stub.Requests()[at].Time {
			t.Fatalf("the ask was first handed in request %d, not the one after the slow tool call", at)
		}
		checkAnswered(t, rig, at, id, "main, from the busy agent")
		onceInEach(t, rig.stub.Requests(), "[fleet message from boss@h2 · msg "+id+" · ask", 1)
	})
}

// checkAnswered: the stub's request i (the one the ask was handed in) is
// answered with the tool call fleet-send --answer id text, and a later
// request carries the call's result: the answer's msg and trace ids, no
// error. (The asker may have its answer before the call returns.)
func checkAnswered(t *testing.T, r *agentRig, i int, id, text string) {
	t.Helper()
	if want := "tool_use Bash: fleet-send --answer " + id + " " + text; r.stub.Requests()[i].Answer != want {
		t.Fatalf("the model's answer to the ask's request: %q, want %q", r.stub.Requests()[i].Answer, want)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, q := range r.stub.Requests()[i+1:] {
			if q.Turn && q.ToolResult != "" {
				if !regexp.MustCompile(`^[0-9a-f-]{36} [0-9a-f-]{36}$`).MatchString(q.ToolResult) {
					t.Errorf("fleet-send --answer in the agent printed %q, want its msg and trace ids", q.ToolResult)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request carries the result of fleet-send --answer")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stubText is a request body with the JSON string escapes of newlines
// and quotes undone, for matching frames across lines.
func stubText(body string) string {
	return strings.NewReplacer(`\n`, "\n", `\"`, `"`).Replace(body)
}
