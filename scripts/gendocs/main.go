// Command gendocs writes fleet's man pages and shell completions from the
// command definitions in pkg/cli:
//
//	go run ./scripts/gendocs -out DIR
//
// writes DIR/man/NAME.1, DIR/completions/NAME.bash and DIR/completions/_NAME
// for every command. `make generate` runs it with -out . and
// `make check-generated` diffs a fresh run against the committed files.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/fleetd/fleet/pkg/docs"
)

func main() {
	out := flag.String("out", "", "folder to write man/ and completions/ into (required)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/gendocs -out DIR")
		os.Exit(64)
	}
	if err := docs.Generate(*out); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: error: %v\n", err)
		os.Exit(1)
	}
}
