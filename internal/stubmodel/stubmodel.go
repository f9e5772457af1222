// Package stubmodel is the tests' model: an HTTP server on loopback that
// speaks enough of each agent CLI vendor's API to run real turns of the
// real Claude Code, Codex CLI, Gemini CLI and OpenCode offline —
//
//   - Anthropic Messages, streaming (POST /v1/messages), anthropic.go;
//   - OpenAI Responses, streaming (POST /v1/responses), openai.go;
//   - OpenAI Chat Completions, streaming (POST /v1/chat/completions), as
//     an OpenAI-compatible provider of OpenCode speaks it, chat.go;
//   - Gemini generateContent and streamGenerateContent
//     (POST /v1beta/models/MODEL:ACTION), gemini.go —
//
// and records every request it receives, so a test can assert exactly what
// the model was shown. What a turn does is read from the prompt (the last
// user text of the request), by markers a test puts in a message body:
//
//	STUB:SLOW=N     the answer takes N seconds (a slow turn)
//	STUB:ERROR=CODE the request fails with HTTP CODE (429, 529, 500, 400)
//	STUB:TOOL=CMD   the model calls the CLI's shell tool with CMD (to the
//	                end of the line; {MSGID} in it is the msg id of the
//	                fleet header in the prompt, as an agent that reads
//	                "reply: fleet-send --reply-to ID" would write it); once
//	                the tool's result comes back the model answers in text
//	STUB:MCP=TOOL JSON  the model calls the MCP tool TOOL (the CLI's name
//	                for it: mcp__SERVER__TOOL, SERVER__TOOL, mcp_SERVER_TOOL,
//	                SERVER_TOOL or TOOL, whichever the request offers) with the JSON
//	                object to the end of the line as its arguments ({MSGID}
//	                as for STUB:TOOL)
//
// A message handed to the model by an agent CLI's hook (fleet-recv
// --hook) is not in the prompt but in hook text new in the request (Claude
// Code: a system message, a system reminder, an idle wake's text): there
// the stub follows the STUB:TOOL or STUB:MCP marker of the first fleet
// frame whose body carries one, {MSGID} being that frame's msg id — what
// an agent that reads the frame's "answer: fleet-send --answer ID TEXT"
// would do. (Anthropic and Chat Completions.)
//
// Otherwise the model answers "stub reply N" (N counts the answers). The
// stub is no model: nothing it says depends on the text beyond the markers.
// scripts/stubmodel runs it as a program.
package stubmodel

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request is one request as the stub recorded it (a line of its log).
type Request struct {
	Time   time.Time `json:"time"`
	Vendor string    `json:"vendor"` // anthropic | openai | openai-chat | gemini | other
	Method string    `json:"method"`
	Path   string    `json:"path"`
	Model  string    `json:"model,omitempty"`
	// Turn is true for a request that carries the CLI's tools (a turn of
	// the agent), false for side requests (titles, token counts, checks).
	Turn bool `json:"turn"`
	// Prompt is the last user text of the conversation the request
	// carries; Texts every user text in it, in order.
	Prompt string   `json:"prompt"`
	Texts  []string `json:"texts,omitempty"`
	// ToolResult is the output of the tool call the request answers, if
	// its last user turn is a tool result.
	ToolResult string `json:"tool_result,omitempty"`
	Status     int    `json:"status"`
	Answer     string `json:"answer,omitempty"` // what the stub answered
	Body       string `json:"body"`             // the request body as sent
}

// Server is a running stub.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	mu   sync.Mutex
	reqs []Request
	log  *os.File
	n    int
}

// Start serves on addr ("127.0.0.1:0" for any port), appending each
// request to logPath as a JSON line when logPath is not empty.
func Start(addr, logPath string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln}
	if logPath != "" {
		if s.log, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			ln.Close()
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/messages", s.anthropic)
	mux.HandleFunc("/v1/responses", s.openai)
	mux.HandleFunc("/v1/chat/completions", s.chat)
	mux.HandleFunc("/v1beta/models/", s.gemini)
	mux.HandleFunc("/", s.other)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// URL is the server's base URL, http://127.0.0.1:PORT.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error {
	err := s.srv.Close()
	if s.log != nil {
		s.log.Close()
	}
	return err
}

// Requests returns what was received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Turns returns the requests that were turns of the agent (Turn is true).
func (s *Server) Turns() []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Turn {
			out = append(out, r)
		}
	}
	return out
}

// record keeps r and writes it to the log.
func (s *Server) record(r Request) {
	r.Time = time.Now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r)
	if s.log != nil {
		b, _ := json.Marshal(r)
		s.log.Write(append(b, '\n'))
	}
}

// nextReply is the text of the next plain answer.
func (s *Server) nextReply() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return "stub reply " + strconv.Itoa(s.n)
}

// Plan is what the stub does with one request.
type Plan struct {
	Error int           // answer with this HTTP status and the vendor's error body
	Delay time.Duration // wait this long before the answer's last event
	Tool  string        // call the shell tool with this command
	MCP   string        // or call the MCP tool of this name (the server's)
	Args  map[string]any
	Text  string // else answer this text
}

var (
	slowRE  = regexp.MustCompile(`STUB:SLOW=([0-9]+)`)
	errorRE = regexp.MustCompile(`STUB:ERROR=([0-9]{3})`)
	toolRE  = regexp.MustCompile(`STUB:TOOL=([^\n␊]*)`)
	mcpRE   = regexp.MustCompile(`STUB:MCP=([A-Za-z0-9_-]+) *([^\n␊]*)`)
	msgIDRE = regexp.MustCompile(`\[fleet [a-z]+ from \S+ · msg ([0-9a-f-]{36})`)
)

// frameRE is a fleet frame as fleet-recv --hook writes it (pkg/deliver):
// its header line, its body lines behind "│ ", and its end line's start.
// A body line cannot open or close a frame (it starts with the bar).
var frameRE = regexp.MustCompile(`(?m)^\[fleet message from \S+ · msg ([0-9a-f-]{36}) · [^\n]*\]\n((?:│ [^\n]*\n)*)\[end of fleet message `)

// hookPlan is what the model does with hook text new in a request (texts):
// the STUB:TOOL or STUB:MCP marker of the first fleet frame whose body
// carries one, {MSGID} filled with that frame's msg id; false if none does.
func (s *Server) hookPlan(texts []string) (Plan, bool) {
	for _, t := range texts {
		for _, m := range frameRE.FindAllStringSubmatch(t, -1) {
			if !toolRE.MatchString(m[2]) && !mcpRE.MatchString(m[2]) {
				continue
			}
			return s.planID(m[2], m[1], false), true
		}
	}
	return Plan{}, false
}

// plan reads the markers of prompt. A request answering a tool call
// (toolResult) is answered in text: one tool call per marked prompt.
func (s *Server) plan(prompt string, toolResult bool) Plan {
	id := ""
	if m := msgIDRE.FindStringSubmatch(prompt); m != nil {
		id = m[1]
	}
	return s.planID(prompt, id, toolResult)
}

// planID is plan with {MSGID} standing for id.
func (s *Server) planID(prompt, id string, toolResult bool) Plan {
	var p Plan
	if m := errorRE.FindStringSubmatch(prompt); m != nil && !toolResult {
		p.Error, _ = strconv.Atoi(m[1])
		return p
	}
	if m := slowRE.FindStringSubmatch(prompt); m != nil {
		n, _ := strconv.Atoi(m[1])
		p.Delay = time.Duration(n) * time.Second
	}
	if m := mcpRE.FindStringSubmatch(prompt); m != nil && !toolResult {
		args := strings.TrimSpace(m[2])
		if id != "" {
			args = strings.ReplaceAll(args, "{MSGID}", id)
		}
		p.MCP, p.Args = m[1], map[string]any{}
		if args != "" {
			if err := json.Unmarshal([]byte(args), &p.Args); err != nil {
				p.MCP, p.Text = "", "the stub cannot read the arguments of STUB:MCP="+m[1]+": "+err.Error()
			}
		}
		return p
	}
	if m := toolRE.FindStringSubmatch(prompt); m != nil && !toolResult {
		p.Tool = strings.TrimSpace(m[1])
		if id != "" {
			p.Tool = strings.ReplaceAll(p.Tool, "{MSGID}", id)
		}
		return p
	}
	p.Text = s.nextReply()
	return p
}

// mcpTool is the name under which a CLI offers the MCP tool tool among
// names: Claude Code's and Codex's mcp__SERVER__TOOL, SERVER__TOOL,
// Gemini's mcp_SERVER_TOOL, OpenCode's SERVER_TOOL, Copilot CLI's
// SERVER-TOOL, or the bare name; "" if none.
func mcpTool(names []string, tool string) string {
	for _, n := range names {
		if n == tool || strings.HasSuffix(n, "__"+tool) {
			return n
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "mcp_") && strings.HasSuffix(n, "_"+tool) && !strings.Contains(strings.TrimSuffix(n, "_"+tool)[4:], "_") {
			return n
		}
	}
	// OpenCode's SERVER_TOOL and Copilot's SERVER-TOOL (a server name of
	// neither: fleet-wait_reply is not a tool "reply")
	for _, sep := range []string{"_", "-"} {
		for _, n := range names {
			if server := strings.TrimSuffix(n, sep+tool); server != n && server != "" && !strings.ContainsAny(server, "_-") {
				return n
			}
		}
	}
	return ""
}

// body reads a request's body (bounded) for the log.
func body(r *http.Request) []byte {
	b, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	return b
}

// other answers anything the stub does not speak with 404, recorded: a
// CLI's side request (telemetry, updates, model lists) must not reach a
// real service, and a test can see that it was tried.
func (s *Server) other(w http.ResponseWriter, r *http.Request) {
	b := body(r)
	s.record(Request{Vendor: "other", Method: r.Method, Path: r.URL.RequestURI(), Status: 404, Body: string(b)})
	http.Error(w, `{"error":{"message":"not served by the stub model"}}`, http.StatusNotFound)
}

// sse writes one server-sent event and flushes it.
func sse(w http.ResponseWriter, event string, data any) {
	b, _ := json.Marshal(data)
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// sleep waits d or until the client goes away.
func sleep(r *http.Request, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}
