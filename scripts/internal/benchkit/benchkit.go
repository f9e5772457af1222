// Package benchkit holds what the benchmark programs in scripts/ share:
// cleanup on every exit path, the one gateway launcher (gateway.go: start
// fleet-gw in a folder of its own, wait for it, stop it), /proc readings
// (memory, CPU, load, the filesystem under a path) and the small
// statistics they print.
package benchkit

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	cleanMu  sync.Mutex // held while cleaning up: a second caller waits
	cleanups []func()
)

// AtCleanup registers f to run at Cleanup.
func AtCleanup(f func()) {
	cleanMu.Lock()
	cleanups = append(cleanups, f)
	cleanMu.Unlock()
}

// Cleanup runs the registered cleanups, last first, once each; a
// concurrent caller returns only when they are done.
func Cleanup() {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

// Main runs a benchmark program: run, then the cleanups, then exit 1 with
// "NAME: error: ..." if run failed. A SIGINT, SIGTERM or SIGHUP, or the
// timeout passing, runs the cleanups at once (saying what it cleans, in
// stopping) and exits 130 or 3. Call after flag.Parse.
func Main(name, stopping string, timeout time.Duration, run func() error) {
	var interrupted atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "%s: %v: %s\n", name, s, stopping)
		Cleanup()
		os.Exit(130)
	}()
	watchdog := time.AfterFunc(timeout, func() {
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "%s: -timeout %v passed: %s\n", name, timeout, stopping)
		Cleanup()
		os.Exit(3)
	})
	err := run()
	if interrupted.Load() {
		select {} // the signal or timeout path exits
	}
	watchdog.Stop()
	Cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: error: %v\n", name, err)
		os.Exit(1)
	}
}

// Memory is a process's memory from /proc/PID/status, in KiB: RssFile is
// mostly mmap'd file pages (bbolt), RssAnon the Go heap and stacks.
type Memory struct{ RSS, HWM, Anon, File, Threads int64 }

// ReadMemory reads pid's memory.
func ReadMemory(pid int) (Memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			m.RSS = n
		case "VmHWM":
			m.HWM = n
		case "RssAnon":
			m.Anon = n
		case "RssFile":
			m.File = n
		case "Threads":
			m.Threads = n
		}
	}
	if m.RSS == 0 {
		return m, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}

// ProcCPU returns pid's user+system CPU time so far, from /proc/PID/stat
// (fields 14 and 15, in clock ticks of 1/100 s on Linux); 0 when unknown.
func ProcCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// SelfCPU returns this process's user+system CPU time so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ReadFile returns a file's contents, "" when it cannot be read.
func ReadFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// Tail returns the last 4,000 bytes of a file (a log, for an error).
func Tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// Loadavg returns the 1, 5 and 15 minute load averages.
func Loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// FSType names the type of the filesystem under path (from
// /proc/self/mounts), since fsync cost depends on it.
func FSType(path string) string {
	data, _ := os.ReadFile("/proc/self/mounts")
	best, typ := "", "unknown"
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mnt := f[1]
		if (path == mnt || strings.HasPrefix(path, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) > len(best) {
			best, typ = mnt, f[2]
		}
	}
	return typ
}

// Pct returns the p-th percentile (nearest rank) of sorted d.
func Pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i]
}

// Sorted returns a sorted copy of d.
func Sorted(d []time.Duration) []time.Duration {
	out := append([]time.Duration(nil), d...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Ms formats d in milliseconds.
func Ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// MiB formats a KiB count in MiB.
func MiB(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// Split returns part i of total divided into parts, the remainder spread
// over the first parts.
func Split(total, parts, i int) int {
	n := total / parts
	if i < total%parts {
		n++
	}
	return n
}

// Met says whether a target was met.
func Met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}
