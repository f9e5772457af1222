// Command pasterec stands in for an agent in a tmux pane for the tests: it
// puts its terminal in raw mode, optionally enables bracketed paste (writes
// ESC[?2004h), then appends every byte it reads from the terminal, exactly
// as received, to FILE. Once ready it writes "ready" to FILE.ready. It runs
// until killed.
//
//	pasterec [-bracketed] FILE
package main

import (
	"flag"
	"fmt"
	"os"

	"golang.org/x/term"
)

func main() {
	bracketed := flag.Bool("bracketed", false, "enable bracketed paste")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: pasterec [-bracketed] FILE")
		os.Exit(64)
	}
	if err := run(flag.Arg(0), *bracketed); err != nil {
		fmt.Fprintln(os.Stderr, "pasterec:", err)
		os.Exit(1)
	}
}

func run(path string, bracketed bool) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return err
	}
	defer term.Restore(fd, old)
	if bracketed {
		if _, err := os.Stdout.WriteString("\x1b[?2004h"); err != nil {
			return err
		}
	}
	if err := os.WriteFile(path+".ready", []byte("ready\n"), 0o644); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				return werr
			}
			// a line taken shows on the screen, as a real program's
			// input does (the gateway's proof for a program without hooks)
			for _, c := range buf[:n] {
				if c == '\r' {
					os.Stdout.WriteString("pasterec: took a line\r\n")
				}
			}
		}
		if err != nil {
			return err
		}
	}
}
