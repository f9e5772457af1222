// Command fleet-dlq — see pkg/cli/dlqapp for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/dlqapp"
)

func main() { os.Exit(cli.Main(dlqapp.NewDLQApp(), os.Args)) }
