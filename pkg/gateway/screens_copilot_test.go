package gateway

import "testing"

// GitHub Copilot CLI 1.0.102's screens, as tmux captured them
// (docs/agent-clis/copilot.md): at its prompt it reads ready, mid-turn
// working, and never both.
func TestCopilotScreens(t *testing.T) {
	idle := " /tmp/p\n────────\n❯\n────────\n ← open sidebar · Interactive · Manual Approval · / commands · ? help · tab next tab        stub-model\n"
	working := " /tmp/p\n────────\n❯                        \n────────\n ◎ Working esc esc edit prompt              stub-model\n"
	if !readyRE.MatchString(idle) || workingRE.MatchString(idle) || dialogRE.MatchString(idle) {
		t.Error("Copilot at its prompt does not read ready")
	}
	if !workingRE.MatchString(working) || readyRE.MatchString(working) {
		t.Error("Copilot mid-turn does not read working")
	}
}
