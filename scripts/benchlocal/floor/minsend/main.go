// Command minsend is the floor of fleet-send without its command-line
// framework: it dials the gateway, says hello and sends one message
// (FLEET_SOCKET, FLEET_TOKEN; recipient and text as arguments), through
// the same client package. It is a benchmark baseline, not a command.
package main

import (
	"fmt"
	"os"

	"github.com/fleetd/fleet/pkg/api"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: minsend NAME TEXT")
		os.Exit(64)
	}
	c, err := api.Dial(os.Getenv("FLEET_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "minsend:", err)
		os.Exit(69)
	}
	defer c.Close()
	c.Token = os.Getenv("FLEET_TOKEN")
	resp, err := c.Call(&api.SendRequest{To: os.Args[1], Body: os.Args[2]})
	if err != nil {
		fmt.Fprintln(os.Stderr, "minsend:", err)
		os.Exit(1)
	}
	fmt.Println(resp.Sent.MsgID)
}
