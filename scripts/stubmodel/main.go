// Command stubmodel runs the tests' stub model server (internal/stubmodel)
// on loopback: the one "model" the agent CLI tests talk to. It prints its
// URL on stdout once it listens and runs until it is signalled.
//
//	stubmodel [-addr 127.0.0.1:0] [-log requests.jsonl]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetd/fleet/internal/stubmodel"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback)")
	logPath := flag.String("log", "", "append each request to this file as a JSON line")
	flag.Parse()
	s, err := stubmodel.Start(*addr, *logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stubmodel: error:", err)
		os.Exit(69)
	}
	fmt.Println(s.URL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	s.Close()
}
