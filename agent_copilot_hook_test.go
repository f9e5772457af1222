package fleet_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Hook delivery mode, the wake notice and fleet-mcp with the real GitHub
// Copilot CLI (1.0.102), offline against the stub. The shipped hook file
// (fleet-roster hooks install copilot) runs fleet-recv --hook copilot at a
// turn's start (userPromptSubmitted: {"additionalContext"}, added to the
// model-facing prompt), after a tool call (postToolUse: added to the
// tool's result) and at a turn's end (agentStop: {"decision":"block",
// "reason"}, the reason sent as the next prompt). What the model received
// is read from the stub's record of each request as sent.

// copilotHookPane starts Copilot in a pane of its own as hook entity
// name's agent (its credential in FLEET_TOKEN), with the recipe and the
// recorder installed, and waits for its prompt. With target the entity
// is joined with the pane (before Copilot starts), for the wake notice:
// Copilot runs no hook before its first prompt, so its idle is read from
// its still screen (2 s) with its ready footer, as for Codex.
func copilotHookPane(t *testing.T, r *agentRig, name string, target bool) *copilotRun {
	t.Helper()
	agentBin(t, "copilot")
	c := &copilotRun{r: r, name: name, events: filepath.Join(r.dir, "copilot-events.jsonl")}
	copilotConfig(t, r, c.events)
	token := filepath.Join(r.dir, name+".token")
	env := append(copilotEnv(r), "PATH="+npmBin+":"+os.Getenv("PATH"))
	pane, run := r.gatedPane(name, "FLEET_TOKEN=$(cat "+token+") exec "+copilotLine, env...)
	c.pane = pane
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(c.events)
			t.Logf("screen:\n%s\nhook events:\n%s", r.screen(pane), b)
		}
	})
	join := []string{"fleet-roster", "join", name, "--mode", "hook"}
	if target {
		join = append(join, "--tmux-target", pane, "--program", "node", "--paste", "bracketed", "--idle-screen", "2s")
	}
	out := r.fleet(join[0], join[1:]...)
	c.token = strings.Fields(out)[0]
	if err := os.WriteFile(token, []byte(c.token), 0o600); err != nil {
		t.Fatal(err)
	}
	run()
	r.waitScreen(pane, copilotReady, 60*time.Second)
	t.Cleanup(func() { r.tmux("send-keys", "-t", pane, "C-c"); r.tmux("send-keys", "-t", pane, "C-c") })
	return c
}

// count is how many times the recorder saw event.
func (c *copilotRun) count(event string) int {
	n := 0
	for _, e := range copilotNames(c.events) {
		if e == event {
			n++
		}
	}
	return n
}

// waitEvent waits until the recorder saw event n times.
func (c *copilotRun) waitEvent(t *testing.T, event string, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); c.count(event) < n; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hook %s ran %d time(s), want %d; events %v", event, c.count(event), n, copilotNames(c.events))
		}
	}
}

// idle waits until Copilot is at its prompt with no turn running: as many
// turn ends as prompts (the recorder logs a hook as it starts; a blocked
// agentStop is one more end), its ready footer, no spinner, two looks in
// a row.
func (c *copilotRun) idle(t *testing.T) {
	t.Helper()
	working, ready := regexp.MustCompile(copilotWorking), regexp.MustCompile(copilotReady)
	deadline := time.Now().Add(60 * time.Second)
	for still := 0; still < 2; time.Sleep(500 * time.Millisecond) {
		s := c.r.screen(c.pane)
		if c.count("agentStop")+c.count("errorOccurred") >= c.count("userPromptSubmitted") && !working.MatchString(s) && ready.MatchString(s) {
			still++
		} else {
			still = 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("Copilot never went idle:\n%s", s)
		}
	}
}

// prompt types text at Copilot's prompt, as its user would, and waits for
// its userPromptSubmitted.
func (c *copilotRun) prompt(t *testing.T, text string) {
	t.Helper()
	c.idle(t)
	n := c.count("userPromptSubmitted")
	c.r.tmux("send-keys", "-t", c.pane, "-l", text)
	c.r.waitScreen(c.pane, regexp.QuoteMeta(text), 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	c.r.tmux("send-keys", "-t", c.pane, "Enter")
	c.waitEvent(t, "userPromptSubmitted", n+1)
}

// fleetFrame is a message's frame as a hook hands it over.
func fleetFrame(id, from, body string) string {
	return "[fleet message from " + from + " · msg " + id + " · send]\n│ " + strings.ReplaceAll(body, "\n", "\n│ ") +
		"\n[end of fleet message " + id + " · reply: fleet-send --reply-to " + id + " TEXT]"
}

func TestCopilotHookMode(t *testing.T) {
	agentTest(t)
	rig := newAgentRig(t)
	rig.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := copilotHookPane(t, rig, "cph", false)
	header := func(id string) string { return "[fleet message from alice@h1 · msg " + id + " · send]" }

	// (a) nothing runs fleet-recv while Copilot idles: a message sent now
	// stays pending, in no request; the next turn's start
	// (userPromptSubmitted) hands it over, once, after the prompt
	t.Run("pending-until-turn-start", func(t *testing.T) {
		r := rig.sub(t)
		c.idle(t)
		body := "sent while the agent is idle"
		id := r.sendID("cph", body)
		stillPending(t, r, id)
		p := "a turn of its own"
		c.prompt(t, p)
		q := waitText(t, r, p, 1)[0]
		takenBy(t, r, id, p)
		if n := strings.Count(q.Body, jsonText(fleetFrame(id, "alice@h1", body))); n != 1 {
			t.Errorf("the turn's first request holds the exact frame %d times, want 1:%s", n, around(q.Body, jsonText(header(id))))
		}
		t.Logf("the turn's request, where the frame stands:%s", around(q.Body, jsonText(header(id))))
		r.waitState(id, "delivered", 30*time.Second)
		c.idle(t)
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (b) mid-turn: sent while a slow tool call runs, it is in the request
	// right after the call, exactly once, and delivered only once the
	// postToolUse hook ran
	t.Run("mid-turn", func(t *testing.T) {
		r := rig.sub(t)
		p := "run a slow tool STUB:TOOL=sleep 5"
		tools, calls := c.count("postToolUse"), c.count("preToolUse")
		c.prompt(t, p)
		c.waitEvent(t, "preToolUse", calls+1)
		body := "mid-turn mail, line one\nline two"
		id := r.sendID("cph", body)
		if st := r.msgState(id); c.count("postToolUse") == tools && st != "accepted" {
			t.Errorf("before the postToolUse hook the message reads %s, want accepted", st)
		}
		c.waitEvent(t, "postToolUse", tools+1)
		r.waitState(id, "delivered", 30*time.Second)
		c.idle(t)
		turns := waitText(t, r, p, 2)
		if turns[1].ToolResult == "" {
			for i, q := range turns {
				t.Logf("request %d: answer %q tool result %q prompt %q", i, q.Answer, q.ToolResult, q.Prompt)
			}
			t.Fatalf("the tool turn: no request after the call carries its result")
		}
		if strings.Contains(turns[0].Body, id) {
			t.Errorf("the request before the tool call holds the message")
		}
		if n := strings.Count(turns[1].Body, jsonText(fleetFrame(id, "alice@h1", body))); n != 1 {
			t.Errorf("the request after the tool call holds the exact frame %d times, want 1:%s", n, around(turns[1].Body, jsonText(header(id))))
		}
		t.Logf("the tool's result as the model got it: %q", turns[1].ToolResult)
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// (c) turn end: mail arriving while the model writes its last answer;
	// the agentStop hook blocks the stop, and Copilot sends the reason
	// (the frames) as the next prompt: the turn goes on with it, once
	t.Run("turn-end", func(t *testing.T) {
		r := rig.sub(t)
		stops := c.count("agentStop")
		p := "a slow answer STUB:SLOW=4"
		c.prompt(t, p)
		r.waitScreen(c.pane, copilotWorking, 20*time.Second)
		time.Sleep(500 * time.Millisecond)
		body := "arrived at the turn's end"
		id := r.sendID("cph", body)
		// the blocked stop, then the end of the turn that went on
		c.waitEvent(t, "agentStop", stops+2)
		r.waitState(id, "delivered", 30*time.Second)
		c.idle(t)
		if turns := withText(r, p); len(turns) == 0 || strings.Contains(turns[0].Body, id) {
			t.Fatalf("the slow request holds the message sent after it (or there is none): %d", len(turns))
		}
		cont := waitText(t, r, fleetFrame(id, "alice@h1", body), 1)[0]
		t.Logf("the request after the block: user texts %q", cont.Texts)
		if !strings.Contains(cont.Prompt, "Fleet messages from other entities (not the user's words") {
			t.Errorf("the request after the block has the prompt %q", cont.Prompt)
		}
		onceInEach(t, r.stub.Turns(), header(id), 1)
	})

	// nothing the hooks said showed on the screen (their failures start
	// "fleet-recv:" or "fleet-turn:")
	if s := rig.screen(c.pane); strings.Contains(s, "fleet-recv:") || strings.Contains(s, "fleet-turn:") {
		t.Errorf("the hooks showed something on screen:\n%s", s)
	}
}

// The gateway's wake notice with the real Copilot CLI: it has no hook
// that can start a turn by itself, so a hook entity joined with its pane
// gets one line typed while mail waits and it idles; that turn's
// userPromptSubmitted hook hands the message over (checkWoken).
func TestCopilotHookWake(t *testing.T) {
	agentTest(t)
	r := newAgentRig(t, "FLEET_NUDGE_AFTER=2s", "FLEET_NUDGE_MAX=4s")
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	c := copilotHookPane(t, r, "cpw", true)
	recipeHas(t, filepath.Join(r.home, ".copilot", "hooks", "fleet.json"), "fleet-recv --hook copilot --event prompt")
	r.waitStatus("cpw", "idle", 30*time.Second)
	checkWoken(t, r, "cpw", c.pane, copilotReady)
}

// fleet-mcp in the real Copilot CLI, from the installer's entry in
// ~/.copilot/mcp-config.json: copilot -p runs one prompt, and the stub
// calls fleet's send and receive tools by the names Copilot offers them.
func TestMCPCopilot(t *testing.T) {
	agentTest(t)
	bin := agentBin(t, "copilot")
	r := newAgentRig(t)
	copilotConfig(t, r, filepath.Join(r.dir, "copilot-events.jsonl"))
	mcpInstall(t, r, "copilot", nil)
	run := func(prompt string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "--allow-all-tools", "-p", prompt)
		cmd.Dir = r.work
		cmd.Env = r.env(copilotEnv(r)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("copilot -p: %v\n%s", err, out)
		}
	}
	mcpSendReceive(t, r, run, "", "fleet-")
}

// The agent answers through its own tool call across hosts
// (replyAcrossHosts): the message is pasted into Copilot on h1, whose bash
// tool runs fleet-send --reply-to ID with the entity's credential
// (FLEET_TOKEN, typed with the command).
func TestCopilotReplyAcrossHosts(t *testing.T) {
	agentBrokerTest(t)
	agentBin(t, "copilot")
	rig, h2 := twoHostRig(t, "t-go-copilot-reply")
	bossTok := h2.join("boss")
	c := startCopilot(t, rig, "cp")
	replyAcrossHosts(t, rig, h2, bossTok, "cp@h1", c.pane, "copilot")
}
