// Phase 4: fleet-spawn onto another host, to the new entity's first
// delivered message.

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/scripts/internal/benchkit"
)

type spawnSeries struct {
	profile string
	grace   string
	total   []time.Duration // OpSpawn call -> first message out of OpRecv
	spawn   []time.Duration // the OpSpawn call
	deliver []time.Duration // spawn returned -> message out of OpRecv (credential read, recv opened, send, recv)
	send    []time.Duration // the OpSend call from h1
	stop    []time.Duration // the OpStop call
	failed  []string        // spawns that failed (each retried under a new name)
}

// spawnCommand is the profile's command: it notes its pid (the leader of
// its process group: the exec launcher gives it its own session) for the
// cleanup, then sleeps a bounded time.
func spawnCommand(pidfile string) string {
	return fmt.Sprintf("echo $$ >> %s; exec sleep %d", pidfile, spawnSleep)
}

// writeProfiles writes the gateways' config file: the fleet-spawn profiles
// of the benchmark (exec launcher, pull entities), bench with the default
// grace and bench0 with none, both running spawnCommand(pidfile).
func writeProfiles(conf, pidfile string) error {
	cmd := strconv.Quote(spawnCommand(pidfile))
	return os.WriteFile(conf, []byte(strings.Join([]string{
		"# fleet-spawn profiles of the benchmark (exec launcher, pull entities)",
		"profile.bench.launcher = exec",
		"profile.bench.mode = pull",
		"profile.bench.command = " + cmd,
		"profile.bench0.launcher = exec",
		"profile.bench0.mode = pull",
		"profile.bench0.grace = 0s",
		"profile.bench0.command = " + cmd,
		"",
	}, "\n")), 0o600)
}

// killSpawned ends the process groups listed in pidfile whose leader is
// still our sleep: SIGTERM, then SIGKILL.
func killSpawned(pidfile string) {
	var pids []int
	for _, f := range strings.Fields(benchkit.ReadFile(pidfile)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 {
			continue
		}
		cmdline := strings.ReplaceAll(benchkit.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)), "\x00", " ")
		if strings.HasPrefix(cmdline, "sleep "+strconv.Itoa(spawnSleep)) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if syscall.Kill(pid, 0) == nil {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}

func spawnPhase(gws []*benchkit.Gateway) ([]*spawnSeries, error) {
	h1, h2 := gws[0], gws[1]
	fmt.Printf("== 4. fleet-spawn from %s onto %s (exec launcher, pull entity, command sleeps) -> first message out of OpRecv; %d per profile\n",
		h1.Host, h2.Host, *flagSpawns)
	admin, err := h1.Dial("")
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	tok, err := benchkit.Join(admin, "boss")
	if err != nil {
		return nil, err
	}
	bc, err := h1.Dial(tok)
	if err != nil {
		return nil, err
	}
	defer bc.Close()
	var out []*spawnSeries
	for _, p := range []struct{ name, grace, prefix string }{{"bench", "500ms (default)", "spa"}, {"bench0", "0", "spb"}} {
		s := &spawnSeries{profile: p.name, grace: p.grace}
		maxFailed := max(2, *flagSpawns/3)
		for i := 0; len(s.total) < *flagSpawns; i++ {
			name := fmt.Sprintf("%s%02d", p.prefix, i)
			t0 := time.Now()
			resp, err := bc.Call(&api.SpawnRequest{Name: name, Host: h2.Host, Profile: p.name, TimeoutMS: spawnTimeout.Milliseconds()})
			if err != nil {
				// counted, reported, and tried again under another name (a
				// SPAWN that reaches h2 late still starts a process there:
				// its pid lands in the pid file and the cleanup ends it)
				s.failed = append(s.failed, fmt.Sprintf("%s after %v: %v", name, time.Since(t0).Round(time.Millisecond), err))
				fmt.Printf("   spawn %s on %s FAILED after %v: %v\n", name, h2.Host, time.Since(t0).Round(time.Millisecond), err)
				if len(s.failed) > maxFailed {
					return nil, fmt.Errorf("%d spawns failed, last: %w; %s log:\n%s", len(s.failed), err, h1.Host, benchkit.Tail(h1.Log))
				}
				continue
			}
			t1 := time.Now()
			if resp.Spawned == nil || resp.Spawned.Gid == "" {
				return nil, fmt.Errorf("spawn %s: no gid in the answer", name)
			}
			gid := resp.Spawned.Gid
			token := strings.TrimSpace(benchkit.ReadFile(filepath.Join(h2.State, "credentials", name+".token")))
			if !strings.Contains(token, gid) {
				return nil, fmt.Errorf("spawn %s: credential file on %s does not hold gid %s", name, h2.Host, gid)
			}
			rc, err := h2.Dial(token)
			if err != nil {
				return nil, err
			}
			if err := rc.Send(&api.RecvRequest{Follow: true, Max: 1}); err != nil {
				rc.Close()
				return nil, err
			}
			ts := time.Now()
			sresp, err := bc.Call(&api.SendRequest{To: name, Body: "hello, " + name})
			if err != nil {
				rc.Close()
				return nil, fmt.Errorf("send to %s: %w", name, err)
			}
			tsent := time.Now()
			got, err := recvOne(rc, sresp.Sent.MsgID)
			rc.Close()
			if err != nil {
				return nil, fmt.Errorf("recv of %s: %w", name, err)
			}
			s.total = append(s.total, got.Sub(t0))
			s.spawn = append(s.spawn, t1.Sub(t0))
			s.deliver = append(s.deliver, got.Sub(t1))
			s.send = append(s.send, tsent.Sub(ts))
			tstop := time.Now()
			if _, err := bc.Call(&api.StopRequest{Target: gid, TimeoutMS: spawnTimeout.Milliseconds()}); err != nil {
				return nil, fmt.Errorf("stop %s: %w", name, err)
			}
			s.stop = append(s.stop, time.Since(tstop))
		}
		fmt.Printf("profile %s (grace %s): spawn -> first delivered message %s  (OpSpawn call %s; then to delivery %s; OpSend %s; OpStop %s; failed spawns %d)\n",
			p.name, p.grace, p5099(s.total), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.spawn), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.deliver), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.send), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.stop), 50)), len(s.failed))
		out = append(out, s)
	}
	fmt.Println()
	return out, nil
}

// recvOne reads a recv --max 1 stream until the message with id, acks it
// and returns when it was read.
func recvOne(rc *api.Client, id string) (time.Time, error) {
	for i := 0; i < 100; i++ {
		resp, err := rc.Read()
		if err != nil {
			return time.Time{}, err
		}
		if resp.End {
			return time.Time{}, errors.New("recv ended before the message came")
		}
		now := time.Now()
		var acks []string
		found := false
		for _, d := range resp.Batch {
			acks = append(acks, d.Envelope.MsgID)
			found = found || d.Envelope.MsgID == id
		}
		if err := rc.Send(&api.AckRequest{Acks: acks}); err != nil {
			return time.Time{}, err
		}
		if found {
			return now, nil
		}
	}
	return time.Time{}, errors.New("message never came")
}

// printSummary prints the series' lines of the summary.
func (s *spawnSeries) printSummary() {
	fmt.Printf("4. fleet-spawn -> first delivered message, profile %s (grace %s), n=%d: p50 %s  p99 %s  (OpSpawn call p50 %s; failed spawns %d)\n",
		s.profile, s.grace, len(s.total), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.total), 50)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.total), 99)), benchkit.Ms(benchkit.Pct(benchkit.Sorted(s.spawn), 50)), len(s.failed))
	for _, f := range s.failed {
		fmt.Printf("   failed: %s\n", f)
	}
}
