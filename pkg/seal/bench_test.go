package seal

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/fleetd/fleet/pkg/envelope"
)

// BenchmarkSeal is what sealing adds per message (issue 27, point 7), for
// scripts/bench-seal.sh, each side beside its floor: what it already
// pays per message unsealed. The sender: "send-plain" encodes the
// envelope and signs it (the floor), "send-sealed" seals the body (once
// per message: a broadcast is sealed once, one stanza per host), encodes
// the envelope with the sealed bytes (base64 in the JSON) and signs that.
// One receiving host: "recv-plain" verifies the signature and decodes
// the envelope (the floor), "recv-sealed" does the same and opens the
// body (its keyring from files, as the gateway holds it; each host of a
// broadcast opens once). Each reports the plain envelope's size
// (B-plain) and how many bytes sealing adds to it (B-added): the sealed
// envelope's size less the plain one's.
func BenchmarkSeal(b *testing.B) {
	me := host(b)
	_, signer, _ := ed25519.GenerateKey(nil)
	pub := signer.Public().(ed25519.PublicKey)
	from := envelope.Party{Gid: "h1.0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a8c", Name: "alice", Host: "h1"}
	for _, c := range []struct {
		name  string
		body  int
		hosts int
	}{{"512B", 512, 1}, {"64KiB", 64 << 10, 1}, {"bcast10", 512, 10}, {"bcast100", 512, 100}} {
		body := bytes.Repeat([]byte("review the diff, then reply. "), c.body/29+1)[:c.body]
		to := envelope.Party{Gid: "h2.0193b0a8-8f5e-7c1a-9d2b-3c4d5e6f7a8d", Name: "bob", Host: "h2"}
		kind := envelope.Send
		if c.hosts > 1 {
			to, kind = envelope.Party{Group: "reviewers"}, envelope.Broadcast
		}
		plain := envelope.New(kind, from, to, string(body))
		bind := Bind(string(kind), plain.MsgID, "h1")
		rcpts := []*Recipient{me.Public()}
		for len(rcpts) < c.hosts {
			id, err := age.GenerateX25519Identity()
			if err != nil {
				b.Fatal(err)
			}
			rcpts = append(rcpts, recipientOf(id))
		}
		// this host's stanza last: the worst place for a scan, none for
		// the key id table
		rcpts[0], rcpts[len(rcpts)-1] = rcpts[len(rcpts)-1], rcpts[0]
		sealEnv := func() []byte {
			sealed, err := Seal(bind, body, rcpts)
			if err != nil {
				b.Fatal(err)
			}
			e := *plain
			e.Body, e.Sealed = "", sealed
			raw, err := envelope.Encode(&e)
			if err != nil {
				b.Fatal(err)
			}
			return raw
		}
		plainRaw, err := envelope.Encode(plain)
		if err != nil {
			b.Fatal(err)
		}
		sealedRaw := sealEnv()
		plainSig, sealedSig := ed25519.Sign(signer, plainRaw), ed25519.Sign(signer, sealedRaw)
		size, added := float64(len(plainRaw)), float64(len(sealedRaw)-len(plainRaw))
		report := func(b *testing.B) {
			b.ReportMetric(size, "B-plain")
			b.ReportMetric(added, "B-added")
		}
		b.Run(c.name+"/send-plain", func(b *testing.B) {
			cpuLoop(b, func() {
				raw, err := envelope.Encode(plain)
				if err != nil {
					b.Fatal(err)
				}
				ed25519.Sign(signer, raw)
			})
			report(b)
		})
		b.Run(c.name+"/send-sealed", func(b *testing.B) {
			cpuLoop(b, func() { ed25519.Sign(signer, sealEnv()) })
			report(b)
		})
		b.Run(c.name+"/recv-plain", func(b *testing.B) {
			cpuLoop(b, func() {
				if !ed25519.Verify(pub, plainRaw, plainSig) {
					b.Fatal("verify")
				}
				if _, err := envelope.Decode(plainRaw, 1<<20); err != nil {
					b.Fatal(err)
				}
			})
			report(b)
		})
		b.Run(c.name+"/recv-sealed", func(b *testing.B) {
			cpuLoop(b, func() {
				if !ed25519.Verify(pub, sealedRaw, sealedSig) {
					b.Fatal("verify")
				}
				e, err := envelope.Decode(sealedRaw, 1<<20)
				if err != nil {
					b.Fatal(err)
				}
				text, err := Open(bind, e.Sealed, me)
				if err != nil || len(text) != len(body) {
					b.Fatal(err)
				}
			})
			report(b)
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
