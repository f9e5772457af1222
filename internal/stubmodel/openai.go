package stubmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// The OpenAI Responses API as the Codex CLI speaks it (POST /v1/responses,
// "stream": true, server-sent events). Codex sends the whole conversation
// in "input" every time (store is false): messages, the model's earlier
// function calls and their outputs. The stub answers with one output item
// — an assistant message or a function call to the shell tool Codex
// offers in "tools" — framed as Codex reads it:
//
//	response.created
//	response.output_item.added     (the item, empty)
//	response.output_text.delta     (a message's text)
//	response.output_item.done      (the item, whole)
//	response.completed             (the response id and usage)
//
// Codex fails a stream that ends without response.completed, and retries
// it (stream_max_retries); a request that fails with an HTTP status is
// retried too on 429 and 5xx (request_max_retries), which a test cuts in
// the provider's settings.

// responsesRequest is the part of a Responses request the stub reads.
type responsesRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
	Tools []openaiTool    `json:"tools"`
}

// openaiTool is a tool offered to the model: a function, or (Codex's MCP
// servers) a namespace of functions.
type openaiTool struct {
	Type  string `json:"type"`
	Name  string `json:"name"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// responsesItem is one input item.
type responsesItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	CallID  string          `json:"call_id"`
	Output  json.RawMessage `json:"output"`
}

// codexContext tells the user messages Codex writes itself (the
// environment, AGENTS.md and other instructions, the record of an
// interrupted turn) from what the user typed.
func codexContext(text string) bool {
	t := strings.TrimSpace(text)
	for _, p := range []string{"<environment_context>", "<user_instructions>", "# AGENTS.md instructions", "<INSTRUCTIONS>",
		"<turn_aborted>", "<user_shell_command>", "<skill>", "<permissions instructions>", "<collaboration_mode>"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// contentText is the text of a message's content: a string or a list of
// parts (input_text, output_text, ...).
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

var openaiSeq atomic.Int64

func (s *Server) openai(w http.ResponseWriter, r *http.Request) {
	b := body(r)
	rec := Request{Vendor: "openai", Method: r.Method, Path: r.URL.RequestURI(), Body: string(b)}
	var req responsesRequest
	if r.Method != http.MethodPost || json.Unmarshal(b, &req) != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		openaiError(w, http.StatusBadRequest, "the stub reads a JSON Responses request")
		return
	}
	rec.Model = req.Model
	rec.Turn = len(req.Tools) > 0
	var items []responsesItem
	if json.Unmarshal(req.Input, &items) != nil {
		var text string
		if json.Unmarshal(req.Input, &text) == nil {
			items = []responsesItem{{Type: "message", Role: "user", Content: req.Input}}
		}
	}
	last := "" // the type of the last item: a function call's output is a tool result
	for _, it := range items {
		switch {
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output" || it.Type == "local_shell_call_output":
			last = "output"
			rec.ToolResult = openaiToolOutput(it.Output)
		case (it.Type == "message" || it.Type == "") && it.Role == "user":
			text := contentText(it.Content)
			if codexContext(text) {
				continue
			}
			last = "user"
			rec.Texts = append(rec.Texts, text)
			rec.Prompt = text
		case it.Type == "message" || it.Type == "function_call" || it.Type == "reasoning":
			if it.Role != "developer" && it.Role != "system" {
				last = "model"
			}
		}
	}
	if last != "output" {
		rec.ToolResult = ""
	}
	p := s.plan(rec.Prompt, last == "output")
	if p.Error != 0 {
		rec.Status = p.Error
		rec.Answer = fmt.Sprintf("error %d", p.Error)
		s.record(rec)
		openaiError(w, p.Error, "stub error "+strconv.Itoa(p.Error))
		return
	}
	tool, args, mcp, namespace := "", "", p.MCP != "", ""
	switch {
	case mcp:
		// a namespace's function is offered as NAMESPACE__NAME here, and
		// called as name NAME in namespace NAMESPACE
		var names []string
		inNS := map[string][2]string{}
		for _, t := range req.Tools {
			names = append(names, t.Name)
			for _, f := range t.Tools {
				full := t.Name + "__" + f.Name
				names = append(names, full)
				inNS[full] = [2]string{t.Name, f.Name}
			}
		}
		tool = mcpTool(names, p.MCP)
		if ns, ok := inNS[tool]; ok {
			namespace, tool = ns[0], ns[1]
		}
		if tool == "" {
			p.Text = "the stub found no MCP tool " + p.MCP + " among the request's tools"
		} else {
			b, _ := json.Marshal(p.Args)
			p.Tool, args = p.MCP, string(b)
		}
		p.MCP = ""
	case p.Tool != "":
		tool = shellTool(req.Tools)
		if tool == "" {
			p.Text, p.Tool = "the stub found no shell tool to call", ""
		} else {
			args = shellArgs(tool, p.Tool)
		}
	}
	n := openaiSeq.Add(1)
	id := fmt.Sprintf("resp_stub%d", n)
	var item map[string]any
	if p.Tool != "" {
		rec.Answer = "tool " + tool + ": " + p.Tool
		if mcp {
			rec.Answer = "tool " + tool + ": " + args
		}
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_stub%d", n), "call_id": fmt.Sprintf("call_stub%d", n),
			"name": tool, "arguments": args, "status": "completed"}
		if namespace != "" {
			item["namespace"] = namespace
			rec.Answer = "tool " + namespace + "." + tool + ": " + args
		}
	} else {
		rec.Answer = p.Text
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_stub%d", n), "role": "assistant", "status": "completed",
			"content": []map[string]any{{"type": "output_text", "text": p.Text, "annotations": []any{}}}}
	}
	rec.Status = http.StatusOK
	s.record(rec)

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	resp := map[string]any{"id": id, "object": "response", "model": req.Model, "status": "in_progress", "output": []any{}}
	sse(w, "response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": resp})
	sse(w, "response.in_progress", map[string]any{"type": "response.in_progress", "sequence_number": 1, "response": resp})
	sleep(r, p.Delay)
	if r.Context().Err() != nil {
		return
	}
	seq := 2
	ev := func(typ string, data map[string]any) {
		data["type"] = typ
		data["sequence_number"] = seq
		seq++
		sse(w, typ, data)
	}
	if p.Tool != "" {
		added := map[string]any{}
		for k, v := range item {
			added[k] = v
		}
		added["arguments"], added["status"] = "", "in_progress"
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": added})
		ev("response.function_call_arguments.done", map[string]any{"output_index": 0, "item_id": item["id"], "arguments": item["arguments"]})
	} else {
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"type": "message", "id": item["id"],
			"role": "assistant", "status": "in_progress", "content": []any{}}})
		ev("response.content_part.added", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		ev("response.output_text.delta", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0, "delta": p.Text})
		ev("response.output_text.done", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0, "text": p.Text})
		ev("response.content_part.done", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": p.Text, "annotations": []any{}}})
	}
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	done := map[string]any{"id": id, "object": "response", "model": req.Model, "status": "completed", "output": []any{item},
		"usage": map[string]any{"input_tokens": 100, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": 10, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 110}}
	ev("response.completed", map[string]any{"response": done})
}

// shellTool is the name of the shell tool among tools: Codex offers one of
// exec_command (unified exec), shell_command or shell, by model and
// settings.
func shellTool(tools []openaiTool) string {
	have := map[string]bool{}
	for _, t := range tools {
		have[t.Name] = true
	}
	for _, name := range []string{"exec_command", "shell_command", "shell"} {
		if have[name] {
			return name
		}
	}
	return ""
}

// shellArgs are the arguments (a JSON string) of a call of the shell tool
// name running the shell command line cmd.
func shellArgs(name, cmd string) string {
	var a any
	switch name {
	case "exec_command":
		a = map[string]any{"cmd": cmd}
	case "shell_command":
		a = map[string]any{"command": cmd}
	default: // shell: argv
		a = map[string]any{"command": []string{"bash", "-lc", cmd}}
	}
	b, _ := json.Marshal(a)
	return string(b)
}

// openaiToolOutput is a function call's output: a string, or a list of content
// parts.
func openaiToolOutput(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != "" {
		return o.Content
	}
	return contentText(raw)
}

// openaiError answers status with OpenAI's error body.
func openaiError(w http.ResponseWriter, status int, msg string) {
	typ, code := "invalid_request_error", any(nil)
	switch {
	case status == http.StatusTooManyRequests:
		typ, code = "rate_limit_error", "rate_limit_exceeded"
		w.Header().Set("Retry-After", "1")
	case status >= 500:
		typ, code = "server_error", "server_error"
	case status == http.StatusUnauthorized:
		typ, code = "invalid_request_error", "invalid_api_key"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	w.Write(b)
}
