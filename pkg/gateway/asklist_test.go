package gateway

import (
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/envelope"
)

// Open lists an ask asked here once (while its asker waits), one from
// another host until it is answered or expires, and text only of the
// asks put to own.
func TestAsksOpen(t *testing.T) {
	a := newAsks()
	now := time.Now()
	mk := func(from, to envelope.Party, body string, ttl time.Duration) *envelope.Envelope {
		e := envelope.New(envelope.Ask, from, to, body)
		e.Expires = now.Add(ttl)
		return e
	}
	alice := envelope.Party{Gid: "h1.a", Name: "alice", Host: "h1"}
	bob := envelope.Party{Gid: "h1.b", Name: "bob", Host: "h1"}
	carol := envelope.Party{Gid: "h2.c", Name: "carol", Host: "h2"}

	local := mk(alice, bob, "local question", time.Minute)
	a.Wait(local.MsgID, &askWaiter{gid: alice.Gid, to: bob.Gid, env: local})
	a.See(local)
	remote := mk(carol, bob, "remote question", time.Minute)
	a.See(remote)
	gone := mk(carol, alice, "expired", -time.Second)
	a.See(gone)

	open := a.Open("h1", now, "")
	if len(open) != 2 {
		t.Fatalf("open asks: %+v, want the local and the remote one", open)
	}
	for _, o := range open {
		if o.Body != "" {
			t.Fatalf("text without own: %+v", o)
		}
		if o.Kind != "ASK" || o.Size == 0 || o.Deadline.IsZero() || o.Opened.IsZero() {
			t.Fatalf("an ask listed without its kind, size or times: %+v", o)
		}
	}
	withText := a.Open("h1", now, bob.Gid)
	for _, o := range withText {
		if o.TargetGid == bob.Gid && o.Body == "" {
			t.Fatalf("the text of an ask put to own is missing: %+v", o)
		}
	}
	if o := a.Open("h1", now, alice.Gid); o[0].Body != "" || o[1].Body != "" {
		t.Fatalf("the text of asks put to another entity shown: %+v", o)
	}

	a.Done(local.MsgID) // the asker stopped waiting
	a.Close(remote.MsgID)
	if open := a.Open("h1", now, ""); len(open) != 0 {
		t.Fatalf("asks still open after the wait ended and the answer: %+v", open)
	}
}
