// Command fleet-mcp — see pkg/cli/mcpapp for its definition.
package main

import (
	"os"

	"github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/cli/mcpapp"
)

func main() { os.Exit(cli.Main(mcpapp.NewMCPApp(), os.Args)) }
