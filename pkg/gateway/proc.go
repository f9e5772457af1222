package gateway

// proc.go — what the gateway reads of a pane's processes from /proc: a
// process's stat fields (its parent, the terminal's foreground process
// group, its start time), its name, its ancestry, and whether the program
// in front of a pane is one to bind an entity to. The safety net
// (agent.go) and the late-hook recognition (latehook.go) both read them.

import (
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/fleetd/fleet/pkg/deliver"
)

// agentInFront says whether what runs in front of pane p is a program to
// bind an entity to: no shell by tmux's name for it, nor by the kernel's
// (the terminal's foreground process group, from /proc: tmux names a
// pane's shell after the first word of its command line while it starts).
//
// A pane made a moment ago can still read "tmux": the server's forked
// child before it execs the pane's command. That is no agent either (a
// join right after new-window bound such a pane to the program "tmux",
// and it then read detached for good once the shell came up).
func agentInFront(p deliver.PaneInfo) bool {
	if p.Dead || p.Command == "tmux" || deliver.IsShell(p.Command) || !deliver.ProgramOK(p.Command) {
		return false
	}
	f := statFields(p.PID)
	if len(f) < 6 {
		return false
	}
	fg, _ := strconv.Atoi(f[5]) // tpgid: the terminal's foreground process group
	c := comm(fg)
	return c != "" && c != "tmux" && !deliver.IsShell(c)
}

// ancestors is pid and the processes above it (its parent, its parent's
// parent, ...), from /proc, at most 64.
func ancestors(pid int) []int {
	var out []int
	for i := 0; pid > 1 && i < 64; i++ {
		out = append(out, pid)
		f := statFields(pid)
		if len(f) < 2 {
			break
		}
		pid, _ = strconv.Atoi(f[1]) // ppid
	}
	return out
}

// statFields are the fields of /proc/PID/stat after the command name
// (state, ppid, pgrp, session, tty, tpgid, ...; nil if gone): the name
// may hold spaces and parentheses, so they start after its last ')'.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	j := strings.LastIndexByte(s, ')')
	if j < 0 {
		return nil
	}
	return strings.Fields(s[j+1:])
}

// comm is the command name of process pid ("" if gone).
func comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stat reads fields of /proc/PID/stat after the command name: tpgid (the
// terminal's foreground process group) and the start time in clock ticks.
func stat(pid int) (tpgid int, start uint64, ok bool) {
	f := statFields(pid)
	if len(f) < 20 {
		return 0, 0, false
	}
	tpgid, _ = strconv.Atoi(f[5])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return tpgid, start, true
}

// compoundReason is why agent (pid) cannot be told from the pane's shell,
// whose process group it runs in.
func compoundReason(agent string, pid int, shell string) string {
	return fmt.Sprintf("%s (pid %d) runs in the process group of the pane's shell %s (started by a compound command such as \"claude; exec bash\", or a wrapper that does not exec it): "+
		"fleet cannot tell it from the shell, so it types nothing into the pane; start the agent as the pane's command, with exec, or from an interactive shell",
		agent, pid, shell)
}

// pgrp is the process group of pid (0 if gone): an agent backgrounded
// from an interactive shell (claude &) has a group of its own while the
// shell is in front, and is not the shell's.
func pgrp(pid int) int {
	f := statFields(pid)
	if len(f) < 3 {
		return 0
	}
	g, _ := strconv.Atoi(f[2])
	return g
}

// children are pid's child processes.
func children(pid int) []int {
	p := strconv.Itoa(pid)
	b, _ := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// shellProc says whether process pid runs a shell: its command name is
// one, or its executable is (a script's process is named after the
// script — a wrapper started as the pane's command reads start-agent —
// but runs /bin/sh).
func shellProc(pid int) bool { return shellName(pid) != "" }

// shellName is the shell process pid runs, by its command name or its
// executable's ("" for none).
func shellName(pid int) string {
	if c := comm(pid); deliver.IsShell(c) {
		return c
	}
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && deliver.IsShell(path.Base(exe)) {
		return path.Base(exe)
	}
	return ""
}
