package stubmodel

import (
	"encoding/json"
	"net/http"
	"strings"
)

// The Gemini API as Gemini CLI (0.61) calls it, under /v1beta/models/:
//
//	MODEL:streamGenerateContent?alt=sse  the agent's turns (they carry
//	                                     the CLI's tools) — SSE chunks
//	MODEL:generateContent                side requests: the model router's
//	                                     classifier, the next-speaker and
//	                                     loop checks (JSON answers by a
//	                                     responseJsonSchema), summaries
//	MODEL:countTokens                    token counts
//
// A JSON side request is answered with an object built from its schema
// (next_speaker "user", so the CLI hands the turn back; an enum's first
// value otherwise), so the CLI proceeds as after a real model's answer.

type geminiPart struct {
	Text             string          `json:"text,omitempty"`
	Thought          bool            `json:"thought,omitempty"`
	FunctionCall     *geminiCall     `json:"functionCall,omitempty"`
	FunctionResponse *geminiResponse `json:"functionResponse,omitempty"`
}

type geminiCall struct {
	ID   string         `json:"id,omitempty"`
	Name string         `json:"name"`
	Args map[string]any `json:"args"`
}

type geminiResponse struct {
	ID       string          `json:"id,omitempty"`
	Name     string          `json:"name"`
	Response json.RawMessage `json:"response"`
}

type geminiContent struct {
	Role  string       `json:"role"`
	Parts []geminiPart `json:"parts"`
}

type geminiRequest struct {
	Contents []geminiContent `json:"contents"`
	Tools    []struct {
		FunctionDeclarations []json.RawMessage `json:"functionDeclarations"`
	} `json:"tools"`
	GenerationConfig struct {
		ResponseMimeType   string         `json:"responseMimeType"`
		ResponseJSONSchema map[string]any `json:"responseJsonSchema"`
		ResponseSchema     map[string]any `json:"responseSchema"`
	} `json:"generationConfig"`
}

// geminiStatus is Google's status name of an HTTP error code.
func geminiStatus(code int) string {
	switch code {
	case 400:
		return "INVALID_ARGUMENT"
	case 401:
		return "UNAUTHENTICATED"
	case 403:
		return "PERMISSION_DENIED"
	case 404:
		return "NOT_FOUND"
	case 429:
		return "RESOURCE_EXHAUSTED"
	case 503:
		return "UNAVAILABLE"
	case 504:
		return "DEADLINE_EXCEEDED"
	}
	return "INTERNAL"
}

// geminiError writes Google's error JSON with status code.
func geminiError(w http.ResponseWriter, code int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code":    code,
		"message": "stub model: STUB:ERROR=" + http.StatusText(code),
		"status":  geminiStatus(code),
	}})
}

// gemini serves the Gemini API.
func (s *Server) gemini(w http.ResponseWriter, r *http.Request) {
	b := body(r)
	rest := strings.TrimPrefix(r.URL.Path, "/v1beta/models/")
	model, action, ok := strings.Cut(rest, ":")
	if r.Method != http.MethodPost || !ok {
		s.record(Request{Vendor: "gemini", Method: r.Method, Path: r.URL.RequestURI(), Model: model, Status: 404, Body: string(b)})
		http.Error(w, `{"error":{"code":404,"message":"not served by the stub model","status":"NOT_FOUND"}}`, http.StatusNotFound)
		return
	}
	rec := Request{Vendor: "gemini", Method: r.Method, Path: r.URL.RequestURI(), Model: model, Body: string(b)}
	var req geminiRequest
	if err := json.Unmarshal(b, &req); err != nil {
		rec.Status = 400
		s.record(rec)
		geminiError(w, 400)
		return
	}
	// the user's texts (the CLI's own context parts included), the last
	// user text, and the tool result the last user turn carries
	for i, c := range req.Contents {
		if c.Role != "user" {
			continue
		}
		last := i == len(req.Contents)-1
		for _, p := range c.Parts {
			if p.Text != "" && !p.Thought {
				rec.Texts = append(rec.Texts, p.Text)
				rec.Prompt = p.Text
			}
			if p.FunctionResponse != nil && last {
				rec.ToolResult = geminiToolOutput(p.FunctionResponse.Response)
			}
		}
	}
	for _, t := range req.Tools {
		if len(t.FunctionDeclarations) > 0 {
			rec.Turn = true
		}
	}

	switch action {
	case "countTokens":
		n := len(b) / 4
		rec.Status = 200
		s.record(rec)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"totalTokens": n})
		return
	case "generateContent", "streamGenerateContent":
	default:
		rec.Status = 404
		s.record(rec)
		geminiError(w, 404)
		return
	}

	schema := req.GenerationConfig.ResponseJSONSchema
	if schema == nil {
		schema = req.GenerationConfig.ResponseSchema
	}
	var p Plan
	switch {
	case !rec.Turn && (schema != nil || req.GenerationConfig.ResponseMimeType == "application/json"):
		// a side check: answer by its schema, never by the markers
		v, _ := json.Marshal(fromSchema("", schema))
		p.Text = string(v)
	case !rec.Turn:
		p.Text = "stub summary"
	default:
		p = s.plan(rec.Prompt, rec.ToolResult != "" || lastIsToolResult(req.Contents))
	}
	if p.Error != 0 {
		rec.Status = p.Error
		s.record(rec)
		geminiError(w, p.Error)
		return
	}
	var part geminiPart
	if p.MCP != "" {
		var names []string
		for _, t := range req.Tools {
			for _, d := range t.FunctionDeclarations {
				var fd struct{ Name string }
				json.Unmarshal(d, &fd)
				names = append(names, fd.Name)
			}
		}
		if name := mcpTool(names, p.MCP); name == "" {
			p.Text = "the stub found no MCP tool " + p.MCP + " among the request's tools"
		} else {
			part.FunctionCall = &geminiCall{Name: name, Args: p.Args}
			b, _ := json.Marshal(p.Args)
			rec.Answer, p.Tool = "tool "+name+": "+string(b), p.MCP
		}
	}
	switch {
	case part.FunctionCall != nil: // the MCP tool's
	case p.Tool != "":
		part.FunctionCall = &geminiCall{Name: "run_shell_command", Args: map[string]any{"command": p.Tool}}
		rec.Answer = "tool: " + p.Tool
	default:
		part.Text = p.Text
		rec.Answer = p.Text
	}
	rec.Status = 200
	s.record(rec)
	usage := map[string]any{"promptTokenCount": len(b) / 4, "candidatesTokenCount": 5, "totalTokenCount": len(b)/4 + 5}
	final := map[string]any{
		"candidates": []any{map[string]any{
			"content":      geminiContent{Role: "model", Parts: []geminiPart{part}},
			"finishReason": "STOP",
			"index":        0,
		}},
		"usageMetadata": usage,
		"modelVersion":  model,
	}
	if action == "generateContent" {
		sleep(r, p.Delay)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(final)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	if p.Tool == "" && p.Delay > 0 {
		// a first chunk now, the rest after the delay: a turn in progress
		sse(w, "", map[string]any{
			"candidates":   []any{map[string]any{"content": geminiContent{Role: "model", Parts: []geminiPart{{Text: "working… "}}}, "index": 0}},
			"modelVersion": model,
		})
	}
	sleep(r, p.Delay)
	if r.Context().Err() != nil {
		return
	}
	sse(w, "", final)
}

// lastIsToolResult tells whether the conversation's last user turn answers
// a tool call.
func lastIsToolResult(cs []geminiContent) bool {
	if len(cs) == 0 {
		return false
	}
	c := cs[len(cs)-1]
	for _, p := range c.Parts {
		if p.FunctionResponse != nil {
			return true
		}
	}
	return false
}

// geminiToolOutput is the text of a functionResponse's response ({"output": ...}
// from the shell tool; else the JSON as sent).
func geminiToolOutput(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		for _, k := range []string{"output", "result", "error"} {
			if v, ok := m[k].(string); ok && v != "" {
				return v
			}
		}
	}
	if len(raw) == 0 {
		return "(empty)"
	}
	return string(raw)
}

// fromSchema builds a value that satisfies a (JSON or OpenAPI) schema:
// next_speaker "user", an enum's first value, empty or zero otherwise.
func fromSchema(name string, schema map[string]any) any {
	if schema == nil {
		return map[string]any{}
	}
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		if name == "next_speaker" {
			for _, e := range enum {
				if e == "user" {
					return e
				}
			}
		}
		return enum[0]
	}
	typ, _ := schema["type"].(string)
	switch strings.ToLower(typ) {
	case "object", "":
		out := map[string]any{}
		props, _ := schema["properties"].(map[string]any)
		for k, v := range props {
			sub, _ := v.(map[string]any)
			out[k] = fromSchema(k, sub)
		}
		return out
	case "array":
		return []any{}
	case "boolean":
		return false
	case "number", "integer":
		return 0
	}
	if name == "next_speaker" {
		return "user"
	}
	return "stub"
}
