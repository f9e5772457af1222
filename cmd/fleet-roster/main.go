// Command fleet-roster — see pkg/cli for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/rosterapp"
)

func main() { os.Exit(cli.Main(rosterapp.NewRosterApp(), os.Args)) }
