package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/accept"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The control executor alone (control_exec.go), against a real store in a
// temp folder and the real exec launcher: no socket, no broker. Its hooks
// register into the store and registry as the gateway would, and count.

type execRig struct {
	t          *testing.T
	st         *store.Store
	x          *controlExec
	registered []string // names
	left       []string // gids
	answers    []*envelope.Envelope
	answerErr  error
	traced     int
}

func newExecRig(t *testing.T) *execRig {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &config.Config{Host: "h1", StateDir: dir, Socket: filepath.Join(dir, "gw.sock"), DedupWindow: time.Hour,
		Profiles: map[string]*config.Profile{
			"w":    {Name: "w", Launcher: "exec", Command: "sleep 60", Mode: "pull"},
			"dies": {Name: "dies", Launcher: "exec", Command: "exit 4", Mode: "pull", Grace: 10 * time.Second},
		}}
	r := &execRig{t: t, st: st}
	reg := newRegistry()
	r.x = &controlExec{cfg: cfg, st: st, log: log, reg: reg, follow: newFollowers(st, log, func(string) {}),
		ctx: context.Background,
		answer: func(_ context.Context, gid string, env *envelope.Envelope) error {
			if gid != env.Recipient.Gid {
				t.Errorf("answer published to %s, addressed to %s", gid, env.Recipient.Gid)
			}
			r.answers = append(r.answers, env)
			return r.answerErr
		},
		trace: func(*envelope.Envelope) error { r.traced++; return nil },
		register: func(e *store.Entity) error {
			token, hash := ident.Issue(e.Gid)
			e.Host, e.TokenHash = "h1", hash
			if err := st.CreateEntity(e); err != nil {
				return err
			}
			reg.Add(&mailbox{ent: *e, done: make(chan struct{})})
			if _, err := ident.Save(dir, e.Name, token); err != nil { // the command starts now
				return err
			}
			r.registered = append(r.registered, e.Name)
			return nil
		},
		unregister: func(gid, name string) (int, error) {
			reg.Remove(gid)
			if _, err := st.DeleteEntity(gid, "recipient left the fleet"); err != nil {
				return 0, err
			}
			r.left = append(r.left, gid)
			return 0, nil
		},
	}
	return r
}

var ialice = envelope.Party{Gid: "h2.0190aaaa-0000-7000-8000-00000000000a", Name: "alice", Host: "h2"}

// request is a control request of alice's, id id, for host h1.
func (r *execRig) request(kind envelope.Kind, id string, body any) *envelope.Envelope {
	data, err := json.Marshal(body)
	if err != nil {
		r.t.Fatal(err)
	}
	env := envelope.New(kind, ialice, envelope.Party{Host: "h1", Group: "control"}, string(data))
	env.MsgID = id
	return env
}

// groupGone waits until the process group a Stopped names is gone.
func groupGone(t *testing.T, process string) {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimPrefix(process, "process group "))
	if err != nil || pid <= 1 {
		t.Fatalf("stopped %q: not a process group", process)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(-pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still there", pid)
		}
	}
}

func kindOf(res *controlResult) fault.Kind {
	if res.Error == nil {
		return ""
	}
	return res.Error.Kind
}

// A request id is carried out once: the same SPAWN again is answered from
// the record with the same gid and starts nothing; a STOP stops the
// process and removes the entity, once.
func TestControlExecSpawnAndStopOncePerRequest(t *testing.T) {
	r := newExecRig(t)
	spawn := r.request(envelope.Spawn, "req-1", spawnBody{Name: "carl", Profile: "w", Groups: []string{"ops"}})
	res := r.x.CarryOut(spawn)
	if res.Error != nil || res.Spawned == nil {
		t.Fatalf("spawn: %+v", res.Error)
	}
	s := res.Spawned
	if s.Name != "carl" || s.Host != "h1" || s.RequestID != "req-1" || s.Profile != "w" || len(s.Groups) != 1 {
		t.Fatalf("spawned %+v", s)
	}
	again := r.x.CarryOut(r.request(envelope.Spawn, "req-1", spawnBody{Name: "carl", Profile: "w", Groups: []string{"ops"}}))
	if again.Spawned == nil || again.Spawned.Gid != s.Gid || len(r.registered) != 1 {
		t.Fatalf("the same request again: %+v (registered %v), want the same gid, registered once", again.Spawned, r.registered)
	}
	if rec, err := r.st.ControlRequest("req-1"); err != nil || rec.State != store.ControlDone {
		t.Fatalf("record of req-1: %+v, %v", rec, err)
	}
	// another request for the same name: taken
	if res := r.x.CarryOut(r.request(envelope.Spawn, "req-2", spawnBody{Name: "carl", Profile: "w"})); kindOf(res) != fault.KindNameTaken {
		t.Fatalf("a second carl: %+v, want name taken", res.Error)
	}

	stop := r.request(envelope.Stop, "req-3", stopBody{Gid: s.Gid, Name: "carl"})
	res = r.x.CarryOut(stop)
	if res.Error != nil || res.Stopped == nil || res.Stopped.Gid != s.Gid || res.Stopped.Host != "h1" {
		t.Fatalf("stop: %+v %+v", res.Stopped, res.Error)
	}
	groupGone(t, res.Stopped.Process)
	if len(r.left) != 1 || r.x.reg.Get(s.Gid) != nil {
		t.Fatalf("after the stop: left %v, still registered %v", r.left, r.x.reg.Get(s.Gid) != nil)
	}
	again = r.x.CarryOut(r.request(envelope.Stop, "req-3", stopBody{Gid: s.Gid, Name: "carl"}))
	if again.Stopped == nil || again.Stopped.Process != res.Stopped.Process || len(r.left) != 1 {
		t.Fatalf("the same stop again: %+v (left %v), want the record's answer", again.Stopped, r.left)
	}
	// a new stop of what is gone
	if res := r.x.CarryOut(r.request(envelope.Stop, "req-4", stopBody{Gid: s.Gid, Name: "carl"})); kindOf(res) != fault.KindUnknownEntity {
		t.Fatalf("stopping carl twice: %+v, want unknown entity", res.Error)
	}
}

// A spawn that failed cleanly leaves no record, so its id may be tried
// again; an id used for another subject, an expired request and a spawn
// cut short by a crash are answered, never carried out.
func TestControlExecRefusesWhatItMustNotCarryOut(t *testing.T) {
	r := newExecRig(t)
	if res := r.x.CarryOut(r.request(envelope.Spawn, "r1", spawnBody{Name: "carl", Profile: "nope"})); kindOf(res) != fault.KindUnknownProfile ||
		!strings.Contains(res.Error.Message, "dies, w") {
		t.Fatalf("unknown profile: %+v", res.Error)
	}
	if res := r.x.CarryOut(r.request(envelope.Spawn, "r1", spawnBody{Name: "carl", Profile: "dies"})); kindOf(res) != fault.KindLaunchFailed {
		t.Fatalf("a command that dies at once: %+v, want launch failed", res.Error)
	}
	if len(r.left) != 1 || r.x.reg.Len() != 0 {
		t.Fatalf("a command that died: left %v, %d registered; want it undone", r.left, r.x.reg.Len())
	}
	if _, err := r.st.ControlRequest("r1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("failed spawns left a record: %v", err)
	}
	res := r.x.CarryOut(r.request(envelope.Spawn, "r1", spawnBody{Name: "carl", Profile: "w"}))
	if res.Error != nil {
		t.Fatalf("the same id, tried again: %+v", res.Error)
	}
	t.Cleanup(func() { r.x.CarryOut(r.request(envelope.Stop, "cleanup", stopBody{Gid: res.Spawned.Gid})) })

	if res := r.x.CarryOut(r.request(envelope.Spawn, "r1", spawnBody{Name: "dora", Profile: "w"})); kindOf(res) != fault.KindUsage {
		t.Fatalf("request id r1 reused for dora: %+v, want usage", res.Error)
	}
	if res := r.x.CarryOut(r.request(envelope.Spawn, "bad", spawnBody{Name: "../x", Profile: "w"})); res.Error == nil {
		t.Fatal("a spawn of ../x was carried out")
	}
	late := r.request(envelope.Spawn, "r2", spawnBody{Name: "dora", Profile: "w"})
	late.Expires = time.Now().Add(-time.Second)
	if res := r.x.CarryOut(late); kindOf(res) != fault.KindTimeout {
		t.Fatalf("an expired request: %+v, want timeout", res.Error)
	}
	if _, err := r.st.ControlRequest("r2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an expired request left a record: %v", err)
	}
	if res := r.x.CarryOut(r.request(envelope.Presence, "r5", struct{}{})); kindOf(res) != fault.KindBadEnvelope {
		t.Fatalf("a PRESENCE as a control request: %+v", res.Error)
	}

	// the gateway died while spawning r3: never started again
	if _, err := r.st.BeginControl("r3", envelope.Spawn, "erin", time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res := r.x.CarryOut(r.request(envelope.Spawn, "r3", spawnBody{Name: "erin", Profile: "w"})); kindOf(res) != fault.KindSpawnUncertain {
			t.Fatalf("a spawn cut short: %+v, want uncertain", res.Error)
		}
	}
	if _, taken := r.x.reg.Named("erin"); taken {
		t.Fatal("a spawn cut short was carried out again")
	}
	// a stop cut short is simply carried out again
	if _, err := r.st.BeginControl("r4", envelope.Stop, res.Spawned.Gid, time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if res := r.x.CarryOut(r.request(envelope.Stop, "r4", stopBody{Gid: res.Spawned.Gid})); res.Stopped == nil {
		t.Fatalf("a stop cut short: %+v, want it carried out", res.Error)
	}

	// Prune forgets what was answered before the dedup window
	r.x.cfg.DedupWindow = -time.Hour
	r.x.Prune()
	if _, err := r.st.ControlRequest("r4"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a request answered before the window: %v, want pruned", err)
	}
}

// Take answers the requester in its inbox, in reply to the request; a
// requester gone is no error, a request naming none is refused, a trace
// query goes to its part.
func TestControlExecTakeAnswersTheRequester(t *testing.T) {
	r := newExecRig(t)
	req := r.request(envelope.Stop, "t1", stopBody{Gid: "h1.0190aaaa-0000-7000-8000-0000000000ff"})
	req.Expires = time.Now().Add(time.Minute).UTC()
	if err := r.x.Take(req); err != nil {
		t.Fatal(err)
	}
	if len(r.answers) != 1 {
		t.Fatalf("%d answers, want 1", len(r.answers))
	}
	ans := r.answers[0]
	var res controlResult
	if err := json.Unmarshal([]byte(ans.Body), &res); err != nil {
		t.Fatal(err)
	}
	if ans.Kind != envelope.StopResult || ans.InReplyTo != "t1" || ans.Recipient.Gid != ialice.Gid || ans.Sender.Host != "h1" ||
		!ans.Expires.Equal(req.Expires) || res.RequestID != "t1" || kindOf(&res) != fault.KindUnknownEntity {
		t.Fatalf("answer %+v: %+v", ans, res)
	}
	r.answerErr = fault.New(fault.NoRecipient, fault.KindUnknownEntity, "gone")
	if err := r.x.Take(r.request(envelope.Stop, "t2", stopBody{Gid: "x"})); err != nil {
		t.Fatalf("the requester's inbox gone: %v, want the answer dropped", err)
	}
	r.answerErr = errors.New("broker down")
	if err := r.x.Take(r.request(envelope.Stop, "t3", stopBody{Gid: "x"})); err == nil {
		t.Fatal("an answer not published: no error, the request would be acked")
	}
	anon := r.request(envelope.Stop, "t4", stopBody{Gid: "x"})
	anon.Sender.Gid = ""
	var refusal *broker.Refusal
	if err := r.x.Take(anon); !errors.As(err, &refusal) || refusal.Reason != broker.ReasonMalformed {
		t.Fatalf("a request naming no requester: %v, want malformed", err)
	}
	if err := r.x.Take(r.request(envelope.Trace, "t5", struct{}{})); err != nil || r.traced != 1 {
		t.Fatalf("a trace query: %v, traced %d", err, r.traced)
	}
}

// A request carried out before is answered from its record after the
// policy changed (it was allowed then), never refused; a new one the
// policy refuses leaves no record, so the same id goes once it is
// allowed. A STOP meets its target's policy the same way.
func TestControlExecRecordBeforePolicy(t *testing.T) {
	r := newExecRig(t)
	p := newPolicy("h1", nil, r.st, r.x.reg, nil, nil, nil)
	all, err := accept.ParseAll([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	bobOnly, err := accept.ParseAll([]string{"bob@h2"})
	if err != nil {
		t.Fatal(err)
	}
	p.def = all
	r.x.policy = p
	body := spawnBody{Name: "carl", Profile: "w"}
	res := r.x.CarryOut(r.request(envelope.Spawn, "req-1", body))
	if res.Error != nil || res.Spawned == nil {
		t.Fatalf("spawn: %+v", res.Error)
	}
	gid := res.Spawned.Gid
	p.def = bobOnly // alice is no longer accepted
	again := r.x.CarryOut(r.request(envelope.Spawn, "req-1", body))
	if again.Error != nil || again.Spawned == nil || again.Spawned.Gid != gid || len(r.registered) != 1 {
		t.Fatalf("req-1 again after the policy changed: %+v %+v; want its recorded answer, gid %s", again.Spawned, again.Error, gid)
	}
	// a new request: refused, and nothing recorded
	if res := r.x.CarryOut(r.request(envelope.Spawn, "req-2", spawnBody{Name: "dora", Profile: "w"})); kindOf(res) != fault.KindNotAccepted {
		t.Fatalf("req-2: %+v, want not_accepted", res.Error)
	}
	if _, err := r.st.ControlRequest("req-2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused request left a record: %v", err)
	}
	// a STOP its target's policy refuses: nothing done, nothing recorded
	stop := stopBody{Gid: gid, Name: "carl"}
	if res := r.x.CarryOut(r.request(envelope.Stop, "req-3", stop)); kindOf(res) != fault.KindNotAccepted {
		t.Fatalf("req-3: %+v, want not_accepted", res.Error)
	}
	if r.x.reg.Get(gid) == nil || len(r.left) != 0 {
		t.Fatal("a refused stop removed carl")
	}
	if _, err := r.st.ControlRequest("req-3"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused stop left a record: %v", err)
	}
	// allowed: the same ids go now
	p.def = all
	done := r.x.CarryOut(r.request(envelope.Stop, "req-3", stop))
	if done.Error != nil || done.Stopped == nil || done.Stopped.Gid != gid {
		t.Fatalf("req-3 once allowed: %+v %+v", done.Stopped, done.Error)
	}
	groupGone(t, done.Stopped.Process)
	if res := r.x.CarryOut(r.request(envelope.Spawn, "req-2", spawnBody{Name: "dora", Profile: "w"})); res.Error != nil || res.Spawned == nil {
		t.Fatalf("req-2 once allowed: %+v", res.Error)
	}
	// and the stop, delivered again after the policy changed back:
	// its recorded answer
	p.def = bobOnly
	again = r.x.CarryOut(r.request(envelope.Stop, "req-3", stop))
	if again.Error != nil || again.Stopped == nil || again.Stopped.Process != done.Stopped.Process || len(r.left) != 1 {
		t.Fatalf("req-3 again: %+v %+v; want its recorded answer", again.Stopped, again.Error)
	}
}
