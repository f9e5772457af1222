// Command hello is the start-up floor of the per-call figure: a Go program
// that prints one line, built as the fleet binaries are (static, stripped).
package main

import "os"

func main() { os.Stdout.WriteString("hello\n") }
