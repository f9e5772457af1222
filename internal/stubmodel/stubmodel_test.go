package stubmodel

import (
	"reflect"
	"testing"
)

// STUB:MCP names a tool of the MCP server and its arguments; the CLI's
// own name for it is found among the request's tools.
func TestPlanMCP(t *testing.T) {
	s := &Server{}
	p := s.plan(`[fleet send from boss@h1 · msg 0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68] do it STUB:MCP=reply {"msg_id":"{MSGID}","body":"done"}`, false)
	want := map[string]any{"msg_id": "0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68", "body": "done"}
	if p.MCP != "reply" || !reflect.DeepEqual(p.Args, want) || p.Tool != "" {
		t.Fatalf("plan: %+v", p)
	}
	if p := s.plan("STUB:MCP=whoami", false); p.MCP != "whoami" || len(p.Args) != 0 {
		t.Fatalf("no arguments: %+v", p)
	}
	if p := s.plan("STUB:MCP=whoami", true); p.MCP != "" || p.Text == "" {
		t.Fatalf("a tool's result is answered in text: %+v", p)
	}
	if p := s.plan("STUB:MCP=send {bad", false); p.MCP != "" || p.Text == "" {
		t.Fatalf("bad arguments: %+v", p)
	}
	for _, c := range []struct {
		names []string
		tool  string
		want  string
	}{
		{[]string{"Bash", "mcp__fleet__wait_reply", "mcp__fleet__reply"}, "reply", "mcp__fleet__reply"},
		{[]string{"exec_command", "fleet__send"}, "send", "fleet__send"},
		{[]string{"run_shell_command", "mcp_fleet_wait_reply", "mcp_fleet_reply"}, "reply", "mcp_fleet_reply"},
		{[]string{"send"}, "send", "send"},
		{[]string{"Bash"}, "send", ""},
	} {
		if got := mcpTool(c.names, c.tool); got != c.want {
			t.Errorf("mcpTool(%v, %s) = %q, want %q", c.names, c.tool, got, c.want)
		}
	}
}
