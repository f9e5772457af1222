// Package gateway is fleet-gw: the one process per host that owns the
// host's entities and their inboxes. A message's way through it, and the
// file to read for each step:
//
//   - asked: socket.go accepts a connection (conn.go: its framing, its
//     bounds, its peer check) and hands each request to its verb
//     (server.go dispatch); the caller is named by its credential
//     (gateway.go caller), never by the request.
//   - routed: route.go, the router part. Resolve is the routing fork: a
//     recipient of this host is found in the registry (registry.go), any
//     other in the peers' view (peers.go ByName; names.go for a name two
//     hosts have). Send checks the body, and a reply's original, and
//     takes one way or the other.
//   - stored: for a local recipient, intake.go Accept puts it in the
//     recipient's inbox in the store (pkg/store), durably, before the
//     sender hears "accepted"; a reply an open send waits for is handed to
//     it there (rendezvous.go).
//   - published: for another host, route.go publish records it and hands
//     it to the broker (pkg/broker), confirmed before "accepted".
//   - taken in, and acked to the broker: on the recipient's host,
//     intake.go Take / TakeBatch is the broker's handler — checked, stored
//     in the inbox (or handed to its part: receipts, answers, control and
//     trace answers); the error it returns is the broker's ack (nil),
//     refusal (bridge.dlq) or hold.
//   - delivered: inbox.go, the inboxes part, runs each entity's delivery
//     worker — an inject entity's paste (agent.go watches its agent) or
//     command, retried with backoff, dead-lettered at the end (Kill); a
//     pull entity's nudge hook. recv.go hands batches to fleet-recv, acked
//     by the client once it wrote them out; wake.go and follow.go serve
//     hook and follow readers. mailbox.go is one live entity: what is
//     stored of it, changed with the store (update), and its change signal.
//   - settled: receipt.go records it delivered or dead, tells the sender's
//     host (a RECEIPT) or bounces to the sender here; refusals.go (another
//     host refused it) and deaths.go (it died in a broker inbox) settle it
//     too. route.go Lookup and WaitState tell the sender what became of it.
//
// An entity comes and goes through the inboxes part too (entities.go
// Register, Unregister: the store, its broker inbox, its mailbox and
// worker, its credential), for join and leave, fleet-spawn and fleet-stop
// (control_exec.go). Beside the message's way: announcer.go says this
// host's entities (presence) and presence.go folds what other hosts say
// into peers.go; admit.go and certs.go decide what another host must
// prove; ask.go, control*.go, trace.go and dlq.go serve their own kinds;
// inboxcap.go holds inboxes to their caps; metrics.go serves /metrics.
//
// Each part owns its state, its lock and its goroutines, and is wired to
// the others once, in gateway.go (see Gateway). No two files call each
// other both ways except through gateway.go: TestNoTwoWayFileCalls counts
// the pairs that do, against a ceiling that only comes down.
package gateway
