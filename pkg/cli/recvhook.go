package cli

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/private"
	"github.com/urfave/cli/v2"
)

// fleet-recv --hook CLI --event EVENT: an agent CLI's hook hands the
// entity's waiting messages to its model (hook delivery mode). It takes
// them the way fleet-recv does (the same receive and acknowledgement:
// written to stdout first, acknowledged after), frames each one
// (deliver.Frame), and prints them in the shape the CLI reads for that
// event, inside the CLI's hook output limit. A hook never fails the
// agent's turn: whatever goes wrong is said on stderr and the hook exits 0
// (Gemini CLI: with {} on stdout, which it needs).
//
// Hook text stays in the conversation: a message handed into one session
// (the CLI's session_id) is recorded in a seen file of that session and is
// never handed into it again — if the acknowledgement was lost, the next
// hook acknowledges it without printing it.

// hookLimit is the most a hook prints (Claude Code caps a hook's output at
// 10,000 characters; the others take at least as much); hookBodyMax the
// longest body handed whole, a longer one is handed as a pointer.
const (
	hookLimit   = 9000
	hookBodyMax = 2000
	hookBatch   = 16
)

// hookShape is what one CLI reads from one event's hook.
type hookShape struct {
	event string // the CLI's event name, in hookSpecificOutput
	stop  bool   // an end-of-turn hook: block (or deny) with the reason
	wake  bool   // an asyncRewake hook: plain text on stderr, exit 2
	block string // the stop decision word
	empty string // what to print when nothing waits
	plain bool   // the text itself, no JSON (OpenCode's plugin adds it)
	flat  bool   // {"additionalContext": TEXT} (Copilot CLI's hook output)
}

var hookShapes = map[string]map[string]hookShape{
	"claude": {
		"prompt": {event: "UserPromptSubmit"},
		"tool":   {event: "PostToolUse"},
		"stop":   {stop: true, block: "block"},
		"wake":   {wake: true},
	},
	"codex": {
		"prompt": {event: "UserPromptSubmit"},
		"tool":   {event: "PostToolUse"},
		"stop":   {stop: true, block: "block"},
	},
	"gemini": {
		"prompt": {event: "BeforeAgent", empty: "{}"},
		"tool":   {event: "AfterTool", empty: "{}"},
		"stop":   {stop: true, block: "deny", empty: "{}"},
	},
	// OpenCode runs no hook commands: fleet's plugin
	// (scripts/hooks/opencode-plugin.js) runs this and appends what it
	// prints to the tool's result (tool.execute.after) or to the turn's
	// prompt (chat.message)
	"opencode": {
		"prompt": {plain: true},
		"tool":   {plain: true},
	},
	// Copilot CLI reads a hook's stdout as its SDK's output objects, flat:
	// userPromptSubmitted's additionalContext goes into the model-facing
	// prompt, postToolUse's into the tool's result, and an agentStop
	// {"decision":"block","reason"} sends the reason as the next prompt
	// (docs/agent-clis/copilot.md)
	"copilot": {
		"prompt": {flat: true},
		"tool":   {flat: true},
		"stop":   {stop: true, block: "block"},
	},
}

// hookOutput is the JSON a hook prints for shape s around text.
func hookOutput(s hookShape, text string) ([]byte, error) {
	if s.wake || s.plain {
		return []byte(text), nil
	}
	if s.stop {
		return json.Marshal(map[string]string{"decision": s.block, "reason": text})
	}
	if s.flat {
		return json.Marshal(map[string]string{"additionalContext": text})
	}
	return json.Marshal(map[string]any{"hookSpecificOutput": map[string]string{
		"hookEventName": s.event, "additionalContext": text}})
}

// hookIntro heads every delivery: what the frames are.
const hookIntro = "Fleet messages from other entities (not the user's words; each framed as " +
	deliver.FrameOpen + "NAME@HOST …] … " + deliver.FrameEnd + "…]):"

// hookInput is what fleet-recv reads from the hook's JSON on stdin: the
// session, as session_id (Claude Code, Codex, Gemini CLI) or sessionId
// (Copilot CLI).
type hookInput struct {
	SessionID string `json:"session_id"`
	Session   string `json:"sessionId"`
}

func runHook(c *cli.Context) (err error) {
	cliName, event := c.String("hook"), c.String("event")
	if cliName == "gemini" {
		// Gemini reads a hook's stdout as JSON only, and takes plain text
		// with an exit other than 0 or 1 for a deny with that text as its
		// reason (at AfterAgent: a turn that goes on with it, again and
		// again): a usage error too leaves {} on stdout
		defer func() {
			if err != nil {
				fmt.Fprintln(c.App.Writer, "{}")
			}
		}()
	}
	if c.NArg() > 0 {
		return usage("fleet-recv takes no arguments, got %q", c.Args().First())
	}
	shapes, ok := hookShapes[cliName]
	if !ok {
		return usage("--hook must be claude, codex, gemini, opencode or copilot, not %q", cliName)
	}
	shape, ok := shapes[event]
	if !ok {
		return usage("--event for %s must be one of %s, not %q", cliName, strings.Join(slices.Sorted(maps.Keys(shapes)), ", "), event)
	}
	if c.IsSet("follow") || c.IsSet("max") {
		return usage("--hook takes no --follow or --max")
	}
	in := readHookInput(c.App.Reader)
	errw := c.App.ErrWriter
	fail := func(format string, args ...any) error {
		fmt.Fprintf(errw, "fleet-recv: "+format+"\n", args...)
		if shape.empty != "" {
			fmt.Fprintln(c.App.Writer, shape.empty)
		}
		return nil // never the agent's turn
	}
	cfg, token, err := credential(c)
	if err != nil {
		return fail("no fleet messages taken: %v", err)
	}
	if event == "stop" {
		// a turn's end, the quiet moment: after the output, whatever it was
		defer pruneHooks(cfg.StateDir, errw)
	}
	turn := hookState(cfg.StateDir, "hook-turn", in.SessionID)
	switch {
	case shape.wake:
		return runWake(c, cfg, token, in, shape)
	case event == "prompt":
		turn.put("busy") // a wake hook of this session stands down
	case event == "stop":
		turn.put("idle")
	}
	seen := openSeen(cfg.StateDir, in.SessionID)
	n, err := takeHook(cfg, token, seen, shape, c.App.Writer, errw)
	if err != nil {
		return fail("no fleet messages taken: %v", err)
	}
	if n == 0 && shape.empty != "" {
		fmt.Fprintln(c.App.Writer, shape.empty)
	}
	return nil
}

// takeHook takes the waiting messages once and writes those that fit to w
// in shape, then acknowledges them; it returns how many it wrote. An
// inbox being drained by another hook of the same agent (they run side
// by side) is tried again for a moment.
func takeHook(cfg *config.Config, token string, seen *seenFile, shape hookShape, w, errw io.Writer) (int, error) {
	var resp *api.Response
	var cl *api.Client
	for try := 0; ; try++ {
		var err error
		if cl, err = DialGateway(cfg); err != nil {
			return 0, err
		}
		cl.Token = token
		if err = cl.Send(&api.RecvRequest{Max: hookBatch, Window: hookBatch, Hook: true}); err == nil {
			resp, err = cl.Read()
		}
		if err == nil {
			break
		}
		cl.Close()
		if fault.KindOf(err) != fault.KindInboxBusy || try >= 20 {
			return 0, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer cl.Close()
	if resp.End {
		return 0, nil
	}
	frame := func(env *envelope.Envelope) (string, error) { return hookFrame(cfg.StateDir, token, env) }
	d := pickHook(shape, resp.Batch, seen.has, frame, errw)
	if os.Getenv("FLEET_CRASHPOINT") == "recv-before-write" {
		syscall.Kill(os.Getpid(), syscall.SIGKILL) // test hook: dies having taken, not written
	}
	out := bufio.NewWriter(w)
	if d.out != nil {
		out.Write(append(d.out, '\n'))
	}
	// written out first, recorded as seen in this conversation, then
	// acknowledged: a hook that dies before the write leaves them pending
	if err := out.Flush(); err != nil {
		fmt.Fprintf(errw, "fleet-recv: writing the messages out failed (not acknowledged: they stay in the inbox): %v\n", err)
		return 0, nil
	}
	if err := seen.add(d.handed); err != nil {
		fmt.Fprintf(errw, "fleet-recv: %v\n", err)
	}
	if os.Getenv("FLEET_CRASHPOINT") == "recv-before-ack" {
		syscall.Kill(os.Getpid(), syscall.SIGKILL) // test hook, as fleet-recv's
	}
	if len(d.acks) == 0 {
		return len(d.handed), nil
	}
	if err := cl.Send(&api.AckRequest{Acks: d.acks}); err != nil {
		fmt.Fprintf(errw, "fleet-recv: the acknowledgement did not reach the gateway (the messages come again, and are not shown twice): %v\n", err)
		return len(d.handed), nil
	}
	// the gateway answers End once every acknowledged message is on disk
	// (or the next batch, when some were left: enough for now)
	done := make(chan struct{})
	go func() {
		cl.Read()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	return len(d.handed), nil
}

// runWake is Claude Code's asyncRewake hook (the recipe runs it at a
// turn's end, in the background): it waits while the agent is idle, and
// once mail waits it writes the frames to stderr and exits 2, which wakes
// the agent with them. It stands down (exit 0, nothing said) when a turn
// starts (the prompt hook marks the session busy), a newer wake hook of
// the same session starts, or its agent exits. Claude Code ends it at
// the hook's timeout (the recipe's: an hour); the next turn's end starts
// another.
func runWake(c *cli.Context, cfg *config.Config, token string, in hookInput, shape hookShape) error {
	me := hookState(cfg.StateDir, "hook-wake", in.SessionID)
	turn := hookState(cfg.StateDir, "hook-turn", in.SessionID)
	pid, parent := strconv.Itoa(os.Getpid()), os.Getppid()
	me.put(pid)
	var buf bytes.Buffer
	for {
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(hookWakePoll):
		}
		if me.get() != pid || turn.get() == "busy" || os.Getppid() != parent {
			return nil // superseded, a turn runs, or the agent is gone
		}
		seen := openSeen(cfg.StateDir, in.SessionID) // the other hooks add to it
		buf.Reset()
		n, err := takeHook(cfg, token, seen, shape, &buf, c.App.ErrWriter)
		if err != nil && fault.KindOf(err) != fault.KindNoGateway && fault.KindOf(err) != fault.KindInboxBusy {
			fmt.Fprintf(c.App.ErrWriter, "fleet-recv: %v\n", err)
			return nil
		}
		if n > 0 {
			// what the hook wrote is already acknowledged: stderr is the
			// write Claude Code reads on exit 2
			c.App.ErrWriter.Write(buf.Bytes())
			return quietExit(2)
		}
	}
}

// hookWakePoll is how often a wake hook looks for mail.
var hookWakePoll = time.Second

// stateFile is a small per-session file of the hooks (one word).
type stateFile string

func hookState(stateDir, dir, session string) stateFile {
	if session == "" {
		return ""
	}
	return stateFile(filepath.Join(stateDir, dir, hookFileName(session)))
}

func (f stateFile) put(v string) {
	if f == "" {
		return
	}
	os.MkdirAll(filepath.Dir(string(f)), 0o700)
	_ = private.WriteFile(string(f), []byte(v), 0o600) // never through a link
}

func (f stateFile) get() string {
	if f == "" {
		return ""
	}
	b, _ := os.ReadFile(string(f))
	return string(b)
}

// hookDelivery is what one hook hands over: its output (nil: nothing to
// print), the messages it acknowledges, and of those the ones it shows.
type hookDelivery struct {
	out          []byte
	acks, handed []string
	left         int // taken, and left in the inbox for the next hook
}

// pickHook frames the batch, oldest first, into one output of shape under
// hookLimit: a message already seen in this conversation is acknowledged
// unshown; once one does not fit, it and the later ones wait.
func pickHook(shape hookShape, batch []api.Delivery, seen func(string) bool, frame func(*envelope.Envelope) (string, error), errw io.Writer) hookDelivery {
	var d hookDelivery
	var frames []string
	for _, m := range batch {
		env := m.Envelope
		switch {
		case seen(env.MsgID):
			d.acks = append(d.acks, env.MsgID) // in this conversation already: its ack was lost
			continue
		case d.left > 0: // in order: once one waits, the later ones wait too
			d.left++
			continue
		}
		f, err := frame(env)
		if err != nil {
			fmt.Fprintf(errw, "fleet-recv: message %s left in the inbox: %v\n", env.MsgID, err)
			d.left++
			continue
		}
		next := append(append([]string(nil), frames...), f)
		// room for the line that says how many wait
		if out, err := hookOutput(shape, hookText(next, len(batch))); err != nil || len(out) > hookLimit {
			d.left++
			continue
		}
		frames = next
		d.acks = append(d.acks, env.MsgID)
		d.handed = append(d.handed, env.MsgID)
	}
	if len(frames) > 0 {
		d.out, _ = hookOutput(shape, hookText(frames, d.left))
	}
	return d
}

// hookText is the frames of one delivery, after the intro, with a line
// for messages that wait for the next hook.
func hookText(frames []string, left int) string {
	text := hookIntro + "\n\n" + strings.Join(frames, "\n\n")
	if left > 0 {
		text += fmt.Sprintf("\n\n(%d more fleet message(s) wait: they come with the next hook, or run fleet-recv)", left)
	}
	return text
}

// hookFrame frames env, or, when its body is over hookBodyMax, keeps the
// message for the entity (keptPath) and frames a pointer to it: the
// command fleet-recv --id MSGID, which prints it whole.
func hookFrame(stateDir, token string, env *envelope.Envelope) (string, error) {
	if len(env.Body) <= hookBodyMax {
		return deliver.Frame(env), nil
	}
	if !ident.ValidID(env.MsgID) {
		// the gateway admits no other (ident.IDPattern): never reached
		return "", fmt.Errorf("msg id %q is not an id", env.MsgID)
	}
	path, err := keptPath(stateDir, token, env.MsgID)
	if err != nil {
		return "", err
	}
	if err := private.MakeDir(filepath.Dir(path)); err != nil {
		return "", err
	}
	b, err := json.Marshal(message{Type: "message", Envelope: env})
	if err != nil {
		return "", err
	}
	if err := private.WriteFile(path, b, 0o600); err != nil {
		return "", err
	}
	return deliver.FramePointer(env, "fleet-recv --id "+env.MsgID), nil
}

// The kept copies of long bodies: hook-bodies/ under the state folder,
// one 0600 file a message (its JSON object, as fleet-recv --json prints
// it), kept hookKeep. A file's name is an HMAC of the entity's gid and
// the msg id keyed with the entity's secret: no byte of a msg id or a
// body becomes a path, and one entity's copies are named by its own
// credential alone — another entity of the host, knowing the msg id and
// the gid, can neither name nor read them with fleet-recv --id.
const (
	hookKeep    = 7 * 24 * time.Hour  // hook-bodies/
	hookRecords = 30 * 24 * time.Hour // hook-seen/, hook-turn/, hook-wake/
	hookPruneAt = 16384               // entries looked at, a folder a turn's end
	keptMax     = 64 << 20            // bytes read of a kept copy
)

// keptPath is where the entity of token keeps msgID's copy.
func keptPath(stateDir, token, msgID string) (string, error) {
	gid, secret, err := ident.Parse(token)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte("fleet hook body\x00" + gid + "\x00" + msgID))
	return filepath.Join(stateDir, "hook-bodies", hex.EncodeToString(mac.Sum(nil)[:16])+".json"), nil
}

// pruneHooks removes the kept copies older than hookKeep and the session
// records older than hookRecords (private.Prune: bounded, never through
// a link). What fails is said on errw; it never fails the hook.
func pruneHooks(stateDir string, errw io.Writer) {
	now := time.Now()
	for _, p := range []struct {
		dir  string
		keep time.Duration
	}{{"hook-bodies", hookKeep}, {"hook-seen", hookRecords}, {"hook-turn", hookRecords}, {"hook-wake", hookRecords}} {
		if _, err := private.Prune(filepath.Join(stateDir, p.dir), now.Add(-p.keep), hookPruneAt); err != nil {
			fmt.Fprintf(errw, "fleet-recv: pruning the hooks' files: %v\n", err)
		}
	}
}

// runShow is fleet-recv --id MSGID: the caller's kept copy of a message a
// hook handed as a pointer, framed (the body whole, inert), or with
// --json its JSON object. The copy is looked up by the caller's own
// credential; no gateway is asked.
func runShow(c *cli.Context) error {
	id := c.String("id")
	for _, f := range []string{"hook", "event", "follow", "max"} {
		if c.IsSet(f) {
			return usage("--id takes no --%s", f)
		}
	}
	if !ident.ValidID(id) {
		return usage("--id %q is not a msg id (a letter or digit, then up to 127 letters, digits, '.', '_', ':' or '-')", id).
			WithHint("copy the id from the pointer line: (... read it with fleet-recv --id MSGID)")
	}
	cfg, token, err := credential(c)
	if err != nil {
		return err
	}
	if token == "" {
		return fault.New(fault.Refused, fault.KindNoCredential, "no credential: fleet-recv --id reads the caller's own kept copies").
			WithHint("run it as the hook did, with FLEET_TOKEN set, or with --as NAME")
	}
	path, err := keptPath(cfg.StateDir, token, id)
	if err != nil {
		return err
	}
	b, err := private.ReadFile("kept message", path, true, keptMax)
	if errors.Is(err, os.ErrNotExist) {
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no kept copy of message %s for this entity", id).
			WithHint("a hook keeps a long body 7 days for the entity it handed it to; fleet-send --status %s shows the message's state", id)
	}
	if err != nil {
		return err
	}
	m := message{Envelope: &envelope.Envelope{}}
	if err := json.Unmarshal(b, &m); err != nil || m.Envelope.MsgID != id {
		return fault.New(fault.Data, fault.KindBadEnvelope, "the kept copy of message %s (%s) is not that message", id, path).
			WithHint("remove it: rm %s", shellQuote(path))
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, m)
	}
	_, err = fmt.Fprintln(c.App.Writer, deliver.Frame(m.Envelope))
	return err
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// hookFileName is a file name for a session id (any bytes).
func hookFileName(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}

// readHookInput reads the hook's JSON (bounded); what it cannot parse is
// no session.
func readHookInput(r io.Reader) hookInput {
	var in hookInput
	if f, ok := r.(*os.File); ok && isTerminal(f) {
		return in
	}
	b, _ := io.ReadAll(io.LimitReader(r, 4<<20))
	json.Unmarshal(b, &in)
	if in.SessionID == "" {
		in.SessionID = in.Session
	}
	return in
}

// seenFile is the msg ids handed into one conversation.
type seenFile struct {
	path string
	ids  map[string]bool
}

func openSeen(stateDir, session string) *seenFile {
	s := &seenFile{ids: map[string]bool{}}
	if session == "" {
		return s // no session named: the acknowledgement alone
	}
	dir := filepath.Join(stateDir, "hook-seen")
	s.path = filepath.Join(dir, hookFileName(session))
	b, _ := os.ReadFile(s.path)
	for _, id := range strings.Fields(string(b)) {
		s.ids[id] = true
	}
	return s
}

func (s *seenFile) has(id string) bool { return s.ids[id] }

func (s *seenFile) add(ids []string) error {
	if s.path == "" || len(ids) == 0 {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("recording the messages as seen: %w", err)
	}
	f, err := private.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("recording the messages as seen: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(ids, "\n") + "\n"); err != nil {
		return fmt.Errorf("recording the messages as seen: %w", err)
	}
	return f.Sync()
}
