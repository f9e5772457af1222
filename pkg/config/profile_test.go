package config

import (
	"testing"
	"time"
)

func TestProfilesFromTheConfigFile(t *testing.T) {
	home := isolate(t)
	defaultFile(t, home, `
host = h1
profile.claude.command = claude --dangerously-skip-permissions
profile.claude.session = agents
profile.job.launcher = exec
profile.job.command = "./worker.sh \"$@\""
profile.job.dir = /srv/jobs
profile.job.grace = 2s
profile.job.nudge = ./respawn.sh
profile.hook.launcher = exec
profile.hook.mode = inject
profile.hook.command = sleep 1000
profile.hook.deliver = cat >> inbox.jsonl
`)
	c, err := Load(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ProfileNames(); len(got) != 3 || got[0] != "claude" || got[1] != "hook" || got[2] != "job" {
		t.Fatalf("profiles %v", got)
	}
	cl := c.Profiles["claude"]
	if cl.Launcher != "tmux" || cl.Mode != "inject" || cl.Session != "agents" || cl.Grace != 500*time.Millisecond ||
		cl.Command != "claude --dangerously-skip-permissions" {
		t.Errorf("claude = %+v; want tmux, inject (the defaults), session agents, grace 500ms", cl)
	}
	job := c.Profiles["job"]
	if job.Launcher != "exec" || job.Mode != "pull" || job.Dir != "/srv/jobs" || job.Grace != 2*time.Second || job.Command != `./worker.sh "$@"` ||
		job.Nudge != "./respawn.sh" {
		t.Errorf("job = %+v; want exec, pull (its default), the quoted command unquoted", job)
	}
	if h := c.Profiles["hook"]; h.Mode != "inject" || h.Deliver != "cat >> inbox.jsonl" {
		t.Errorf("hook = %+v", h)
	}
	// a client reads the same file without complaint
	if _, err := LoadClient(nil, ""); err != nil {
		t.Errorf("LoadClient: %v", err)
	}
}

func TestBadProfilesAreUsageErrors(t *testing.T) {
	for _, tc := range []struct{ file, mentions string }{
		{"profile.a.launcher = tmux", "profile.a: no command"},
		{"profile.a.command = x\nprofile.a.launcher = docker", `launcher "docker" is not tmux or exec`},
		{"profile.a.command = x\nprofile.a.mode = push", `mode "push" is not inject, pull or hook`},
		{"profile.a.command = x\nprofile.a.colour = red", "profile.a.colour: not a profile setting"},
		{"profile.a.command = x\nprofile.a.grace = soon", `profile.a.grace: "soon" is not a duration`},
		{"profile.a.command = x\nprofile.a.launcher = exec\nprofile.a.mode = inject", "needs profile.a.deliver"},
		{"profile.a.command = x\nprofile.a.deliver = cat", "deliver is for the exec launcher"},
		{"profile.a.command = x\nprofile.a.nudge = x", "nudge is for pull mode"},
		{"profile.a.command = x\nprofile.a.session = a:b", "may not hold"},
		{"profile.9a.command = x", "profile.9a.command: not a profile setting"},
		{"profile.command = x", "profile.command: not a profile setting"},
		{"profiles.a.command = x", `unknown setting "profiles.a.command"`},
	} {
		home := isolate(t)
		defaultFile(t, home, tc.file+"\n")
		_, err := Load(nil, "")
		wantUsage(t, err, tc.mentions)
	}
}

func TestIsProfileKey(t *testing.T) {
	for key, want := range map[string]bool{
		"profile.claude.command": true, "profile.my-agent_2.grace": true, "profile.claude.colour": false,
		"profile..command": false, "profile.command": false, "host": false, "profile.a.b.command": false,
	} {
		if got := IsProfileKey(key); got != want {
			t.Errorf("IsProfileKey(%q) = %v, want %v", key, got, want)
		}
	}
}
