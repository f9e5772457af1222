package stubmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The OpenAI Chat Completions API as an "OpenAI-compatible" provider
// speaks it (POST /v1/chat/completions, "stream": true, server-sent
// events): OpenCode's providers built on @ai-sdk/openai-compatible. The
// whole conversation comes in "messages" every time — system, user,
// assistant (with its tool_calls), and "tool" messages with a call's
// output. The stub answers one assistant message, its text or one call
// of the shell tool ("bash", {"command": CMD}), in chunks:
//
//	{"choices":[{"delta":{"role":"assistant","content":TEXT}}]}
//	  or {"choices":[{"delta":{"tool_calls":[{"index":0,"id":..,"function":{..}}]}}]}
//	{"choices":[{"delta":{},"finish_reason":"stop"|"tool_calls"}]}
//	{"choices":[],"usage":{...}}            (stream_options.include_usage)
//	[DONE]
//
// A request that carries no tools (OpenCode's title of a session) is a
// side request: answered in text.

// chatMessage is one message of a Chat Completions request.
type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		ID string `json:"id"`
	} `json:"tool_calls"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Stream   bool          `json:"stream"`
	Messages []chatMessage `json:"messages"`
	Tools    []struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

var chatSeq atomic.Int64

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	b := body(r)
	rec := Request{Vendor: "openai-chat", Method: r.Method, Path: r.URL.RequestURI(), Body: string(b)}
	var req chatRequest
	if r.Method != http.MethodPost || json.Unmarshal(b, &req) != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		openaiError(w, http.StatusBadRequest, "the stub reads a JSON Chat Completions request")
		return
	}
	rec.Model = req.Model
	rec.Turn = len(req.Tools) > 0
	var names []string
	for _, t := range req.Tools {
		names = append(names, t.Function.Name)
	}

	// the user's texts (the last the prompt), the last message's kind
	// (a tool's output: a tool result), and the texts new since the
	// model's last answer, where a hook hands over a fleet message (in a
	// user message or appended to a tool's output)
	last, lastAnswer, promptAt := "", -1, -1
	for i, m := range req.Messages {
		if m.Role == "assistant" {
			lastAnswer = i
		}
	}
	var fresh []string
	for i, m := range req.Messages {
		text := contentText(m.Content)
		switch m.Role {
		case "user":
			rec.Texts = append(rec.Texts, text)
			if t := anthropicUserText(text); t != "" {
				rec.Prompt, promptAt = t, i
			}
			last = "user"
		case "tool":
			rec.ToolResult = text
			last = "tool"
		case "assistant":
			last = "model"
		}
		if i > lastAnswer && m.Role != "assistant" && m.Role != "system" {
			fresh = append(fresh, text)
		}
	}
	if last != "tool" {
		rec.ToolResult = ""
	}
	stale := last == "tool" || promptAt < lastAnswer
	p, hooked := s.hookPlan(fresh)
	if !hooked || (!stale && (toolRE.MatchString(rec.Prompt) || mcpRE.MatchString(rec.Prompt) || errorRE.MatchString(rec.Prompt))) {
		p = s.plan(rec.Prompt, stale)
	}
	if p.Error != 0 {
		rec.Status = p.Error
		rec.Answer = fmt.Sprintf("error %d", p.Error)
		s.record(rec)
		openaiError(w, p.Error, "stub error "+strconv.Itoa(p.Error))
		return
	}
	if (p.Tool != "" || p.MCP != "") && !rec.Turn {
		p.Tool, p.MCP, p.Text = "", "", s.nextReply()
	}
	tool, args := "", ""
	switch {
	case p.MCP != "":
		if tool = mcpTool(names, p.MCP); tool == "" {
			p.Text = "the stub found no MCP tool " + p.MCP + " among the request's tools"
		} else {
			a, _ := json.Marshal(p.Args)
			args = string(a)
			p.Tool = p.MCP
		}
		p.MCP = ""
	case p.Tool != "":
		for _, n := range names {
			if n == "bash" {
				tool = n
			}
		}
		if tool == "" {
			p.Text, p.Tool = "the stub found no shell tool to call", ""
		} else {
			a, _ := json.Marshal(map[string]any{"command": p.Tool, "description": "Run the stub's command"})
			args = string(a)
		}
	}
	if p.Tool != "" {
		rec.Answer = "tool " + tool + ": " + args
		if tool == "bash" {
			rec.Answer = "tool bash: " + p.Tool
		}
	} else {
		rec.Answer = p.Text
	}
	rec.Status = http.StatusOK
	s.record(rec)

	n := chatSeq.Add(1)
	id := fmt.Sprintf("chatcmpl-stub%d", n)
	created := time.Now().Unix()
	chunk := func(choices []map[string]any, extra map[string]any) map[string]any {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": req.Model, "choices": choices}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	usage := map[string]any{"prompt_tokens": len(b)/4 + 1, "completion_tokens": 10, "total_tokens": len(b)/4 + 11}
	finish := "stop"
	var message map[string]any
	if p.Tool != "" {
		finish = "tool_calls"
		message = map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{
			"id": fmt.Sprintf("call_stub%d", n), "type": "function", "function": map[string]any{"name": tool, "arguments": args}}}}
	} else {
		message = map[string]any{"role": "assistant", "content": p.Text}
	}
	if !req.Stream {
		sleep(r, p.Delay)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "chat.completion", "created": created, "model": req.Model,
			"choices": []map[string]any{{"index": 0, "message": message, "finish_reason": finish}}, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sse(w, "", chunk([]map[string]any{{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil}}, nil))
	sleep(r, p.Delay)
	if r.Context().Err() != nil {
		return
	}
	if p.Tool != "" {
		calls := message["tool_calls"].([]map[string]any)
		calls[0]["index"] = 0
		sse(w, "", chunk([]map[string]any{{"index": 0, "delta": map[string]any{"tool_calls": calls}, "finish_reason": nil}}, nil))
	} else {
		sse(w, "", chunk([]map[string]any{{"index": 0, "delta": map[string]any{"content": p.Text}, "finish_reason": nil}}, nil))
	}
	sse(w, "", chunk([]map[string]any{{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}, nil))
	sse(w, "", chunk([]map[string]any{}, map[string]any{"usage": usage}))
	fmt.Fprint(w, "data: [DONE]\n\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}
