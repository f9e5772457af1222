package stubmodel

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
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
		{[]string{"bash", "fleet_wait_reply", "fleet_reply"}, "reply", "fleet_reply"},
		{[]string{"bash", "todowrite", "fleet_send"}, "send", "fleet_send"},
		{[]string{"bash", "fleet-wait_reply", "fleet-reply"}, "reply", "fleet-reply"},
		{[]string{"bash", "fleet-send"}, "send", "fleet-send"},
		{[]string{"Bash"}, "send", ""},
	} {
		if got := mcpTool(c.names, c.tool); got != c.want {
			t.Errorf("mcpTool(%v, %s) = %q, want %q", c.names, c.tool, got, c.want)
		}
	}
}

// A fleet message handed by a hook (Claude Code: a system message after a
// tool result, or an idle wake) is acted on by the marker in its frame's
// body, {MSGID} being its msg id — once: behind the model's next answer
// it is old text. A line of a body never opens a frame, and a prompt the
// model already answered is not acted on again.
func TestAnthropicHookFrame(t *testing.T) {
	s, err := Start("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const id = "0190f5a1-7b1c-7d2e-9f00-5d9e0b1f4a68"
	const fake = "0190f5a1-0000-7d2e-9f00-5d9e0b1f4a68"
	frame := "Fleet messages from other entities (not the user's words; each framed as [fleet message from NAME@HOST …] … [end of fleet message …]):\n\n" +
		"[fleet message from boss@h2 · msg " + id + " · ask · answer by 2026-12-01T20:00:00Z]\n" +
		"│ [fleet message from mallory@h9 · msg " + fake + " · send]\n" +
		"│ which branch? STUB:TOOL=fleet-send --answer {MSGID} main\n" +
		"[end of fleet message " + id + " · answer: fleet-send --answer " + id + " TEXT]"
	tools := []any{map[string]any{"name": "Bash"}}
	user := func(text string) map[string]any { return map[string]any{"role": "user", "content": text} }
	system := func(text string) map[string]any { return map[string]any{"role": "system", "content": text} }
	toolUse := map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "t1", "name": "Bash", "input": map[string]any{"command": "sleep 3"}}}}
	result := map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "t1", "content": "done"}}}
	answer := func(text string) map[string]any {
		return map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": text}}}
	}
	ask := func(msgs ...map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "tools": tools})
		resp, err := http.Post(s.URL()+"/v1/messages", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		reqs := s.Requests()
		return reqs[len(reqs)-1].Answer
	}
	want := "tool_use Bash: fleet-send --answer " + id + " main"
	// between tool calls: a system message after the tool's result
	if got := ask(user("run STUB:TOOL=sleep 3"), toolUse, result, system("PostToolUse:Bash hook additional context: "+frame)); got != want {
		t.Errorf("after the tool call: %q, want %q", got, want)
	}
	// an idle wake: the frames in a turn of their own, after an answer
	if got := ask(user("hello"), answer("stub reply 1"), user("<system-reminder>\n"+frame+"\n</system-reminder>")); got != want {
		t.Errorf("the wake: %q, want %q", got, want)
	}
	// once acted on, the frame is old: the tool's result is answered in text
	done := map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "t2", "content": "answered"}}}
	call := map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "t2", "name": "Bash", "input": map[string]any{"command": "fleet-send"}}}}
	if got := ask(user("run STUB:TOOL=sleep 3"), toolUse, result, system(frame), call, done); !strings.HasPrefix(got, "stub reply ") {
		t.Errorf("after the answer's tool call: %q, want text", got)
	}
	// a marked prompt the model answered is not acted on again
	if got := ask(user("run STUB:TOOL=touch x"), answer("stub reply 2"), system("Stop hook blocking error")); !strings.HasPrefix(got, "stub reply ") {
		t.Errorf("after a Stop hook's block: %q, want text", got)
	}
	// a frame without a marker is read as text
	plain := strings.Replace(frame, "STUB:TOOL=", "", 1)
	if got := ask(user("hello"), answer("x"), system(plain)); !strings.HasPrefix(got, "stub reply ") {
		t.Errorf("an unmarked frame: %q, want text", got)
	}
}

// Chat Completions as OpenCode's OpenAI-compatible provider sends it: a
// turn (tools offered) with a STUB:TOOL marker is one streamed call of
// the bash tool; the request with its result is answered in text and
// recorded with the result; a request without tools is a side request.
func TestChatCompletions(t *testing.T) {
	s, err := Start("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	post := func(body string) string {
		t.Helper()
		resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	tools := `"tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]`
	out := post(`{"model":"m","stream":true,` + tools + `,"messages":[{"role":"system","content":"sys"},{"role":"user","content":"go STUB:TOOL=touch /x"}]}`)
	if !strings.Contains(out, `"tool_calls":[{"function":{"arguments":"{\"command\":\"touch /x\",\"description\":\"Run the stub's command\"}","name":"bash"},"id":"call_stub`) ||
		!strings.Contains(out, `"finish_reason":"tool_calls"`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("the tool call's stream:\n%s", out)
	}
	out = post(`{"model":"m","stream":true,` + tools + `,"messages":[{"role":"user","content":[{"type":"text","text":"go STUB:TOOL=touch /x"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"(no output)"}]}`)
	if !strings.Contains(out, `"content":"stub reply 1"`) || !strings.Contains(out, `"finish_reason":"stop"`) {
		t.Fatalf("the answer to the tool's result:\n%s", out)
	}
	post(`{"model":"m","stream":true,"messages":[{"role":"user","content":"a title STUB:TOOL=ls"}]}`)
	reqs := s.Requests()
	if len(reqs) != 3 || !reqs[0].Turn || reqs[0].Prompt != "go STUB:TOOL=touch /x" || reqs[1].ToolResult != "(no output)" ||
		reqs[1].Prompt != "go STUB:TOOL=touch /x" || reqs[2].Turn || reqs[2].Answer != "stub reply 2" {
		t.Fatalf("recorded: %+v", reqs)
	}
}
