package gateway_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
	amqp "github.com/rabbitmq/amqp091-go"
)

// threeHosts starts da, db and dd on the private broker, all enrolled
// with each other, each with set (plus the broker), as in issue 22.
func threeHosts(t *testing.T, set settings) (da, db, dd *testGW) {
	t.Helper()
	url := brokerURL(t)
	dir := t.TempDir()
	var gws []*testGW
	for _, h := range []string{"da", "db", "dd"} {
		s := settings{"broker": url}
		for k, v := range set {
			s[k] = v
		}
		gws = append(gws, &testGW{t: t, Host: h, Cfg: newConfig(t, dir, h, s), logs: &syncBuffer{}})
	}
	enrol(t, gws...)
	for _, g := range gws {
		g.start()
		t.Cleanup(func() {
			g.stop()
			g.noPermissionErrors()
		})
	}
	return gws[0], gws[1], gws[2]
}

// forgeReplay publishes, signed with from's host key as its gateway signs
// (so admitted as from's word), a SEND from from to "to" that claims to
// be a replay of the dead letter deadID: what a host that learnt another
// host's dead letter id can send. It returns the forged msg id.
func forgeReplay(t *testing.T, from, to entity, deadID, body string) string {
	t.Helper()
	env := envelope.New(envelope.Send, envelope.Party{Gid: from.Gid, Name: from.Name, Host: from.gw.Host},
		envelope.Party{Gid: to.Gid, Name: to.Name, Host: to.gw.Host}, body)
	env.ReplayOf = deadID
	publishSigned(t, from.gw, to, env)
	return env.MsgID
}

// publishSigned publishes env to to's inbox, signed with from's host key
// as from's gateway signs what it publishes.
func publishSigned(t *testing.T, from *testGW, to entity, env *envelope.Envelope) {
	t.Helper()
	sealAs(t, from, env, to.gw)
	raw, sig := signAs(t, from, env)
	publishBytes(t, from, to, env, raw, sig)
}

// publishBytes publishes raw, the encoding of env, with sig as from's
// signature, to to's inbox.
func publishBytes(t *testing.T, from *testGW, to entity, env *envelope.Envelope, raw, sig []byte) {
	t.Helper()
	ch, done := brokerChannel(t)
	defer done()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), broker.ExMsg, to.Gid, true, false, amqp.Publishing{
		ContentType: "application/json", MessageId: env.MsgID, Type: string(env.Kind), DeliveryMode: amqp.Persistent, Body: raw,
		Headers: amqp.Table{"fleet-host": from.Host, "fleet-trace-id": env.TraceID,
			"fleet-sig": base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("the forged message was not confirmed: %v", err)
	}
}

// A msg id is its sender's host's only: host db sends full@dd a message
// of its own under the msg id of alice@da's message that full has. It is
// refused to bridge.dlq with its reason, not dropped as "already seen";
// and da's own copy again is still a plain duplicate. (Had db's come
// first, da's would be refused the same way: kept in bridge.dlq for an
// operator, never dropped as seen.)
func TestCrossMsgIDIsItsHostsOnly(t *testing.T) {
	da, db, dd := threeHosts(t, settings{})
	alice, mallory, full := da.join("alice"), db.join("mallory"), dd.join("full")
	da.resolves("full@dd")
	s := alice.mustSend(full.Gid, "the real one")
	full.collect("the real one")

	env := envelope.New(envelope.Send, envelope.Party{Gid: mallory.Gid, Name: mallory.Name, Host: "db"},
		envelope.Party{Gid: full.Gid, Name: full.Name, Host: "dd"}, "squatting")
	env.MsgID = s.MsgID
	publishSigned(t, db, full, env)
	dd.waitLog(`"msg":"message refused: wrong_host; sent to bridge.dlq"`)
	refusal := dlqCopy(t, s.MsgID)
	if refusal.Headers["fleet-reason"] != broker.ReasonWrongHost || refusal.Headers["fleet-host"] != "db" ||
		!strings.Contains(fmt.Sprint(refusal.Headers["fleet-error"]), "a msg id is its sender's host's only") {
		t.Fatalf("the squatting message in bridge.dlq: %v", refusal.Headers)
	}
	if n := dd.logCount("duplicate msg id: not stored again"); n != 0 {
		t.Errorf("dd dropped %d messages as already seen", n)
	}
	// the same message again from its own host: a duplicate, as ever
	again := envelope.New(envelope.Send, envelope.Party{Gid: alice.Gid, Name: alice.Name, Host: "da"},
		envelope.Party{Gid: full.Gid, Name: full.Name, Host: "dd"}, "the real one")
	again.MsgID = s.MsgID
	publishSigned(t, da, full, again)
	dd.waitLog("duplicate msg id: not stored again")
	full.empty(alice)
}

// brokerChannel is a channel on a connection of the test's own to the
// private broker; done closes the connection (unacked gets go back).
func brokerChannel(t *testing.T) (ch *amqp.Channel, done func()) {
	t.Helper()
	conn, err := amqp.Dial(brokerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if ch, err = conn.Channel(); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return ch, func() { conn.Close() }
}

// signAs encodes env and signs it with g's host key, as g's gateway signs
// what it publishes.
func signAs(t *testing.T, g *testGW, env *envelope.Envelope) (raw, sig []byte) {
	t.Helper()
	raw, err := envelope.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	key, err := trust.HostKey(g.Cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return raw, ed25519.Sign(key, raw)
}

// sealAs seals env's body as from's gateway seals what it publishes
// (sealing.go): to the hosts of to and to from, bound to env.
func sealAs(t *testing.T, from *testGW, env *envelope.Envelope, to ...*testGW) {
	t.Helper()
	var rs []*seal.Recipient
	for _, g := range append([]*testGW{from}, to...) {
		ring, err := seal.LoadKeyring(g.Cfg.StateDir)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, ring.Public())
	}
	sealed, err := seal.Seal(seal.Bind(string(env.Kind), env.MsgID, from.Host), []byte(env.Body), rs)
	if err != nil {
		t.Fatal(err)
	}
	env.Sealed, env.Body = sealed, ""
}

// forgeDeadCopy is a dead letter as host from's gateway would sign it
// for bridge.dlq: a SEND from from to "to" under the msg id msgID.
func forgeDeadCopy(t *testing.T, from, to entity, msgID, body string) (raw, sig []byte) {
	t.Helper()
	env := envelope.New(envelope.Send, envelope.Party{Gid: from.Gid, Name: from.Name, Host: from.gw.Host},
		envelope.Party{Gid: to.Gid, Name: to.Name, Host: to.gw.Host}, body)
	env.MsgID = msgID
	return signAs(t, from.gw, env)
}

// Issue 22, point 5, as found: alice@da's message dies at its sender (the
// broker inbox of full@dd is full); host db learns its id and sends
// full@dd a message claiming to be its replay; then da's operator replays
// the dead letter. The claim is db's word about a message of db's own: it
// does not stand in for da's replay, which full gets, once.
func TestCrossForgedReplayDoesNotBurnTheReal(t *testing.T) {
	da, db, dd := threeHosts(t, settings{"inbox-max-length": "1"})
	alice, mallory, full := da.join("alice"), db.join("mallory"), dd.join("full")
	da.resolves("full@dd")
	dd.stop()
	alice.mustSend(full.Gid, "fills it")
	_, err := alice.send(full.Gid, "the real one")
	if fe := faultOf(t, err, fault.TempFail); fe.Kind != fault.KindInboxFull {
		t.Fatalf("send into a full inbox: %v (%s)", fe, fe.Kind)
	}
	dead := da.must("", &api.DeadRequest{}).Dead
	if len(dead) != 1 || dead[0].Envelope == nil || dead[0].Envelope.Body != "the real one" {
		t.Fatalf("da's dead letters: %+v", dead)
	}
	lost := dead[0].Record.MsgID
	dd.start()
	full.collect("fills it")

	forged := forgeReplay(t, mallory, full, lost, "forged")
	got := full.collect("forged")
	if e := got[0].Envelope; e.MsgID != forged || e.Sender.Gid != mallory.Gid || e.Sender.Host != "db" {
		t.Fatalf("the forged message reached full as %+v", e)
	}

	r, err := da.call("", &api.ReplayRequest{MsgID: lost})
	if err != nil || r.Sent.ReplayOf != lost || r.Sent.Again || r.Sent.State != "accepted" {
		t.Fatalf("replay on da: %+v %v", sentOf(r), err)
	}
	got = full.collect("the real one")
	if e := got[0].Envelope; e.MsgID != r.Sent.MsgID || e.ReplayOf != lost || e.Sender.Gid != alice.Gid {
		t.Fatalf("full got the replay as %+v", e)
	}
	if n := dd.logCount("duplicate msg id: not stored again"); n != 0 {
		t.Errorf("dd dropped %d messages as already seen", n)
	}
	full.empty(alice) // once: nothing else came
}

// The same claim where the recipient's host has the dead letter itself
// (alice@da's message died on dd: its delivery kept failing): db's claim
// is refused to bridge.dlq with its reason, and dd's operator's replay
// delivers the real message once.
func TestCrossForgedReplayRefused(t *testing.T) {
	da, db, dd := threeHosts(t, settings{"delivery-attempts": "2"})
	dir := t.TempDir()
	out, ok := filepath.Join(dir, "full.out"), filepath.Join(dir, "ok")
	alice, mallory := da.join("alice"), db.join("mallory")
	full := dd.join("full", api.JoinRequest{Mode: "inject", Exec: "test -e " + ok + " || exit 3; cat >> " + out})
	da.resolves("full@dd")
	s := alice.mustSend(full.Gid, "the real one")
	eventually(t, "the message dies on dd", func() error {
		for _, d := range dd.must("", &api.DeadRequest{Name: "full"}).Dead {
			if d.Record.MsgID == s.MsgID {
				return nil
			}
		}
		return errors.New("not dead yet")
	})

	forged := forgeReplay(t, mallory, full, s.MsgID, "forged")
	dd.waitLog(`"msg":"message refused: wrong_host; sent to bridge.dlq"`)
	refusal := dlqCopy(t, forged)
	if refusal.Headers["fleet-reason"] != broker.ReasonWrongHost || refusal.Headers["fleet-refused-by"] != "dd" ||
		!strings.Contains(fmt.Sprint(refusal.Headers["fleet-error"]), "only its sender's host replays it") {
		t.Fatalf("the forged replay in bridge.dlq: %v", refusal.Headers)
	}
	if rec, err := dd.call(full.Token, &api.LookupRequest{MsgID: forged}); err == nil {
		t.Fatalf("dd took the forged replay in: %+v", rec.Record)
	}

	// nor does a copy in bridge.dlq under the same msg id, signed by db,
	// pass for the dead letter dd has from da
	raw, sig := forgeDeadCopy(t, mallory, full, s.MsgID, "forged copy")
	_, err := dd.call("", &api.ReplayRequest{Raw: raw, Sig: sig, SignedBy: "db"})
	if fe := faultOf(t, err, fault.Refused); fe.Kind != fault.KindNotAuthentic || !strings.Contains(fe.Msg, "that copy is not it") {
		t.Fatalf("replay of db's copy on dd: %v (%s)", fe, fe.Kind)
	}

	if err := os.WriteFile(ok, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := dd.call("", &api.ReplayRequest{MsgID: s.MsgID})
	if err != nil || r.Sent.ReplayOf != s.MsgID || r.Sent.Again {
		t.Fatalf("replay on dd: %+v %v", sentOf(r), err)
	}
	got := waitLines(t, out, 1)
	if e := got[0]; e.Body != "the real one" || e.MsgID != r.Sent.MsgID || e.ReplayOf != s.MsgID || e.Sender.Gid != alice.Gid {
		t.Fatalf("full got %+v", e)
	}
	// once: a sentinel sent after it comes next, and alone
	alice.mustSend(full.Gid, "sentinel")
	if got := waitLines(t, out, 2); got[1].Body != "sentinel" {
		t.Fatalf("full got %q", envBodies(got))
	}
}

// On the host that replays: alice@da's message expires in full@dd's
// broker inbox, so bridge.dlq holds da's copy; db puts a copy of its own
// there under the same msg id. dd's operator replays db's copy first,
// then da's: each is its own host's dead letter, delivered once, and
// db's never stands in for da's; da's own replay of it is then dropped
// by dd as that same dead letter.
func TestCrossForgedDeadLetterCopy(t *testing.T) {
	da, db, dd := threeHosts(t, settings{"inbox-ttl": "2s"})
	alice, mallory, full := da.join("alice"), db.join("mallory"), dd.join("full")
	da.resolves("full@dd")
	dd.stop()
	s := alice.mustSend(full.Gid, "the real one")
	if _, err := alice.waitFor(s.MsgID, "dead", 30_000); err != nil {
		t.Fatal(err)
	}
	real := dlqCopy(t, s.MsgID)
	realSig, _ := base64.StdEncoding.DecodeString(fmt.Sprint(real.Headers["fleet-sig"]))
	dd.start()

	raw, sig := forgeDeadCopy(t, mallory, full, s.MsgID, "forged copy")
	r1, err := dd.call("", &api.ReplayRequest{Raw: raw, Sig: sig, SignedBy: "db"})
	if err != nil || r1.Sent.ReplayOf != s.MsgID || r1.Sent.Again {
		t.Fatalf("replay of db's copy: %+v %v", sentOf(r1), err)
	}
	r2, err := dd.call("", &api.ReplayRequest{Raw: real.Body, Sig: realSig, SignedBy: "da"})
	if err != nil || r2.Sent.ReplayOf != s.MsgID || r2.Sent.Again || r2.Sent.MsgID == r1.Sent.MsgID {
		t.Fatalf("replay of da's copy after db's: %+v %v", sentOf(r2), err)
	}
	got := full.collect("forged copy", "the real one")
	if e := got[0].Envelope; e.Sender.Gid != mallory.Gid {
		t.Fatalf("db's copy reached full as from %+v", e.Sender)
	}
	if e := got[1].Envelope; e.MsgID != r2.Sent.MsgID || e.Sender.Gid != alice.Gid {
		t.Fatalf("da's copy reached full as %+v", e)
	}
	r3, err := da.call("", &api.ReplayRequest{MsgID: s.MsgID})
	if err != nil || r3.Sent.ReplayOf != s.MsgID {
		t.Fatalf("replay on da: %+v %v", sentOf(r3), err)
	}
	dd.waitLog("duplicate msg id: not stored again")
	full.empty(alice) // once: nothing else came
}

// sentOf is what a replay's response says was sent, or nil.
func sentOf(r *api.Response) *api.Sent {
	if r == nil {
		return nil
	}
	return r.Sent
}

// dlqCopy is the copy of msgID in bridge.dlq (left there).
func dlqCopy(t *testing.T, msgID string) amqp.Delivery {
	t.Helper()
	ch, done := brokerChannel(t)
	defer done()
	var seen []string
	for {
		d, ok, err := ch.Get(broker.QDLQ, false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("no copy of %s in bridge.dlq (saw %q)", msgID, seen)
		}
		if d.MessageId == msgID {
			return d // unacked: the broker keeps it when the channel closes
		}
		seen = append(seen, d.MessageId)
	}
}
