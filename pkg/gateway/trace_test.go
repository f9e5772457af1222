package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/audit"
	"github.com/fleetd/fleet/pkg/broker"
)

const (
	traceA = "0190f5a1-7b1c-7d2e-9f00-000000000001"
	gidH2  = "h2.0190f5a1-7b1c-7d2e-9f00-0000000000b0"
)

// An answer is taken only from a host that was asked, for the query's
// requester, once; after Close nobody waits.
func TestTraceAnswersOnlyFromHostsAsked(t *testing.T) {
	var w traceWaiters
	run := w.Open("q1", traceA, "gid-a", []string{"h2", "h3"})
	if _, _, err := w.Expect("q1", "gid-a", "h9"); !isRefusal(err, broker.ReasonWrongHost) {
		t.Fatalf("an answer from h9, not asked: %v", err)
	}
	if tr, ok, err := w.Expect("q1", "gid-a", "h2"); err != nil || !ok || tr != traceA {
		t.Fatalf("h2 was asked: %q %v %v", tr, ok, err)
	}
	if _, ok, _ := w.Expect("q1", "gid-b", "h2"); ok {
		t.Fatal("an answer addressed to another entity was expected")
	}
	ans := &traceAnswer{TraceID: traceA}
	if !w.Answer("q1", "gid-a", "h2", ans) || w.Answer("q1", "gid-a", "h2", ans) {
		t.Fatal("h2's answer not taken once")
	}
	if _, ok, _ := w.Expect("q1", "gid-a", "h2"); ok {
		t.Fatal("h2 answered already, and is still expected")
	}
	if r := <-run.ch; r.host != "h2" || r.ans != ans {
		t.Fatalf("handed %+v", r)
	}
	w.Close("q1")
	if _, ok, err := w.Expect("q1", "gid-a", "h3"); ok || err != nil {
		t.Fatalf("after Close: %v %v", ok, err)
	}
	if w.Answer("q1", "gid-a", "h3", ans) {
		t.Fatal("an answer taken after Close")
	}
}

func isRefusal(err error, reason string) bool {
	var r *broker.Refusal
	return errors.As(err, &r) && r.Reason == reason
}

// Every byte of an answer is another host's word: a hop of another host,
// a trace other than the one asked, a field out of grammar, a time from
// the future or too many hops refuse the whole answer; a good one passes
// with its reasons made one printable line.
func TestTraceAnswerFromAnotherHostIsChecked(t *testing.T) {
	now := time.Now()
	good := func() *traceAnswer {
		return &traceAnswer{TraceID: traceA, Hops: []api.Hop{{
			Time: now.Add(-time.Minute), Host: "h2", Entity: "bob", Kind: "SEND", MsgID: traceA,
			Event: "taken", Sender: gidH2, Recipient: gidH2, Reason: "line\none\x1b[2J",
		}}}
	}
	a := good()
	if err := checkTraceAnswer(a, traceA, "h2", now); err != nil {
		t.Fatalf("a good answer refused: %v", err)
	}
	if r := a.Hops[0].Reason; strings.ContainsAny(r, "\n\x1b") {
		t.Errorf("reason not made inert: %q", r)
	}
	for name, c := range map[string]struct {
		edit   func(*traceAnswer)
		reason string
	}{
		"a hop of another host":    {func(a *traceAnswer) { a.Hops[0].Host = "h3" }, broker.ReasonWrongHost},
		"another trace":            {func(a *traceAnswer) { a.TraceID = "other" }, broker.ReasonMalformed},
		"a time from the future":   {func(a *traceAnswer) { a.Hops[0].Time = now.Add(time.Hour) }, broker.ReasonMalformed},
		"no time":                  {func(a *traceAnswer) { a.Hops[0].Time = time.Time{} }, broker.ReasonMalformed},
		"an event out of grammar":  {func(a *traceAnswer) { a.Hops[0].Event = "\x1b]0;pwned\x07" }, broker.ReasonMalformed},
		"an entity out of grammar": {func(a *traceAnswer) { a.Hops[0].Entity = "../../etc" }, broker.ReasonMalformed},
		"an unknown kind":          {func(a *traceAnswer) { a.Hops[0].Kind = "SHOUT" }, broker.ReasonMalformed},
		"a msg id out of grammar":  {func(a *traceAnswer) { a.Hops[0].MsgID = "a b" }, broker.ReasonMalformed},
		"a sender that is no gid":  {func(a *traceAnswer) { a.Hops[0].Sender = "bob" }, broker.ReasonMalformed},
		"a negative size":          {func(a *traceAnswer) { a.Hops[0].Size = -1 }, broker.ReasonMalformed},
		"too many hops": {func(a *traceAnswer) {
			for len(a.Hops) <= traceLines {
				a.Hops = append(a.Hops, a.Hops[0])
			}
		}, broker.ReasonMalformed},
	} {
		a := good()
		c.edit(a)
		if err := checkTraceAnswer(a, traceA, "h2", now); !isRefusal(err, c.reason) {
			t.Errorf("%s: %v, want a %s refusal", name, err, c.reason)
		}
	}
}

// An answer too big for its bound leaves out its last hops, and says so.
func TestTraceAnswerFitsItsBound(t *testing.T) {
	ans := &traceAnswer{TraceID: traceA}
	for range traceLines {
		ans.Hops = append(ans.Hops, api.Hop{Time: time.Now(), Host: "h2", Event: "taken", Reason: strings.Repeat("r", 500)})
	}
	body := fitAnswer(ans)
	if len(body) > traceAnswerBytes {
		t.Fatalf("%d bytes, over %d", len(body), traceAnswerBytes)
	}
	var got traceAnswer
	if err := json.Unmarshal(body, &got); err != nil || !got.Truncated || len(got.Hops) == 0 || len(got.Hops) >= traceLines {
		t.Fatalf("truncated %v, %d hops, %v", got.Truncated, len(got.Hops), err)
	}
	small := &traceAnswer{TraceID: traceA, Hops: ans.Hops[:3]}
	got = traceAnswer{}
	if json.Unmarshal(fitAnswer(small), &got); got.Truncated || len(got.Hops) != 3 {
		t.Fatalf("a small answer was cut: %v, %d hops", got.Truncated, len(got.Hops))
	}
}

// Hops are in time order; at one instant, in the order a flow goes.
func TestTraceHopsInFlowOrder(t *testing.T) {
	t0 := time.Now()
	hops := []api.Hop{
		{Time: t0.Add(time.Millisecond), Host: "h2", Event: "drained"},
		{Time: t0, Host: "h1", Event: "confirmed"},
		{Time: t0, Host: "h2", Event: "taken"},
		{Time: t0, Host: "h1", Event: "published"},
		{Time: t0, Host: "h1", Event: "someday_new"},
	}
	sortHops(hops)
	var got []string
	for _, h := range hops {
		got = append(got, h.Event)
	}
	if s := strings.Join(got, ","); s != "published,confirmed,taken,someday_new,drained" {
		t.Fatalf("order %s", s)
	}
}

// A line of this host's log becomes a hop with only what fits the
// grammar (an older build's line may not): nothing out of grammar leaves
// the host.
func TestOwnLinesKeepTheGrammar(t *testing.T) {
	h := hopOf(audit.Line{Time: time.Now(), Event: "Weird Event", Entity: "not a name!", Kind: "SHOUT",
		MsgID: "has space", Sender: "plain", Recipient: gidH2, Attempt: -3, Reason: "a\nb"}, "h2")
	if h.Event != "other" || h.Entity != "" || h.Kind != "" || h.MsgID != "" || h.Sender != "" ||
		h.Recipient != gidH2 || h.Attempt != 0 || h.Reason != "a b" || h.Host != "h2" {
		t.Fatalf("hop %+v", h)
	}
	ans := &traceAnswer{TraceID: traceA, Hops: []api.Hop{h}}
	if err := checkTraceAnswer(ans, traceA, "h2", time.Now()); err != nil {
		t.Fatalf("this host's own hop would be refused by another: %v", err)
	}
}
