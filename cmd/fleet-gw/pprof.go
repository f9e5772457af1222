//go:build pprof

// A profiling hook for benchmarks, in binaries built with -tags pprof
// only: FLEET_PPROF_ADDR=127.0.0.1:PORT serves net/http/pprof there
// (go tool pprof http://127.0.0.1:PORT/debug/pprof/profile?seconds=20).
// FLEET_PPROF_RATES=1 also samples blocking and mutex contention.

package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
)

func init() {
	addr := os.Getenv("FLEET_PPROF_ADDR")
	if addr == "" {
		return
	}
	if os.Getenv("FLEET_PPROF_RATES") == "1" {
		runtime.SetBlockProfileRate(10000) // one sample per 10 µs blocked
		runtime.SetMutexProfileFraction(10)
	}
	go func() { _ = http.ListenAndServe(addr, nil) }()
}
