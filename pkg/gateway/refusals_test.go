package gateway

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	hexenc "encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

func TestAdmitsView(t *testing.T) {
	now := time.Now()
	v := newAdmitsView("h1", 3*time.Second)
	if ok, known := v.admits("h2", false, now); !ok || known {
		t.Fatalf("unheard host: admits=%v known=%v, want true false", ok, known)
	}
	v.heard("h2", []string{"h3"}, false, now)
	if ok, known := v.admits("h2", false, now); ok || !known {
		t.Fatalf("h2 admits only h3: admits=%v known=%v", ok, known)
	}
	err := v.check("h2", false, now)
	if fault.CodeOf(err) != fault.Refused {
		t.Fatalf("check: %v, want 77", err)
	}
	if ok, _ := v.admits("h2", false, now.Add(4*time.Second)); !ok {
		t.Fatal("a word older than the TTL is unknown: sent as before")
	}
	v.heard("h2", []string{"h3"}, true, now)
	if ok, _ := v.admits("h2", true, now); !ok {
		t.Fatal("a certified host may be admitted by a host that admits certified ones")
	}
	v.heard("h2", []string{"h1", "not a host"}, false, now)
	if ok, known := v.admits("h2", false, now); !ok || !known {
		t.Fatal("h2 admits h1")
	}
}

// fakeNotices is a refusalNotices on a fake clock: its timers run when
// the test moves the clock past them.
type fakeNotices struct {
	*refusalNotices
	t      *testing.T
	clock  time.Time
	timers []fakeTimer
	got    []*envelope.Envelope
	at     []time.Time // when each was published
}

type fakeTimer struct {
	at time.Time
	f  func()
}

func newFakeNotices(t *testing.T, maxBody int) *fakeNotices {
	fn := &fakeNotices{t: t, clock: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)}
	fn.refusalNotices = &refusalNotices{host: "h2", maxBody: maxBody, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		publish: func(to string, env *envelope.Envelope) {
			fn.got = append(fn.got, env)
			fn.at = append(fn.at, fn.clock)
		},
		now:   func() time.Time { return fn.clock },
		later: func(d time.Duration, f func()) { fn.timers = append(fn.timers, fakeTimer{fn.clock.Add(d), f}) }}
	return fn
}

// advance moves the clock by d, running the timers due on the way.
func (fn *fakeNotices) advance(d time.Duration) {
	end := fn.clock.Add(d)
	for {
		k := -1
		for i, tm := range fn.timers {
			if !tm.at.After(end) && (k < 0 || tm.at.Before(fn.timers[k].at)) {
				k = i
			}
		}
		if k < 0 {
			break
		}
		tm := fn.timers[k]
		fn.timers = append(fn.timers[:k], fn.timers[k+1:]...)
		if tm.at.After(fn.clock) {
			fn.clock = tm.at
		}
		tm.f()
	}
	fn.clock = end
}

// perMinute checks that no minute (from the first notice) saw more than
// noticesPerMinute notices.
func (fn *fakeNotices) perMinute() {
	for i := range fn.at {
		n := 0
		for _, at := range fn.at[i:] {
			if at.Sub(fn.at[i]) < time.Minute {
				n++
			}
		}
		if n > noticesPerMinute {
			fn.t.Fatalf("%d notices in the minute from %s, over %d", n, fn.at[i].Format(time.TimeOnly), noticesPerMinute)
		}
	}
}

// sealedLike is env as a sealing gateway publishes it: its text in
// sealed bytes, the body empty (the notices never open them; the frame's
// head and host count are what Decode checks).
func sealedLike(env *envelope.Envelope) *envelope.Envelope {
	env.Sealed, env.Body = append([]byte("fsl1\x01"), env.Body...), ""
	return env
}

// A refused message that carries text in the clear (from a host named
// in plaintext-hosts, or refused as unsealed) is told by its digest
// only: its text is not put on the broker a second time.
func TestRefusalNoticeOfPlainTextIsADigest(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Name: "bob", Host: "h2"}
	fn := newFakeNotices(t, 1<<20)
	for _, msg := range []*envelope.Envelope{
		envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, "the secret plan"),
		sealedLike(envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, "the secret plan")),
	} {
		raw, _ := envelope.Encode(msg)
		fn.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonUnsealed, "in the clear"),
			Env: msg, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"})
	}
	if len(fn.got) != 2 {
		t.Fatalf("%d notices, want 2", len(fn.got))
	}
	for i, env := range fn.got {
		var rb receiptBody
		if err := json.Unmarshal([]byte(env.Body), &rb); err != nil || rb.Refused == nil {
			t.Fatalf("notice %s: %v", env.Body, err)
		}
		if plain := i == 0; plain != (rb.Refused.Body == "") || plain != (rb.Refused.SHA256 != "") {
			t.Fatalf("notice %d (plain %v): copy %q sha256 %q", i, plain, rb.Refused.Body, rb.Refused.SHA256)
		}
	}
}

// A burst of refusals from one host over the minute's bound: every one
// is told, the overflow in the next minutes, never more than
// noticesPerMinute a minute; each notice is one the sender believes.
func TestRefusalNoticeQueue(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Name: "bob", Host: "h2"}
	carol := envelope.Party{Gid: "h3.01a23400-3142-7e07-b4e3-15b27a9f1b78", Name: "carol", Host: "h3"}
	fn := newFakeNotices(t, 1<<20)
	const burst = 200
	sent := map[string]bool{}
	for i := 0; i < burst; i++ {
		msg := sealedLike(envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, "hello"))
		raw, _ := envelope.Encode(msg)
		sent[msg.MsgID] = true
		fn.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonUntrusted, "h1 is not trusted"),
			Env: msg, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"})
	}
	if len(fn.got) != noticesPerMinute {
		t.Fatalf("%d notices at once, want %d", len(fn.got), noticesPerMinute)
	}
	// another host has its own minute, even while h1's queue waits
	other := sealedLike(envelope.New(envelope.Send, carol, envelope.Party{Gid: bob.Gid}, "hi"))
	raw, _ := envelope.Encode(other)
	fn.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonUntrusted, "h3"),
		Env: other, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h3"})
	if len(fn.got) != noticesPerMinute+1 || fn.got[noticesPerMinute].InReplyTo != other.MsgID {
		t.Fatal("h3's notice waited behind h1's")
	}
	fn.got, fn.at = fn.got[:noticesPerMinute], fn.at[:noticesPerMinute]
	for m := 1; m <= 4 && len(fn.got) < burst; m++ {
		fn.advance(time.Minute)
	}
	if len(fn.got) != burst {
		t.Fatalf("%d of %d notices sent after 4 minutes", len(fn.got), burst)
	}
	if last := fn.at[len(fn.at)-1].Sub(fn.at[0]); last > 4*time.Minute {
		t.Fatalf("the last notice went %v after the first", last)
	}
	fn.perMinute()
	for _, env := range fn.got {
		var rb receiptBody
		if err := json.Unmarshal([]byte(env.Body), &rb); err != nil || rb.Refused == nil {
			t.Fatalf("notice %s: %v", env.Body, err)
		}
		if !sent[rb.MsgID] {
			t.Fatalf("a notice for %s: not refused, or told twice", rb.MsgID)
		}
		delete(sent, rb.MsgID)
		if _, err := believeRefusal(pub, env, &rb, nil); err != nil {
			t.Fatalf("the sender does not believe notice %s: %v", rb.MsgID, err)
		}
	}
	if len(fn.timers) != 0 || fn.queued != 0 {
		t.Fatalf("%d timers armed and %d bytes queued with nothing left", len(fn.timers), fn.queued)
	}
}

// Past noticeQueueBytes queued, a notice waits as its digest: memory
// stays bounded, and every message is still told.
func TestRefusalNoticeQueueBytes(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Name: "bob", Host: "h2"}
	fn := newFakeNotices(t, 1<<20)
	big := strings.Repeat("x", 100<<10)
	const burst = 300 // 300 copies of 100 KiB: twice noticeQueueBytes
	for i := 0; i < burst; i++ {
		msg := sealedLike(envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, big))
		raw, _ := envelope.Encode(msg)
		fn.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonUntrusted, "h1"),
			Env: msg, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"})
		if fn.queued > noticeQueueBytes {
			t.Fatalf("%d bytes queued, over %d", fn.queued, noticeQueueBytes)
		}
	}
	fn.advance(5 * time.Minute)
	if len(fn.got) != burst {
		t.Fatalf("%d of %d notices sent", len(fn.got), burst)
	}
	fn.perMinute()
	digests := 0
	for _, env := range fn.got {
		var rb receiptBody
		if err := json.Unmarshal([]byte(env.Body), &rb); err != nil || rb.Refused == nil {
			t.Fatalf("notice: %v", err)
		}
		if rb.Refused.Body == "" {
			digests++
		}
	}
	t.Logf("%d digests; a digest notice holds %d bytes queued", digests, (&pendingNotice{env: fn.got[burst-1]}).size())
	if digests == 0 || digests == burst {
		t.Fatalf("%d of %d notices as digests: want some, not all", digests, burst)
	}
}

// A TRACE refused here is answered as refused, to its requester, about
// its trace; one expired or naming no requester is not answered.
func TestRefusedTrace(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	fn := newFakeNotices(t, 1<<20)
	trace := envelope.NewID()
	query := func(exp time.Time, from envelope.Party) broker.RefusedMsg {
		body, _ := json.Marshal(traceQuery{TraceID: trace})
		q := envelope.New(envelope.Trace, from, envelope.Party{Host: "h2", Group: "control"}, string(body))
		q.TraceID, q.Expires = q.MsgID, exp
		raw, _ := envelope.Encode(q)
		return broker.RefusedMsg{Queue: broker.ControlQueue("h2"), Refusal: broker.Refuse(broker.ReasonUntrusted, "h1 is not trusted"),
			Env: q, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"}
	}
	m := query(fn.clock.Add(5*time.Second), alice)
	fn.refused(m)
	if len(fn.got) != 1 {
		t.Fatalf("%d answers, want 1", len(fn.got))
	}
	res := fn.got[0]
	var ans traceAnswer
	if err := json.Unmarshal([]byte(res.Body), &ans); err != nil {
		t.Fatal(err)
	}
	if res.Kind != envelope.TraceResult || res.InReplyTo != m.Env.MsgID || res.Recipient.Gid != alice.Gid ||
		res.Sender.Host != "h2" || ans.TraceID != trace || len(ans.Hops) != 0 || !ans.Refused ||
		!strings.Contains(ans.Error, "refused by h2") || !strings.Contains(ans.Error, "not trusted") {
		t.Fatalf("answer %+v: %s", res, res.Body)
	}
	if err := checkTraceAnswer(&ans, trace, "h2", fn.clock); err != nil {
		t.Fatalf("the requester refuses the answer: %v", err)
	}
	fn.refused(query(fn.clock.Add(-time.Second), alice))
	fn.refused(query(fn.clock.Add(5*time.Second), envelope.Party{Host: "h1"}))
	if len(fn.got) != 1 {
		t.Fatalf("%d answers: an expired query or one naming no requester was answered", len(fn.got))
	}
}

func TestBelieveRefusal(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Name: "bob", Host: "h2"}
	msg := envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, "hello")
	raw, err := envelope.Encode(msg)
	if err != nil {
		t.Fatal(err)
	}
	notice := envelope.New(envelope.Receipt, bob, alice, "")
	body := func(key ed25519.PrivateKey, id string) *receiptBody {
		return &receiptBody{MsgID: id, State: store.Dead, Reason: "refused by h2: bad_signature", At: time.Now(),
			Refused: &refusedCopy{Why: "bad_signature", Body: base64.StdEncoding.EncodeToString(raw),
				Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(key, raw))}}
	}
	if _, err := believeRefusal(pub, notice, body(priv, msg.MsgID), nil); err != nil {
		t.Fatalf("own signed message refused: %v", err)
	}
	if _, err := believeRefusal(pub, notice, body(other, msg.MsgID), nil); err == nil {
		t.Fatal("bytes another key signed were believed")
	}
	if _, err := believeRefusal(pub, notice, body(priv, envelope.NewID()), nil); err == nil {
		t.Fatal("a notice naming another msg id was believed")
	}
	carol := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b78", Name: "carol", Host: "h2"}
	if _, err := believeRefusal(pub, envelope.New(envelope.Receipt, carol, alice, ""), body(priv, msg.MsgID), nil); err == nil {
		t.Fatal("a notice from another entity than the recipient was believed")
	}

	// too big to quote: a digest, matched against the bytes kept here
	digest := func(b []byte, sigKey ed25519.PrivateKey) *receiptBody {
		rb := body(sigKey, msg.MsgID)
		sum := sha256.Sum256(b)
		rb.Refused.Body, rb.Refused.SHA256 = "", hexenc.EncodeToString(sum[:])
		return rb
	}
	kept := func(id string) []byte {
		if id == msg.MsgID {
			return raw
		}
		return nil
	}
	k, err := believeRefusal(pub, notice, digest(raw, priv), kept)
	if err != nil || string(k.raw) != string(raw) {
		t.Fatalf("a digest of kept bytes: %v", err)
	}
	if _, err := believeRefusal(pub, notice, digest(raw, priv), nil); !errors.Is(err, errNotKept) {
		t.Fatalf("a digest with nothing kept: %v, want errNotKept", err)
	}
	if _, err := believeRefusal(pub, notice, digest([]byte("other bytes"), priv), kept); err == nil {
		t.Fatal("a digest of other bytes than those kept was believed")
	}
	if _, err := believeRefusal(pub, notice, digest(raw, other), kept); err == nil {
		t.Fatal("a digest with another key's signature was believed")
	}
}

func TestKeptBytes(t *testing.T) {
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77"}
	if keptBytes(envelope.New(envelope.Send, alice, bob, "small")) != nil {
		t.Fatal("a small message's bytes kept")
	}
	big := envelope.New(envelope.Send, alice, bob, strings.Repeat("x", keepSentOver))
	raw, _ := envelope.Encode(big)
	if got := keptBytes(big); string(got) != string(raw) {
		t.Fatal("a large message's bytes not kept as published")
	}
	if keptBytes(envelope.New(envelope.Ask, alice, bob, strings.Repeat("x", keepSentOver))) != nil {
		t.Fatal("an ask's bytes kept")
	}
}

func TestAskRefused(t *testing.T) {
	a := newAsks()
	w := &askWaiter{gid: "h1.a", to: "h2.b", ch: make(chan *envelope.Envelope, 1), refused: make(chan string, 1)}
	a.Wait("m1", w)
	if a.Refused("m1", "h1.a", "h2.c", "x") || a.Refused("m1", "h1.c", "h2.b", "x") {
		t.Fatal("a refusal for another asker or askee ended the wait")
	}
	if !a.Refused("m1", "h1.a", "h2.b", "refused by h2: untrusted_host") {
		t.Fatal("the wait was not ended")
	}
	if why := <-w.refused; why != "refused by h2: untrusted_host" {
		t.Fatalf("why = %q", why)
	}
	if a.Waiter("m1") != nil || a.Refused("m1", "h1.a", "h2.b", "again") {
		t.Fatal("a refused ask still waits")
	}
	err := refusedAskFault(envelope.New(envelope.Ask, envelope.Party{}, envelope.Party{Gid: "h2.b", Name: "bob", Host: "h2"}, ""), "why")
	if fault.CodeOf(err) != fault.Refused || fault.KindOf(err) != fault.KindRefusedByHost {
		t.Fatalf("fault %v", err)
	}
}

// A refused message whose body this host cannot read is told from its
// head; one too big to quote is told by its digest.
func TestRefusalNoticeShapes(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77"}
	var got []*envelope.Envelope
	n := &refusalNotices{host: "h2", maxBody: 64 << 10, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		publish: func(to string, env *envelope.Envelope) {
			if to != alice.Gid {
				t.Errorf("a notice to %s", to)
			}
			got = append(got, env)
		}}
	id := envelope.NewID()
	newer := []byte(`{"v":"2.0","msg_id":"` + id + `","kind":"SEND","sender":{"gid":"` + alice.Gid + `"}}`)
	head := &envelope.Envelope{MsgID: id, Kind: envelope.Send, Sender: alice, Recipient: bob}
	n.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonNewerSchema, "2.0"),
		Env: head, Unread: true, Body: newer, Sig: ed25519.Sign(priv, newer), SignedBy: "h1"})
	big := envelope.New(envelope.Send, alice, bob, strings.Repeat("x", 100<<10))
	raw, _ := envelope.Encode(big)
	n.refused(broker.RefusedMsg{Queue: broker.InboxQueue(bob.Gid), Refusal: broker.Refuse(broker.ReasonForged, "bad"),
		Env: big, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"})
	if len(got) != 2 {
		t.Fatalf("%d notices, want 2", len(got))
	}
	var rb receiptBody
	if err := json.Unmarshal([]byte(got[0].Body), &rb); err != nil || rb.MsgID != id || rb.Refused == nil ||
		rb.Refused.Body != base64.StdEncoding.EncodeToString(newer) || rb.Refused.Why != broker.ReasonNewerSchema {
		t.Fatalf("the unreadable message's notice: %s", got[0].Body)
	}
	rb = receiptBody{}
	sum := sha256.Sum256(raw)
	if err := json.Unmarshal([]byte(got[1].Body), &rb); err != nil || rb.Refused == nil || rb.Refused.Body != "" ||
		rb.Refused.SHA256 != hexenc.EncodeToString(sum[:]) || len(got[1].Body) > n.maxBody {
		t.Fatalf("the big message's notice: %.300s", got[1].Body)
	}
}

// No notice names a path of the refusing host: not the Local detail a
// refusal keeps for its log (the trust file), nor any of its own paths a
// reason carries; for each kind of notice (a RECEIPT for a message, a
// SPAWN_RESULT, a TRACE_RESULT). The reason itself still goes.
func TestRefusalNoticesNameNoLocalPath(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	alice := envelope.Party{Gid: "h1.01a23400-3365-77d8-a646-15bd4b212402", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h2.01a23400-3142-7e07-b4e3-15b27a9f1b77", Name: "bob", Host: "h2"}
	const state = "/home/op/.local/state/fleet"
	fn := newFakeNotices(t, 1<<20)
	fn.local = localPaths(state, state+"/trust", "/run/user/1000/fleet/gw.sock", "/home/op/.config/fleet/fleet.conf")
	refusal := func() *broker.Refusal {
		// as admission words it, with one path slipped into the reason too
		return broker.Refuse(broker.ReasonUntrusted, "host %q is not in the receiver's trust file (see %s)", "h1", state+"/trust").
			Here("trust file %s", state+"/trust")
	}
	body, _ := json.Marshal(traceQuery{TraceID: envelope.NewID()})
	trace := envelope.New(envelope.Trace, alice, envelope.Party{Host: "h2", Group: "control"}, string(body))
	trace.TraceID, trace.Expires = trace.MsgID, fn.clock.Add(5*time.Second)
	spawn := envelope.New(envelope.Spawn, alice, envelope.Party{Host: "h2", Group: "control"}, "{}")
	spawn.Expires = fn.clock.Add(5 * time.Second)
	for _, m := range []struct {
		env   *envelope.Envelope
		queue string
	}{
		{sealedLike(envelope.New(envelope.Send, alice, envelope.Party{Gid: bob.Gid}, "hello")), broker.InboxQueue(bob.Gid)},
		{spawn, broker.ControlQueue("h2")},
		{trace, broker.ControlQueue("h2")},
	} {
		raw, _ := envelope.Encode(m.env)
		fn.refused(broker.RefusedMsg{Queue: m.queue, Refusal: refusal(), Env: m.env, Body: raw, Sig: ed25519.Sign(priv, raw), SignedBy: "h1"})
	}
	if len(fn.got) != 3 {
		t.Fatalf("%d notices, want 3", len(fn.got))
	}
	for _, env := range fn.got {
		if strings.Contains(env.Body, "/home/op") || strings.Contains(env.Body, "/run/user") || strings.Contains(env.Body, "trust file /") {
			t.Errorf("the %s names a local path: %s", env.Kind, env.Body)
		}
		if !strings.Contains(env.Body, "refused by h2") || !strings.Contains(env.Body, "receiver's trust file") || !strings.Contains(env.Body, "path on h2") {
			t.Errorf("the %s lost its reason: %s", env.Kind, env.Body)
		}
	}
}
