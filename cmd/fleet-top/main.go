// Command fleet-top — see pkg/cli/topapp for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/topapp"
)

func main() { os.Exit(cli.Main(topapp.NewTopApp(), os.Args)) }
