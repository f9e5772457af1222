package gateway_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
)

// waitFile waits until path exists.
func waitFile(t testing.TB, path string) {
	t.Helper()
	eventually(t, path+" exists", func() error {
		_, err := os.Stat(path)
		return err
	})
}

// A clean stop (SIGTERM) while an injection is under way drains it: the
// injection finishes within drain-timeout and is recorded as delivered,
// once. After the restart the message must read delivered, not be held
// as "uncertain" (that is for a gateway killed mid-injection). (It once
// was: the delivery loop returned without recording a delivery that
// succeeded after the stop began.)
func TestLocalStopDrainsInjection(t *testing.T) {
	dir := t.TempDir()
	out, started := filepath.Join(dir, "hook.out"), filepath.Join(dir, "started")
	g := startGW(t, dir, "h1", settings{"drain-timeout": "10s"})
	alice := g.join("alice")
	g.join("hook", api.JoinRequest{Mode: "inject", Exec: "touch " + started + "; sleep 0.3; cat >> " + out})
	s := alice.mustSend("hook", "in flight at the stop")
	waitFile(t, started)
	g.restart()
	if b := envBodies(lines(t, out)); !slices.Equal(b, []string{"in flight at the stop"}) {
		t.Fatalf("injected %q", b)
	}
	if rec := alice.record(s.MsgID); rec.State != "delivered" {
		t.Fatalf("a message injected during the drain reads %s after the restart: %s", rec.State, rec.Reason)
	}
	alice.empty(g.join("carol")) // no bounce
}

// A delivery that outlasts the drain bound is aborted (its command
// killed), and the gateway stops anyway; the message is not lost.
func TestLocalStopAbortsAfterDrainBound(t *testing.T) {
	dir := t.TempDir()
	out, started := filepath.Join(dir, "hook.out"), filepath.Join(dir, "started")
	g := startGW(t, dir, "h1", settings{"drain-timeout": "100ms", "delivery-attempts": "5"})
	alice := g.join("alice")
	cmd := "if [ -e " + started + " ]; then cat >> " + out + "; else touch " + started + "; exec sleep 30; fi"
	g.join("hook", api.JoinRequest{Mode: "inject", Exec: cmd})
	s := alice.mustSend("hook", "slow")
	waitFile(t, started)
	logs := g.logs
	g.stop()
	if !strings.Contains(logs.String(), `"msg":"drain bound passed: aborting in-flight work"`) {
		t.Fatalf("no abort logged:\n%s", logs)
	}
	g.start()
	if b := envBodies(waitLines(t, out, 1)); !slices.Equal(b, []string{"slow"}) {
		t.Fatalf("after the restart hook got %q", b)
	}
	alice.waitState(s.MsgID, "delivered")
}

// --until while the gateway stops: 69.
func TestLocalWaitAtShutdown(t *testing.T) {
	g := startGW(t, t.TempDir(), "h1", nil)
	alice, bob := g.join("alice"), g.join("bob")
	s := alice.mustSend("bob", "never read")
	c := g.dial(alice.Token)
	if err := c.Send(&api.WaitRequest{MsgID: s.MsgID, Until: "delivered", TimeoutMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	// waiting, or not yet taken up when the stop begins: 69 either way
	g.stop()
	_, err := c.Read()
	if codeOf(err) != fault.Unavailable {
		t.Fatalf("--until at shutdown: %v", err)
	}
	g.start()
	bob.collect("never read")
}

// The socket's folder and a stale socket file: a gateway makes the one
// and replaces the other; a socket under a file cannot be made (73).
func TestLocalSocketPlaces(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "fleet", "gw.sock")
	os.MkdirAll(filepath.Dir(sock), 0o700)
	os.WriteFile(sock, []byte("stale"), 0o600) // left by a crashed gateway
	g := startGW(t, dir, "h1", settings{"socket": sock})
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", fi, err)
	}
	if got := g.G.String(); got != "gateway h1" {
		t.Errorf("String() = %q", got)
	}
	g.stop()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after a clean stop: %v", err)
	}
	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, nil, 0o600)
	bad := &testGW{t: t, Host: "h2", Cfg: newConfig(t, dir, "h2", settings{"socket": filepath.Join(file, "gw.sock")}), logs: &syncBuffer{}}
	if err := runOnce(bad); codeOf(err) != fault.CantCreate {
		t.Fatalf("socket under a file: %v", err)
	}
}

// Delivery records and control requests are kept for the dedup window,
// then pruned; what still waits is not.
func TestLocalDedupWindowPrunes(t *testing.T) {
	dir := t.TempDir()
	// inbox-ttl at most dedup-window: 0, none, so that mail may wait
	// however long (with one, it would die at inbox-ttl: inboxcap.go)
	g := startGW(t, dir, "h1", settings{"dedup-window": "1ms", "inbox-ttl": "0s",
		"file": "profile.w.launcher = exec\nprofile.w.command = sleep 60\nprofile.w.grace = 0s\n"})
	alice, bob := g.join("alice"), g.join("bob")
	old := alice.mustSend("bob", "read long ago")
	bob.collect("read long ago")
	waiting := alice.mustSend("bob", "still waiting")
	if _, err := alice.spawn(api.SpawnRequest{Name: "w1", Profile: "w", RequestID: "once"}); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.stopEntity("w1"); err != nil {
		t.Fatal(err)
	}
	g.restart() // the janitor prunes at start
	g.waitLog(`"msg":"pruned delivery records past the dedup window"`)
	g.waitLog(`"msg":"pruned control requests past the dedup window"`)
	_, err := g.call(alice.Token, &api.LookupRequest{MsgID: old.MsgID})
	if fe := faultOf(t, err, fault.NoRecipient); !strings.Contains(fe.Hint, "dedup window") {
		t.Fatalf("a pruned record: %v (hint %q)", fe, fe.Hint)
	}
	bob.collect("still waiting")
	alice.waitState(waiting.MsgID, "delivered")
	// the request id is forgotten: the same id starts a new entity
	sp, err := alice.spawn(api.SpawnRequest{Name: "w1", Profile: "w", RequestID: "once"})
	if err != nil || sp.Name != "w1" {
		t.Fatalf("a pruned request id again: %+v %v", sp, err)
	}
}
