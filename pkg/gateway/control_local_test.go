package gateway_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
)

// profiles is the config file text of the launcher profiles these tests
// use; out is where the env profile writes and inj delivers.
func profiles(dir string) string {
	return strings.Join([]string{
		"profile.w.launcher = exec",
		"profile.w.command = sleep 60",
		"profile.w.grace = 50ms",
		"profile.dies.launcher = exec",
		`profile.dies.command = echo "no such model" >&2; exit 4`,
		"profile.dies.grace = 10s",
		"profile.env.launcher = exec",
		`profile.env.command = echo "$FLEET_ENTITY $0 $* ${FLEET_TOKEN:+has-a-token}" > ` + filepath.Join(dir, "env.out") + "; exec sleep 60",
		"profile.env.grace = 0s",
		"profile.inj.launcher = exec",
		"profile.inj.mode = inject",
		"profile.inj.deliver = cat >> " + filepath.Join(dir, "inj.out"),
		"profile.inj.command = sleep 60",
		"profile.inj.grace = 0s",
		"profile.nodir.launcher = exec",
		"profile.nodir.command = sleep 60",
		"profile.nodir.dir = " + filepath.Join(dir, "no-such-folder"),
	}, "\n") + "\n"
}

// spawn is fleet-spawn as e; what it starts is stopped when the test ends.
func (e entity) spawn(req api.SpawnRequest) (*api.Spawned, error) {
	resp, err := e.gw.call(e.Token, &req)
	if err != nil {
		return nil, err
	}
	name := resp.Spawned.Name
	e.gw.t.Cleanup(func() { e.gw.call(e.Token, &api.StopRequest{Target: name}) })
	return resp.Spawned, nil
}

// stopEntity is fleet-stop as e.
func (e entity) stopEntity(target string) (*api.Stopped, error) {
	resp, err := e.gw.call(e.Token, &api.StopRequest{Target: target})
	if err != nil {
		return nil, err
	}
	return resp.Stopped, nil
}

// processGone waits until the process group a Stopped names is gone.
func processGone(t testing.TB, process string) {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimPrefix(process, "process group "))
	if err != nil || pid <= 1 {
		t.Fatalf("stopped %q: not a process group", process)
	}
	eventually(t, "process group "+strconv.Itoa(pid)+" gone", func() error {
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill -0: %v", err)
		}
		return nil
	})
}

// fleet-spawn and fleet-stop on one host: the entity is registered and
// its command runs; the same request id starts nothing new; fleet-stop
// stops the process and removes the entity, dead-lettering what waits.
func TestLocalSpawnStop(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "h1", settings{"file": profiles(dir)})
	main := g.join("main")
	sp, err := main.spawn(api.SpawnRequest{Name: "w1", Profile: "w", Groups: []string{"ci"}, RequestID: "nightly-42"})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Name != "w1" || sp.Host != "h1" || sp.Mode != "pull" || sp.Profile != "w" || sp.RequestID != "nightly-42" ||
		!slices.Equal(sp.Groups, []string{"ci"}) || ident.GidHost(sp.Gid) != "h1" {
		t.Fatalf("spawned %+v", sp)
	}
	if r, ok := g.rosterRow("w1"); !ok || r.Gid != sp.Gid || r.Mode != "pull" {
		t.Fatalf("w1 row %+v %v", r, ok)
	}
	g.waitLog(`"msg":"entity spawned"`)

	again, err := main.spawn(api.SpawnRequest{Name: "w1", Profile: "w", Groups: []string{"ci"}, RequestID: "nightly-42"})
	if err != nil || again.Gid != sp.Gid {
		t.Fatalf("the same request again: %+v %v, want gid %s", again, err, sp.Gid)
	}
	g.waitLog(`"msg":"control request carried out before: answered from the record"`)
	if n := g.logCount(`"msg":"entity spawned"`); n != 1 {
		t.Fatalf("%d spawns logged for one request id", n)
	}
	_, err = main.spawn(api.SpawnRequest{Name: "w2", Profile: "w", RequestID: "nightly-42"})
	if fe := faultOf(t, err, fault.Usage); !strings.Contains(fe.Msg, "was used before for another request") {
		t.Fatalf("a request id reused: %v", fe)
	}
	// a host id that is not one never becomes a routing key
	_, err = main.spawn(api.SpawnRequest{Name: "w3", Profile: "w", Host: "x.y"})
	if fe := faultOf(t, err, fault.Usage); !strings.Contains(fe.Msg, `"x.y" is not a host id`) {
		t.Fatalf("spawn on host x.y: %v", fe)
	}

	s1 := main.mustSend("w1", "one")
	s2 := main.mustSend("w1", "two")
	st, err := main.stopEntity("w1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Gid != sp.Gid || st.Name != "w1" || st.Host != "h1" || st.DeadLettered != 2 || !strings.HasPrefix(st.Process, "process group ") {
		t.Fatalf("stopped %+v", st)
	}
	processGone(t, st.Process)
	main.collect(
		"your message "+s1.MsgID+" to w1@h1 was dead-lettered: recipient left the fleet",
		"your message "+s2.MsgID+" to w1@h1 was dead-lettered: recipient left the fleet")
	if _, ok := g.rosterRow("w1"); ok {
		t.Fatal("w1 still in the roster")
	}
	_, err = main.stopEntity("w1")
	faultOf(t, err, fault.NoRecipient)

	// the name is free again; a spawned entity is stopped after a restart too
	sp2, err := main.spawn(api.SpawnRequest{Name: "w1", Profile: "w"})
	if err != nil || sp2.Gid == sp.Gid || sp2.RequestID == "" {
		t.Fatalf("spawn again: %+v %v", sp2, err)
	}
	g.restart()
	st, err = main.stopEntity(sp2.Gid)
	if err != nil || st.Name != "w1" || !strings.HasPrefix(st.Process, "process group ") {
		t.Fatalf("stop after a restart: %+v %v", st, err)
	}
	processGone(t, st.Process)
}

// Spawns that cannot be carried out, each with its exit code; a command
// that dies at once is a launch failure (71) with its output, leaves no
// entity behind, and may be tried again with the same request id.
func TestLocalSpawnRefusals(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "h1", settings{"file": profiles(dir)})
	main := g.join("main")
	g.join("taken")
	for _, c := range []struct {
		name string
		tok  string
		req  api.SpawnRequest
		exit fault.Code
		kind fault.Kind
	}{
		{"unknown profile", main.Token, api.SpawnRequest{Name: "x", Profile: "nope"}, fault.Usage, "unknown_profile"},
		{"default profile missing", main.Token, api.SpawnRequest{Name: "x"}, fault.Usage, "unknown_profile"},
		{"bad name", main.Token, api.SpawnRequest{Name: "1x", Profile: "w"}, fault.Usage, fault.KindUsage},
		{"bad request id", main.Token, api.SpawnRequest{Name: "x", Profile: "w", RequestID: "no spaces"}, fault.Usage, fault.KindUsage},
		{"name taken", main.Token, api.SpawnRequest{Name: "taken", Profile: "w"}, fault.Usage, fault.KindNameTaken},
		{"bad group", main.Token, api.SpawnRequest{Name: "x", Profile: "w", Groups: []string{"all"}}, fault.Usage, fault.KindUsage},
		{"other host without a broker", main.Token, api.SpawnRequest{Name: "x", Profile: "w", Host: "h2"}, fault.NoRecipient, "unknown_host"},
		{"no credential", "", api.SpawnRequest{Name: "x", Profile: "w"}, fault.Refused, fault.KindNoCredential},
	} {
		_, err := g.call(c.tok, &c.req)
		if codeOf(err) != c.exit || fault.KindOf(err) != c.kind {
			t.Errorf("%s: %v (%s), want exit %d %s", c.name, err, fault.KindOf(err), c.exit, c.kind)
		}
	}
	_, err := g.call(main.Token, &api.SpawnRequest{Name: "x", Profile: "nope"})
	if !strings.Contains(fault.HintOf(err), "profile.nope.command") || !strings.Contains(err.Error(), "(it has: dies, env, inj, nodir, w)") {
		t.Errorf("unknown profile: %v (hint %q)", err, fault.HintOf(err))
	}

	for i := range 2 { // forgotten after a clean failure: the same id fails afresh
		_, err := main.spawn(api.SpawnRequest{Name: "d", Profile: "dies", RequestID: "try-dies"})
		fe := faultOf(t, err, 71)
		if fe.Kind != "launch_failed" || !strings.Contains(fe.Msg, "no such model") || !strings.Contains(fe.Msg, "exited at once") {
			t.Fatalf("try %d: a command that dies at once: %v (%s)", i, fe, fe.Kind)
		}
		if _, ok := g.rosterRow("d"); ok {
			t.Fatalf("try %d: the entity of a failed spawn stays", i)
		}
	}
	_, err = main.spawn(api.SpawnRequest{Name: "d", Profile: "nodir", TimeoutMS: 5000})
	if fe := faultOf(t, err, 71); !strings.Contains(fe.Msg, "not a folder") {
		t.Fatalf("a profile whose folder is missing: %v", fe)
	}
	if n := g.logCount(`"msg":"launch failed"`); n != 3 {
		t.Errorf("%d launch failures logged, want 3", n)
	}

	for _, c := range []struct {
		name, target string
		exit         fault.Code
	}{{"no target", "", fault.Usage}, {"unknown", "nobody", fault.NoRecipient}, {"unknown gid", "h1.01a22a93-8b62-7719-997e-dae6eae12382", fault.NoRecipient}} {
		_, err := main.stopEntity(c.target)
		if codeOf(err) != c.exit {
			t.Errorf("stop %s: %v, want exit %d", c.name, err, c.exit)
		}
	}
	_, err = g.call("", &api.StopRequest{Target: "taken"})
	faultOf(t, err, fault.Refused)
	if _, ok := g.rosterRow("taken"); !ok {
		t.Error("a refused stop removed the entity")
	}
}

// The command runs registered: it gets its name, arguments and
// credential; an inject profile's entity gets its mail through the
// profile's deliver command.
func TestLocalSpawnEnvironmentAndInject(t *testing.T) {
	dir := t.TempDir()
	g := startGW(t, dir, "h1", settings{"file": profiles(dir)})
	main := g.join("main")
	job, err := main.spawn(api.SpawnRequest{Name: "job7", Profile: "env", Args: []string{"--since", "yesterday"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the spawned command ran", func() error {
		data, err := os.ReadFile(filepath.Join(dir, "env.out"))
		if err != nil {
			return err
		}
		got := strings.TrimSpace(string(data))
		if !strings.HasSuffix(string(data), "\n") {
			// the shell's redirection made the file before echo wrote
			return fmt.Errorf("not written yet: %q", got)
		}
		if got != "job7 job7 --since yesterday has-a-token" {
			t.Fatalf("the command saw %q", got)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(g.Cfg.StateDir, "spawn", "job7."+job.Gid+".log")); err != nil {
		t.Errorf("the command's output log: %v", err)
	}

	sp, err := main.spawn(api.SpawnRequest{Name: "inj1", Profile: "inj"})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Mode != "inject" {
		t.Fatalf("spawned %+v", sp)
	}
	if r, _ := g.rosterRow("inj1"); r.Mode != "inject" || r.Target != "cat >> "+filepath.Join(dir, "inj.out") {
		t.Fatalf("inj1 row %+v", r)
	}
	main.mustSend("inj1", "hello spawned")
	if b := envBodies(waitLines(t, filepath.Join(dir, "inj.out"), 1)); !slices.Equal(b, []string{"hello spawned"}) {
		t.Fatalf("inj1 got %q", b)
	}
}

// fleet-stop of an entity that was joined, not spawned: nothing to stop
// but the entity.
func TestLocalStopJoined(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	main, bob := g.join("main"), g.join("bob")
	st, err := main.stopEntity("bob@h1")
	if err != nil {
		t.Fatal(err)
	}
	if st.Gid != bob.Gid || st.Process != "" || st.DeadLettered != 0 {
		t.Fatalf("stopped %+v", st)
	}
	_, err = g.call(bob.Token, &api.WhoamiRequest{})
	faultOf(t, err, fault.Refused)
	// no profiles at all: the error says so
	_, err = g.call(main.Token, &api.SpawnRequest{Name: "x", Profile: "w"})
	if fe := faultOf(t, err, fault.Usage); !strings.Contains(fe.Msg, "(it has: none)") {
		t.Fatalf("spawn without profiles: %v", fe)
	}
}
