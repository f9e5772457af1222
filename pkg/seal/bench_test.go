package seal

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
)

// BenchmarkSeal is what sealing adds per message (issue 27, point 7), for
// scripts/bench-seal.sh: per case, the floors are the Ed25519 signature
// of the same body ("sign", what the sender already pays once per
// message) and its verification ("verify", what each receiving host
// already pays); "seal" is the sender's Seal (once per message: a
// broadcast is sealed once, one stanza per host), "open" one receiving
// host's Open (its keyring from files, as the gateway holds it; each host
// of a broadcast opens once). Each reports B-added: how many more bytes the
// envelope carries, the sealed bytes in base64 (a JSON string field)
// against the body itself.
func BenchmarkSeal(b *testing.B) {
	me := host(b)
	_, signer, _ := ed25519.GenerateKey(nil)
	pub := signer.Public().(ed25519.PublicKey)
	bind := Bind("SEND", "0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a8b", "h1")
	for _, c := range []struct {
		name  string
		body  int
		hosts int
	}{{"512B", 512, 1}, {"64KiB", 64 << 10, 1}, {"bcast10", 512, 10}, {"bcast100", 512, 100}} {
		body := bytes.Repeat([]byte("review the diff, then reply. "), c.body/29+1)[:c.body]
		to := []*Recipient{me.Public()}
		for len(to) < c.hosts {
			id, err := age.GenerateX25519Identity()
			if err != nil {
				b.Fatal(err)
			}
			to = append(to, recipientOf(id))
		}
		// this host's stanza last: the worst place for a scan, none for
		// the key id table
		to[0], to[len(to)-1] = to[len(to)-1], to[0]
		sealed, err := Seal(bind, body, to)
		if err != nil {
			b.Fatal(err)
		}
		added := float64(base64.StdEncoding.EncodedLen(len(sealed)) - len(body))
		sig := ed25519.Sign(signer, body)
		b.Run(c.name+"/sign", func(b *testing.B) {
			cpuLoop(b, func() { ed25519.Sign(signer, body) })
		})
		b.Run(c.name+"/verify", func(b *testing.B) {
			cpuLoop(b, func() {
				if !ed25519.Verify(pub, body, sig) {
					b.Fatal("verify")
				}
			})
		})
		b.Run(c.name+"/seal", func(b *testing.B) {
			cpuLoop(b, func() {
				if _, err := Seal(bind, body, to); err != nil {
					b.Fatal(err)
				}
			})
			b.ReportMetric(added, "B-added")
		})
		b.Run(c.name+"/open", func(b *testing.B) {
			cpuLoop(b, func() {
				if _, err := Open(bind, sealed, me); err != nil {
					b.Fatal(err)
				}
			})
			b.ReportMetric(added, "B-added")
		})
	}
}

// cpuLoop runs f as the benchmark's loop and reports, besides the wall
// time, the process's CPU time per call (user + system, GC included):
// on a machine shared with other work the wall time is mostly waiting
// for a core, the CPU time what the call costs.
func cpuLoop(b *testing.B, f func()) {
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	n := 0
	for b.Loop() {
		f()
		n++
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
}

// ExampleSeal is the whole round: one host seals, the other opens.
func ExampleSeal() {
	alice, bob := mustKeyring(), mustKeyring()
	bind := Bind("SEND", "m-1", "h1")
	sealed, _ := Seal(bind, []byte("hello, bob"), []*Recipient{bob.Public()})
	text, err := Open(bind, sealed, bob)
	fmt.Printf("%s %v\n", text, err)
	_, err = Open(bind, sealed, alice)
	fmt.Println(err)
	// Output:
	// hello, bob <nil>
	// sealed to other hosts: 1 recipient keys, none of this host's
}
