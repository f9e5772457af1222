package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rogpeppe/go-internal/testscript"
)

// The MCP client the scripts drive fleet-mcp with: the official Go SDK's,
// speaking to the real binary over its stdin and stdout (CommandTransport),
// as an agent's MCP client would. The MCP Inspector (from npm), a client
// nobody on this project wrote, is driven by mcp_inspector.txtar through
// exec.

// npmBin holds the test tools installed from the npm registry by
// scripts/test-deps.sh (the MCP Inspector): FLEET_TEST_NPM, else
// ~/.cache/fleet-npm, as that script installs them.
var npmBin = func() string {
	dir := os.Getenv("FLEET_TEST_NPM")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "fleet-npm")
	}
	return filepath.Join(dir, "node_modules", ".bin")
}()

// mcpClients are a script's MCP sessions and its calls in flight.
type mcpClients struct {
	mu       sync.Mutex
	sessions map[string]*mcpSession
	calls    map[string]chan mcpResult
}

type mcpSession struct {
	cs      *mcp.ClientSession
	mu      sync.Mutex
	updated int // resources/updated notifications for fleet://inbox so far
	mark    int // the count at the last "mcp mark"
	changed chan struct{}
}

type mcpResult struct {
	res *mcp.CallToolResult
	err error
}

func scriptMCP(ts *testscript.TestScript) *mcpClients {
	return ts.Value("mcp").(*mcpClients)
}

func setupMCP(env *testscript.Env) {
	m := &mcpClients{sessions: map[string]*mcpSession{}, calls: map[string]chan mcpResult{}}
	env.Values["mcp"] = m
	env.Defer(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, s := range m.sessions {
			s.cs.Close()
		}
	})
}

// mcp start NAME ARGS... — start fleet-mcp ARGS... (in the script's
// environment as it is now: `host` first picks the gateway) under an MCP
// client session named NAME, and subscribe to fleet://inbox. Its stderr
// goes to $WORK/NAME.mcp.log.
// mcp tools NAME — print the session's tool names, one per line, sorted.
// mcp call NAME TOOL JSON — call TOOL with JSON arguments and print the
// structured result as one JSON line; a tool error (isError) fails the
// script unless negated, when its text goes to stderr.
// mcp go ID NAME TOOL JSON — the same call, in the background; mcp await
// ID prints what it returned, as mcp call does (negate for a tool error).
// mcp read NAME URI — print a resource's text.
// mcp mark NAME — remember how many times fleet://inbox was updated;
// mcp updated NAME — wait (15s at most) until it is updated after the mark.
// mcp stop NAME — close the session (fleet-mcp sees its stdin close).
func cmdMCP(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: mcp start|tools|call|go|await|read|mark|updated|stop ...")
	}
	m := scriptMCP(ts)
	ctx := context.Background()
	session := func(name string) *mcpSession {
		m.mu.Lock()
		defer m.mu.Unlock()
		s := m.sessions[name]
		if s == nil {
			ts.Fatalf("no MCP session %s", name)
		}
		return s
	}
	switch args[0] {
	case "start":
		s := &mcpSession{changed: make(chan struct{}, 1)}
		client := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
				if req.Params.URI != "fleet://inbox" {
					return
				}
				s.mu.Lock()
				s.updated++
				s.mu.Unlock()
				select {
				case s.changed <- struct{}{}:
				default:
				}
			},
		})
		logf, err := os.OpenFile(ts.MkAbs(args[1]+".mcp.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		ts.Check(err)
		cmd := exec.Command(filepath.Join(binDir, "fleet-mcp"), args[2:]...)
		cmd.Env = scriptEnv(ts)
		cmd.Dir = ts.Getenv("WORK")
		cmd.Stderr = logf
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			logf.Close()
			log, _ := os.ReadFile(ts.MkAbs(args[1] + ".mcp.log"))
			ts.Fatalf("starting fleet-mcp: %v\n%s", err, log)
		}
		s.cs = cs
		ts.Check(cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "fleet://inbox"}))
		m.mu.Lock()
		m.sessions[args[1]] = s
		m.mu.Unlock()
	case "tools":
		res, err := session(args[1]).cs.ListTools(ctx, nil)
		ts.Check(err)
		var names []string
		for _, t := range res.Tools {
			names = append(names, t.Name)
		}
		sort.Strings(names)
		fmt.Fprintln(ts.Stdout(), strings.Join(names, "\n"))
	case "call":
		if len(args) != 4 {
			ts.Fatalf("usage: mcp call NAME TOOL JSON")
		}
		res, err := callTool(ctx, session(args[1]), args[2], args[3])
		printResult(ts, neg, args[2], res, err)
	case "go":
		if len(args) != 5 {
			ts.Fatalf("usage: mcp go ID NAME TOOL JSON")
		}
		s := session(args[2])
		ch := make(chan mcpResult, 1)
		m.mu.Lock()
		m.calls[args[1]] = ch
		m.mu.Unlock()
		go func() {
			res, err := callTool(ctx, s, args[3], args[4])
			ch <- mcpResult{res, err}
		}()
	case "await":
		m.mu.Lock()
		ch := m.calls[args[1]]
		m.mu.Unlock()
		if ch == nil {
			ts.Fatalf("no call %s in flight", args[1])
		}
		select {
		case r := <-ch:
			printResult(ts, neg, args[1], r.res, r.err)
		case <-time.After(60 * time.Second):
			ts.Fatalf("call %s did not return within 60s", args[1])
		}
	case "read":
		res, err := session(args[1]).cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: args[2]})
		ts.Check(err)
		for _, c := range res.Contents {
			fmt.Fprintln(ts.Stdout(), c.Text)
		}
	case "mark":
		s := session(args[1])
		s.mu.Lock()
		s.mark = s.updated
		s.mu.Unlock()
	case "updated":
		s := session(args[1])
		deadline := time.After(45 * time.Second)
		for {
			s.mu.Lock()
			n, mark := s.updated, s.mark
			s.mu.Unlock()
			if n > mark {
				return
			}
			select {
			case <-s.changed:
			case <-deadline:
				ts.Fatalf("fleet://inbox was not updated within 45s")
			}
		}
	case "stop":
		s := session(args[1])
		ts.Check(s.cs.Close())
		m.mu.Lock()
		delete(m.sessions, args[1])
		m.mu.Unlock()
	default:
		ts.Fatalf("mcp: unknown subcommand %s", args[0])
	}
}

func callTool(ctx context.Context, s *mcpSession, tool, arguments string) (*mcp.CallToolResult, error) {
	var a map[string]any
	if err := json.Unmarshal([]byte(arguments), &a); err != nil {
		return nil, fmt.Errorf("arguments %s: %v", arguments, err)
	}
	return s.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: a})
}

// printResult prints a tool's structured result on stdout, or its error
// text on stderr; a protocol error always fails the script.
func printResult(ts *testscript.TestScript, neg bool, what string, res *mcp.CallToolResult, err error) {
	if err != nil {
		ts.Fatalf("%s: %v", what, err)
	}
	if res.IsError {
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				fmt.Fprintln(ts.Stderr(), t.Text)
			}
		}
		if !neg {
			ts.Fatalf("%s: tool error", what)
		}
		return
	}
	if neg {
		ts.Fatalf("%s: succeeded, want a tool error", what)
	}
	data, err := json.Marshal(res.StructuredContent)
	ts.Check(err)
	fmt.Fprintln(ts.Stdout(), string(data))
}

// mcptool FILE TOOL FIELD — print FIELD of the tool named TOOL in FILE, a
// tools/list result as the MCP Inspector prints it ({"tools": [...]}), as
// one line of JSON with its keys sorted.
func cmdMCPTool(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: mcptool FILE TOOL FIELD")
	}
	var list struct {
		Tools []map[string]any `json:"tools"`
	}
	ts.Check(json.Unmarshal([]byte(ts.ReadFile(args[0])), &list))
	for _, t := range list.Tools {
		if t["name"] == args[1] {
			v, ok := t[args[2]]
			if !ok {
				ts.Fatalf("tool %s has no %s", args[1], args[2])
			}
			data, err := json.Marshal(v)
			ts.Check(err)
			fmt.Fprintln(ts.Stdout(), string(data))
			return
		}
	}
	ts.Fatalf("no tool %s in %s", args[1], args[0])
}
