package gateway

import "testing"

// OpenCode 1.18.33's screens, as tmux captured them (docs/agent-clis/
// opencode.md): at its prompt it reads ready, mid-turn working, and its
// tool approval is a dialog.
func TestOpenCodeScreens(t *testing.T) {
	idle := "  ┃  Build · Stub model Stub\n  ╹▀▀▀▀▀▀▀▀\n   /tmp/p                    tab agents  ctrl+p commands    • OpenCode 1.18.33\n"
	working := "     ▣  Build · Stub model\n  ┃  Build · Stub model Stub\n   ⬝⬝⬝⬝⬝⬝⬝⬝  esc interrupt                tab agents  ctrl+p commands\n"
	approval := "  ┃  △ Permission required\n  ┃    ← Access external directory /tmp/x\n  ┃   Allow once   Allow always   Reject      ctrl+f fullscreen  ⇆ select  enter confirm\n"
	if !readyRE.MatchString(idle) || workingRE.MatchString(idle) || dialogRE.MatchString(idle) {
		t.Error("OpenCode at its prompt does not read ready")
	}
	if !workingRE.MatchString(working) {
		t.Error("OpenCode mid-turn does not read working")
	}
	if !dialogRE.MatchString(approval) {
		t.Error("OpenCode's tool approval does not read as a dialog")
	}
}
