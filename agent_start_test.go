package fleet_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Each of the five agent CLIs started the three ways people start them
// (issue 40.3), as an inject entity joined before the CLI starts, with a
// message sent before its first prompt:
//
//   - "exec-bash": the pane's command is `CLI; exec bash` (tmux
//     new-session -d "CLI; exec bash");
//   - "wrapper": the pane's command is a script that runs the CLI without
//     exec, then a shell;
//   - "typed": an interactive bash, where the CLI is typed at the prompt.
//
// Started the first two ways the CLI runs in the process group of the
// pane's non-interactive shell, and tmux shows the shell in front:
// nothing proves at paste time that the CLI, not the shell, reads what is
// typed. The entity goes unhooked at once, with the reason (at its first
// hook, or for Codex and Copilot, whose first hook comes only with the
// first prompt, from its process), the message is held, never typed, and
// hooks doctor names the reason. Typed at an interactive shell the CLI is
// recognised, and the message reaches its model once it is ready.

// startCLI is how the test sets one agent CLI up in a rig: its settings
// and fleet's recipe, its command line, its environment, its ready screen.
type startCLI struct {
	name  string
	ready string
	setup func(t *testing.T, r *agentRig) (cmd string, env []string)
}

var startCLIs = []startCLI{
	{"claude", claudeReady, func(t *testing.T, r *agentRig) (string, []string) {
		claudeConfig(t, r, filepath.Join(r.dir, "claude-hooks.jsonl"))
		return agentBin(t, "claude"), claudeEnv(r)
	}},
	{"codex", codexReadyRE.String(), func(t *testing.T, r *agentRig) (string, []string) {
		home := codexSetup(t, r)
		return agentBin(t, "codex") + " --no-daemon", []string{"CODEX_HOME=" + home, "STUB_API_KEY=stub-key"}
	}},
	{"gemini", geminiIdleRE, func(t *testing.T, r *agentRig) (string, []string) {
		geminiSettings(t, r, filepath.Join(r.dir, "events.jsonl"))
		return agentBin(t, "gemini") + " --yolo", []string{"GEMINI_API_KEY=stub-key", "GOOGLE_GEMINI_BASE_URL=" + r.stub.URL()}
	}},
	{"opencode", opencodeReady, func(t *testing.T, r *agentRig) (string, []string) {
		opencodeConfig(t, r, filepath.Join(r.dir, "opencode-events.jsonl"))
		return agentBin(t, "opencode"), opencodeEnv()
	}},
	{"copilot", copilotReady, func(t *testing.T, r *agentRig) (string, []string) {
		copilotConfig(t, r, filepath.Join(r.dir, "copilot-events.jsonl"))
		return agentBin(t, "copilot") + " --allow-all-tools", copilotEnv(r)
	}},
}

func TestAgentStartWays(t *testing.T) {
	agentTest(t)
	for _, cl := range startCLIs {
		for _, way := range []string{"exec-bash", "wrapper", "typed"} {
			t.Run(cl.name+"/"+way, func(t *testing.T) { testStartWay(t, cl, way) })
		}
	}
}

func testStartWay(t *testing.T, cl startCLI, way string) {
	r := newAgentRig(t)
	r.fleet("fleet-roster", "join", "alice", "--mode", "pull")
	cmd, env := cl.setup(t, r)
	name := "ag"
	gate := filepath.Join(r.dir, "start.go")
	var pane string
	switch way {
	case "exec-bash":
		pane = r.pane(name, "while [ ! -e "+gate+" ]; do sleep 0.05; done; "+cmd+"; exec bash --norc --noprofile", env...)
	case "wrapper":
		wrapper := filepath.Join(r.dir, "start-agent")
		script := "#!/bin/sh\n# a wrapper that does not exec the agent\nwhile [ ! -e " + gate + " ]; do sleep 0.05; done\n" +
			cmd + "\necho the agent exited\nexec bash --norc --noprofile\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		pane = r.pane(name, wrapper, env...)
	case "typed":
		pane = r.pane(name, "bash --norc --noprofile -i", env...)
		r.waitScreen(pane, claudeShell, 10*time.Second)
	}
	shell := r.tmux("display", "-p", "-t", pane, "#{pane_pid}")
	t.Cleanup(func() { endClaude(r, pane, shell) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("screen:\n%s", r.screen(pane))
		}
	})
	r.fleet("fleet-roster", "join", name, "--mode", "inject", "--tmux-target", pane, "--paste", "bracketed")
	body := "sent before the agent's first prompt, " + way
	id := r.sendID(name, body)
	start := time.Now()
	if way == "typed" {
		r.tmux("send-keys", "-t", pane, "-l", cmd)
		r.tmux("send-keys", "-t", pane, "Enter")
	} else if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitScreen(pane, cl.ready, 60*time.Second)
	t.Logf("%s ready after %v", cl.name, time.Since(start).Round(10*time.Millisecond))

	if way == "typed" {
		turns := waitTurnsWith(t, r, body, 1)
		if n := strings.Count(turns[0].Prompt, body); n != 1 {
			t.Errorf("the turn's prompt holds the message %d times: %q", n, turns[0].Prompt)
		}
		r.waitState(id, "delivered", 30*time.Second)
		t.Logf("start to the message's turn: %v", turns[0].Time.Sub(start).Round(10*time.Millisecond))
		return
	}
	waitRow(t, r, name, `"status":"unhooked","status_reason":"[^"]+ \(pid [0-9]+\) runs in the process group of the pane's shell (sh|bash|dash) \(started by a compound command`, 60*time.Second)
	t.Logf("start to unhooked: %v", time.Since(start).Round(10*time.Millisecond))
	// the sentinel: the delivery loop saw the message and held it
	r.waitLog(0, `"msg":"held: the agent is not idle".*"entity":"`+name+`","status":"(starting|unhooked)","msg_id":"`+id+`"`, 15*time.Second)
	if n := len(turnsWith(r, body)); n != 0 {
		t.Fatalf("the model saw the message (%d turns): it was typed into the pane", n)
	}
	if strings.Contains(r.screen(pane), body) {
		t.Fatalf("the message shows in the pane:\n%s", r.screen(pane))
	}
	if st := r.msgState(id); st != "accepted" {
		t.Fatalf("the held message reads %s, want accepted", st)
	}
	doc, _, _ := r.fleetTry("fleet-roster", "hooks", "doctor", cl.name, "--entity", name)
	if !strings.Contains(doc, "process group of the pane's shell") {
		t.Errorf("hooks doctor does not name the reason:\n%s", doc)
	}
}
