package stubmodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
)

// The Anthropic Messages API as Claude Code uses it: POST /v1/messages,
// streaming (stream: true, server-sent events) for its turns and some
// side requests, plain JSON otherwise; POST /v1/messages/count_tokens.
// A turn is a request that carries tools; its shell tool is Bash, input
// {"command": CMD}.

// anthropicMessage is one message of a request: content is a string or
// a list of blocks.
type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicBlock is one content block of a message (the fields the stub
// reads).
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"` // tool_result: string or blocks
}

type anthropicRequest struct {
	Model    string             `json:"model"`
	Stream   bool               `json:"stream"`
	Messages []anthropicMessage `json:"messages"`
	Tools    []json.RawMessage  `json:"tools"`
}

// blocks is a message's content as blocks (a string is one text block).
func (m anthropicMessage) blocks() []anthropicBlock {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []anthropicBlock{{Type: "text", Text: s}}
	}
	var bs []anthropicBlock
	json.Unmarshal(m.Content, &bs)
	return bs
}

// toolResultText is a tool_result block's content as text.
func (b anthropicBlock) toolResultText() string {
	var s string
	if json.Unmarshal(b.Content, &s) == nil {
		return s
	}
	var bs []anthropicBlock
	json.Unmarshal(b.Content, &bs)
	var parts []string
	for _, c := range bs {
		if c.Type == "text" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// anthropicReminderRE is the context Claude Code adds to a user message around
// the user's own text (<system-reminder>...</system-reminder>).
var anthropicReminderRE = regexp.MustCompile(`(?s)<system-reminder>.*?</system-reminder>`)

// anthropicUserText is the user's own text of a text block: the block without
// Claude Code's system reminders, or "" if it is nothing else.
func anthropicUserText(t string) string {
	return strings.TrimSpace(anthropicReminderRE.ReplaceAllString(t, ""))
}

var anthropicIDs atomic.Int64

func anthropicID(prefix string) string {
	return fmt.Sprintf("%s_stub%06d", prefix, anthropicIDs.Add(1))
}

// anthropicErrorTypes are the error types of the API's HTTP statuses.
var anthropicErrorTypes = map[int]string{
	400: "invalid_request_error",
	401: "authentication_error",
	403: "permission_error",
	404: "not_found_error",
	413: "request_too_large",
	429: "rate_limit_error",
	500: "api_error",
	529: "overloaded_error",
}

func (s *Server) anthropic(w http.ResponseWriter, r *http.Request) {
	b := body(r)
	rec := Request{Vendor: "anthropic", Method: r.Method, Path: r.URL.RequestURI(), Body: string(b)}
	if r.Method != http.MethodPost {
		rec.Status = http.StatusMethodNotAllowed
		s.record(rec)
		anthropicError(w, rec.Status, "method not allowed")
		return
	}
	var req anthropicRequest
	if err := json.Unmarshal(b, &req); err != nil {
		rec.Status = http.StatusBadRequest
		s.record(rec)
		anthropicError(w, rec.Status, "stub: bad request body: "+err.Error())
		return
	}
	rec.Model = req.Model
	rec.Turn = len(req.Tools) > 0

	// The user's texts, the last one the prompt; a last user message made
	// of tool results answers a tool call (system messages after it, such
	// as a PostToolUse hook's context, aside).
	toolResult := false
	lastUser, lastAnswer, promptAt := -1, -1, -1
	for i, m := range req.Messages {
		switch m.Role {
		case "user":
			lastUser = i
		case "assistant":
			lastAnswer = i
		}
	}
	// the texts new in this request (after the model's last answer):
	// where a hook hands the model a fleet message
	var fresh []string
	for _, m := range req.Messages[lastAnswer+1:] {
		for _, blk := range m.blocks() {
			if blk.Type == "text" && m.Role != "assistant" {
				fresh = append(fresh, blk.Text)
			}
		}
	}
	for i, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		last := i == lastUser
		var hasText bool
		for _, blk := range m.blocks() {
			switch blk.Type {
			case "text":
				rec.Texts = append(rec.Texts, blk.Text)
				if t := anthropicUserText(blk.Text); t != "" {
					rec.Prompt, hasText, promptAt = t, true, i
				}
			case "tool_result":
				if last {
					toolResult = true
					rec.ToolResult = blk.toolResultText()
				}
			}
		}
		if last && hasText {
			toolResult = false
		}
	}
	if !toolResult {
		rec.ToolResult = ""
	}

	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		rec.Status = http.StatusOK
		n := len(b)/4 + 1
		rec.Answer = fmt.Sprintf("input_tokens %d", n)
		s.record(rec)
		anthropicJSON(w, map[string]any{"input_tokens": n})
		return
	}

	// a prompt the model answered before (a request after a Stop hook's
	// block or an idle wake) is not acted on again
	// block or an idle wake) is not acted on again; its marker comes
	// before a hook's
	stale := toolResult || promptAt < lastAnswer
	p, hooked := s.hookPlan(fresh)
	if !hooked || (!stale && (toolRE.MatchString(rec.Prompt) || mcpRE.MatchString(rec.Prompt) || errorRE.MatchString(rec.Prompt))) {
		p = s.plan(lastPrompt(rec.Prompt), stale)
	}
	if p.Error != 0 {
		rec.Status = p.Error
		typ := anthropicErrorTypes[p.Error]
		if typ == "" {
			typ = "api_error"
		}
		rec.Answer = typ
		s.record(rec)
		sleep(r, p.Delay)
		anthropicError(w, p.Error, fmt.Sprintf("stub: %s (STUB:ERROR=%d)", typ, p.Error))
		return
	}
	// Only a turn calls the tool: a side request (a title, a topic) about
	// a marked prompt is answered in text.
	if (p.Tool != "" || p.MCP != "") && !rec.Turn {
		p.Tool, p.MCP, p.Text = "", "", s.nextReply()
	}
	toolName, toolInput := "Bash", map[string]any{"command": p.Tool, "description": "Run the stub's command"}
	var names []string
	for _, t := range req.Tools {
		var tl struct{ Name string }
		json.Unmarshal(t, &tl)
		names = append(names, tl.Name)
	}
	if !slices.Contains(names, "Bash") && slices.Contains(names, "bash") {
		// GitHub Copilot CLI's shell tool (Anthropic Messages through
		// its own provider): bash, run to its end
		toolName, toolInput["mode"] = "bash", "sync"
	}
	if p.MCP != "" {
		if toolName = mcpTool(names, p.MCP); toolName == "" {
			p.Text = "the stub found no MCP tool " + p.MCP + " among the request's tools"
		} else {
			p.Tool, toolInput = p.MCP, p.Args
		}
		p.MCP = ""
	}
	rec.Status = http.StatusOK
	if p.Tool != "" {
		in, _ := json.Marshal(toolInput)
		rec.Answer = "tool_use " + toolName + ": " + string(in)
		if toolName == "Bash" || toolName == "bash" {
			rec.Answer = "tool_use " + toolName + ": " + p.Tool
		}
	} else {
		rec.Answer = p.Text
	}
	s.record(rec)

	model := req.Model
	if model == "" {
		model = "stub"
	}
	msgID := anthropicID("msg")
	var content []map[string]any
	stop := "end_turn"
	if p.Tool != "" {
		stop = "tool_use"
		content = []map[string]any{{"type": "tool_use", "id": anthropicID("toolu"), "name": toolName, "input": toolInput}}
	} else {
		content = []map[string]any{{"type": "text", "text": p.Text}}
	}
	usage := map[string]any{"input_tokens": len(b)/4 + 1, "output_tokens": 0,
		"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

	if !req.Stream {
		sleep(r, p.Delay)
		usage["output_tokens"] = 10
		anthropicJSON(w, map[string]any{"id": msgID, "type": "message", "role": "assistant", "model": model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
		return
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("request-id", anthropicID("req"))
	w.WriteHeader(http.StatusOK)
	sse(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": msgID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": usage}})
	sse(w, "ping", map[string]any{"type": "ping"})
	blk := content[0]
	if p.Tool != "" {
		sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": blk["id"], "name": toolName, "input": map[string]any{}}})
		sleep(r, p.Delay)
		in, _ := json.Marshal(blk["input"])
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
	} else {
		sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
		sleep(r, p.Delay)
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": p.Text}})
	}
	if r.Context().Err() != nil {
		return
	}
	sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse(w, "message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}

// anthropicError writes the API's error body with status code.
func anthropicError(w http.ResponseWriter, code int, msg string) {
	typ := anthropicErrorTypes[code]
	if typ == "" {
		typ = "api_error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("request-id", anthropicID("req"))
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"type": "error",
		"error": map[string]any{"type": typ, "message": msg}})
}

func anthropicJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("request-id", anthropicID("req"))
	json.NewEncoder(w).Encode(v)
}

// lastPrompt is the last of the prompts in a user text: GitHub Copilot
// CLI sends a prompt whose turn failed or was interrupted again with the
// next one, in one text, each after its <current_datetime> element; the
// stub acts on the new one only.
func lastPrompt(text string) string {
	if i := strings.LastIndex(text, "<current_datetime>"); i > 0 {
		return text[i:]
	}
	return text
}
