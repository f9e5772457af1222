// Command fakegw stands in for another user's trap for the tests: it
// listens on a unix socket as a gateway would, answers every hello as a
// gateway does, answers every other request "ok", and appends every frame
// it receives (a credential, a message's text) to FILE, one per line. Run
// as another uid, it is the socket a shared state folder or /tmp could
// hold; a command that checks who serves its socket never reaches it.
// With -dial it is the other side: a client that checks nothing, sends a
// hello to SOCKET and prints the answer (what a gateway says to a
// stranger who got past the socket's mode).
//
//	fakegw SOCKET FILE
//	fakegw -dial SOCKET
package main

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/fleetd/fleet/pkg/api"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-dial" {
		dial(os.Args[2])
		return
	}
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: fakegw SOCKET FILE")
		os.Exit(64)
	}
	os.Remove(os.Args[1])
	ln, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakegw:", err)
		os.Exit(1)
	}
	os.Chmod(os.Args[1], 0o777) // anyone may dial it: that is the trap
	out, err := os.OpenFile(os.Args[2], os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakegw:", err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		go serve(c, out)
	}
}

func serve(c net.Conn, out *os.File) {
	defer c.Close()
	for {
		b, err := api.ReadFrame(c, 1<<20)
		if err != nil {
			return
		}
		out.Write(append(b, '\n'))
		req, err := api.DecodeRequest(b)
		if err != nil {
			return
		}
		resp := &api.Response{OK: true}
		if _, hello := req.(*api.HelloRequest); hello {
			resp.Hello = &api.Hello{Proto: api.Proto, Host: "h1", Version: "fake", MaxBody: 1 << 20, Pid: os.Getpid()}
		}
		if err := api.WriteFrame(c, resp); err != nil {
			return
		}
	}
}

func dial(socket string) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakegw:", err)
		os.Exit(1)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// a gateway that refuses the peer says so at once and closes: the
	// hello may then meet a closed socket (EPIPE), and the answer is
	// still there to read
	_ = api.WriteFrame(c, &api.HelloRequest{Proto: api.Proto})
	b, err := api.ReadFrame(c, 1<<20)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakegw:", err)
		os.Exit(1)
	}
	fmt.Println(string(b))
}
