// Command fleet-gw — see pkg/cli for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/gwapp"
)

func main() { os.Exit(cli.Main(gwapp.NewGatewayApp(), os.Args)) }
