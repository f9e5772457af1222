// Command fleet-spawn — see pkg/cli for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
)

func main() { os.Exit(cli.Main(cli.NewSpawnApp(), os.Args)) }
