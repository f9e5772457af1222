package gateway_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// ask puts a question from e to "to" as fleet-ask does and returns the
// open call and its Sent frame.
func (e entity) ask(to, body, turn string, ttlMS int64) (*api.Client, *api.Sent) {
	e.gw.t.Helper()
	c, sent, err := e.gw.open(e.Token, &api.AskRequest{To: to, Body: body, TurnID: turn, TimeoutMS: ttlMS})
	if err != nil {
		e.gw.t.Fatalf("ask from %s to %s: %v", e.Name, to, err)
	}
	return c, sent
}

// answer answers ask id as e (fleet-send --answer).
func (e entity) answer(id, body string) (*api.Sent, error) {
	resp, err := e.gw.call(e.Token, &api.SendRequest{AnswerTo: id, Body: body})
	if err != nil {
		return nil, err
	}
	return resp.Sent, nil
}

// An ask on one host: the askee sees it, its answer goes straight to the
// asking call, the asker reads "waiting" meanwhile, and nothing of either
// is stored anywhere; a second answer is too late.
func TestLocalAskAnswered(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.ask("bob", "may I force-push?", "turn-1", 10_000)
	if sent.State != "asked" || sent.Recipient != "bob@h1" || sent.Gid != bob.Gid {
		t.Fatalf("asked: %+v", sent)
	}
	if r, _ := g.rosterRow("alice"); r.Status != "waiting" {
		t.Errorf("alice reads %q while her ask waits, want waiting", r.Status)
	}
	got := bob.collect("may I force-push?")
	q := got[0].Envelope
	if q.Kind != envelope.Ask || q.MsgID != sent.MsgID || q.TurnID != "turn-1" || q.Expires.IsZero() || q.Sender.Gid != alice.Gid {
		t.Fatalf("bob was shown %+v", q)
	}
	a, err := bob.answer(sent.MsgID, "yes")
	if err != nil {
		t.Fatal(err)
	}
	if a.State != "answered" || a.Recipient != "alice@h1" || a.TraceID != sent.TraceID {
		t.Fatalf("answered: %+v", a)
	}
	ans, err := second(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if ans.Kind != envelope.Answer || ans.Body != "yes" || ans.InReplyTo != sent.MsgID || ans.TurnID != "turn-1" ||
		ans.TraceID != sent.TraceID || ans.Sender.Gid != bob.Gid || ans.MsgID != a.MsgID {
		t.Fatalf("alice got %+v", ans)
	}
	fe := faultOf(t, func() error { _, err := bob.answer(sent.MsgID, "yes again"); return err }(), fault.TooLate)
	if fe.Kind != "too_late" {
		t.Errorf("a second answer: %v (kind %s), want too_late", fe, fe.Kind)
	}
	eventually(t, "alice back to idle", func() error {
		if r, _ := g.rosterRow("alice"); r.Status != "idle" {
			return fault.New(fault.TempFail, "", "%s", r.Status)
		}
		return nil
	})
	// live only: neither the ask nor the answer is in a store or an inbox
	_, err = g.call(alice.Token, &api.LookupRequest{MsgID: sent.MsgID})
	faultOf(t, err, fault.NoRecipient)
	_, err = g.call(bob.Token, &api.LookupRequest{MsgID: a.MsgID})
	faultOf(t, err, fault.NoRecipient)
	alice.empty(bob)
	bob.empty(alice)
}

// An ask whose TTL passes: the asking call ends with 75 and a hint to
// the trace, the askee is never shown it, it leaves memory and the audit
// log says it expired untaken; an answer is too late.
func TestLocalAskExpires(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.ask("bob", "quick?", "", 100)
	_, err := second(t, c)
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindTimeout || !strings.Contains(fe.Msg, sent.MsgID) ||
		!strings.HasPrefix(fe.Hint, "fleet-trace "+sent.TraceID+" ") {
		t.Fatalf("timed out: %v (%s), hint %q", fe, fe.Kind, fe.Hint)
	}
	eventually(t, "the expired ask in the audit log", func() error {
		resp, err := g.call(alice.Token, &api.TraceRequest{TraceID: sent.TraceID})
		if err != nil {
			return err
		}
		for _, h := range resp.Trace.Hops {
			if h.Event == "expired" && h.MsgID == sent.MsgID && h.Entity == "bob" && h.Reason == "expired before its askee took it" {
				return nil
			}
		}
		return fault.New(fault.TempFail, "", "hops: %+v", resp.Trace.Hops)
	})
	if resp, err := g.call(bob.Token, &api.WhoamiRequest{}); err != nil || resp.Entity.Asks != 0 {
		t.Fatalf("bob's asks waiting after the expiry: %+v %v", resp, err)
	}
	bob.empty(alice) // an expired ask is never shown
	_, err = bob.answer(sent.MsgID, "too slow")
	if fe := faultOf(t, err, fault.TooLate); fe.Kind != "too_late" || !strings.Contains(fe.Msg, "expired") {
		t.Fatalf("late answer: %v (%s)", fe, fe.Kind)
	}
	alice.empty(bob)
}

// Without --ttl the gateway's ask-ttl bounds the wait.
func TestLocalAskDefaultTTL(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"ask-ttl": "150ms"})
	alice, _ := g.join("alice"), g.join("bob")
	c, _ := alice.ask("bob", "anyone?", "", 0)
	_, err := second(t, c)
	if fe := faultOf(t, err, fault.TempFail); !strings.Contains(fe.Msg, "within 150ms") {
		t.Fatalf("timed out: %v", fe)
	}
}

// The asking process goes away: its turn is gone, the answer is delivered
// nowhere and the answerer hears too late.
func TestLocalAskAskerGone(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.ask("bob", "still there?", "t", 10_000)
	c.Close()
	eventually(t, "the gateway sees the asking turn end", func() error {
		if r, _ := g.rosterRow("alice"); r.Status != "idle" {
			return fault.New(fault.TempFail, "", "%s", r.Status)
		}
		return nil
	})
	bob.collect("still there?") // not expired: still shown
	_, err := bob.answer(sent.MsgID, "yes")
	if fe := faultOf(t, err, fault.TooLate); fe.Kind != "too_late" || !strings.Contains(fe.Msg, "turn is gone") {
		t.Fatalf("answer to a gone turn: %v (%s)", fe, fe.Kind)
	}
	alice.empty(bob)
}

// Two turns of one entity ask at once: each gets its own answer only.
func TestLocalAskTurnsNeverCross(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c1, s1 := alice.ask("bob", "first", "turn-1", 10_000)
	c2, s2 := alice.ask(bob.Gid, "second", "turn-2", 10_000)
	got := bob.collect("first", "second")
	if got[0].Envelope.TurnID != "turn-1" || got[1].Envelope.TurnID != "turn-2" {
		t.Fatalf("turns %q %q", got[0].Envelope.TurnID, got[1].Envelope.TurnID)
	}
	if _, err := bob.answer(s2.MsgID, "to the second"); err != nil {
		t.Fatal(err)
	}
	a2, err := second(t, c2)
	if err != nil || a2.Body != "to the second" || a2.TurnID != "turn-2" {
		t.Fatalf("turn 2 got %+v %v", a2, err)
	}
	if _, err := bob.answer(s1.MsgID, "to the first"); err != nil {
		t.Fatal(err)
	}
	a1, err := second(t, c1)
	if err != nil || a1.Body != "to the first" || a1.TurnID != "turn-1" {
		t.Fatalf("turn 1 got %+v %v", a1, err)
	}
}

// Only the askee may answer; bad asks and answers are refused with their
// exit codes, and an ask to nobody is never open.
func TestLocalAskRefusals(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", settings{"max-body": "32"})
	alice, bob, carol := g.join("alice"), g.join("bob"), g.join("carol")
	for _, c := range []struct {
		name string
		tok  string
		req  api.Request
		exit fault.Code
	}{
		{"no credential", "", &api.AskRequest{To: "bob", Body: "q"}, fault.Refused},
		{"empty question", alice.Token, &api.AskRequest{To: "bob", Body: " "}, fault.Data},
		{"oversized question", alice.Token, &api.AskRequest{To: "bob", Body: strings.Repeat("x", 33)}, fault.Data},
		{"unknown askee", alice.Token, &api.AskRequest{To: "nobody", Body: "q"}, fault.NoRecipient},
		{"askee on a host without a broker", alice.Token, &api.AskRequest{To: "bob@h2", Body: "q"}, fault.NoRecipient},
		{"answer to no ask", bob.Token, &api.SendRequest{AnswerTo: "01a22a93-8b62-7719-997e-dae6eae12382", Body: "a"}, fault.NoRecipient},
		{"answer without credential", "", &api.SendRequest{AnswerTo: "01a22a93-8b62-7719-997e-dae6eae12382", Body: "a"}, fault.Refused},
	} {
		_, _, err := g.open(c.tok, c.req)
		if codeOf(err) != c.exit {
			t.Errorf("%s: %v, want exit %d", c.name, err, c.exit)
		}
	}
	c, sent := alice.ask("bob", "who answers?", "", 10_000)
	bob.collect("who answers?")
	_, err := carol.answer(sent.MsgID, "me")
	faultOf(t, err, fault.NoRecipient)
	_, err = bob.answer(sent.MsgID, "")
	faultOf(t, err, fault.Data)
	if _, err := bob.answer(sent.MsgID, "bob does"); err != nil {
		t.Fatal(err)
	}
	if a, err := second(t, c); err != nil || a.Body != "bob does" {
		t.Fatalf("alice got %+v %v", a, err)
	}
}

// An ask to an inject entity is injected ahead of stored mail (its asker's
// turn waits), once; the entity answers with its own credential.
func TestLocalAskInjected(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "hook.out")
	g := startGW(t, dir, "h1", nil)
	alice := g.join("alice")
	hook := g.join("hook", api.JoinRequest{Mode: "inject", Exec: "cat >> " + out})
	setStatus(t, hook, "busy")
	s := alice.mustSend("hook", "stored mail")
	c, sent := alice.ask("hook", "live question", "", 10_000)
	setStatus(t, hook, "idle")
	got := waitLines(t, out, 2)
	if b := envBodies(got); !slices.Equal(b, []string{"live question", "stored mail"}) || got[0].Kind != envelope.Ask {
		t.Fatalf("injected %q (%s first)", b, got[0].Kind)
	}
	alice.waitState(s.MsgID, "delivered")
	if _, err := hook.answer(sent.MsgID, "answered from a hook"); err != nil {
		t.Fatal(err)
	}
	if a, err := second(t, c); err != nil || a.Body != "answered from a hook" {
		t.Fatalf("alice got %+v %v", a, err)
	}
	// the ask is not injected a second time: the next line is a sentinel
	alice.mustSend("hook", "sentinel")
	if b := envBodies(waitLines(t, out, 3)); b[2] != "sentinel" {
		t.Fatalf("injected %q", b)
	}
}

// A gateway that stops ends the asking call with 69; after the restart the
// ask is gone with it (live only), and an answer reaches no one.
func TestLocalAskGatewayRestart(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	c, sent := alice.ask("bob", "before the restart", "", 10_000)
	bob.collect("before the restart")
	g.stop()
	_, err := second(t, c)
	if fe := faultOf(t, err, fault.Unavailable); fe.Kind != fault.KindShuttingDown {
		t.Fatalf("asking call at shutdown: %v (%s)", fe, fe.Kind)
	}
	g.start()
	_, err = bob.answer(sent.MsgID, "after the restart")
	// fleet(7): "the gateway restarted — ... fleet-send --answer exits 75";
	// the gateway forgot the ask with the restart and says 67 (unknown ask)
	if c := codeOf(err); c != fault.TempFail && c != fault.NoRecipient {
		t.Fatalf("an answer to an ask from before the restart: %v", err)
	}
	alice.empty(bob)
	bob.empty(alice)
}

// setStatus sets e's status as fleet-roster status does.
func setStatus(t testing.TB, e entity, status string) api.EntityRow {
	t.Helper()
	resp, err := e.gw.call(e.Token, &api.StatusRequest{Status: status})
	if err != nil {
		t.Fatalf("status %s of %s: %v", status, e.Name, err)
	}
	if resp.Entity == nil || resp.Entity.Status != status {
		t.Fatalf("status %s of %s: row %+v", status, e.Name, resp.Entity)
	}
	return *resp.Entity
}

// An ask whose injection fails is retried until it expires, never
// stored; the asker hears 75.
func TestLocalAskInjectFails(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice := g.join("alice")
	g.join("hook", api.JoinRequest{Mode: "inject", Exec: "echo refused >&2; exit 1"})
	c, sent := alice.ask("hook", "can you hear me?", "", 300)
	_, err := second(t, c)
	faultOf(t, err, fault.TempFail)
	g.waitLog(`"msg":"ask not injected: retrying until it expires","host":"h1","msg_id":"` + sent.MsgID + `"`)
	if strings.Contains(g.logs.String(), `"msg":"dead-lettered"`) {
		t.Error("an ask was dead-lettered: asks are never stored")
	}
}
