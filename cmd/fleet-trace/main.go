// Command fleet-trace — see pkg/cli/traceapp for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/traceapp"
)

func main() { os.Exit(cli.Main(traceapp.NewTraceApp(), os.Args)) }
