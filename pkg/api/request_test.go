package api

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// legacyRequest is api.Request as it was until the request types of each
// op (2026-12-02): the one struct every command of earlier builds sends.
// Copied word for word; it must never change.
type legacyRequest struct {
	Proto int    `json:"proto,omitempty"` // hello only
	Op    string `json:"op"`
	Token string `json:"token,omitempty"` // the caller's credential

	// join / leave / dead
	Name       string   `json:"name,omitempty"`
	Mode       string   `json:"mode,omitempty"`
	TmuxTarget string   `json:"tmux_target,omitempty"`
	Exec       string   `json:"exec,omitempty"`
	Nudge      string   `json:"nudge,omitempty"`
	Groups     []string `json:"groups,omitempty"`
	Accept     []string `json:"accept,omitempty"` // join: the entity's own inbound policy
	// join, tmux: the agent in the pane (store.Entity's fields of the same names)
	Program      string `json:"program,omitempty"`
	Turns        string `json:"turns,omitempty"`
	Paste        string `json:"paste,omitempty"`
	Header       string `json:"header,omitempty"`
	IdleScreenMS int64  `json:"idle_screen_ms,omitempty"`

	// send
	To      string `json:"to,omitempty"`
	Body    string `json:"body,omitempty"`
	ReplyTo string `json:"reply_to,omitempty"`
	Wait    bool   `json:"wait,omitempty"`  // hold the send open for the reply
	Group   string `json:"group,omitempty"` // bcast: "" or "all", or a group

	// ask / answer
	TurnID   string `json:"turn_id,omitempty"`
	AnswerTo string `json:"answer_to,omitempty"`     // send: answer the ask with this msg id
	WaitHost bool   `json:"wait_for_host,omitempty"` // ask: wait even if the askee's host reads stale or gone

	// spawn (with Name, Groups, TimeoutMS) / stop (with TimeoutMS)
	Host      string   `json:"host,omitempty"`       // spawn: the target host ("" = this one)
	Profile   string   `json:"profile,omitempty"`    // spawn: the target's launcher profile
	Args      []string `json:"args,omitempty"`       // spawn: arguments of the profile's command
	RequestID string   `json:"request_id,omitempty"` // spawn: carried out once per id ("" = a fresh one)
	Target    string   `json:"target,omitempty"`     // stop: NAME, NAME@HOST or GID

	// groups
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`

	// watch
	Text bool `json:"text,omitempty"`

	// accept (with Name)
	Action   string   `json:"action,omitempty"`
	Patterns []string `json:"patterns,omitempty"`

	// status; Pane: the caller is the agent of the tmux pane it runs in,
	// proven by its process's ancestry (no credential)
	Status string `json:"status,omitempty"`
	Pane   bool   `json:"pane,omitempty"`

	// recv: Hook, an agent CLI's hook takes the mail (fleet-recv --hook),
	// which only a hook entity's inbox gives it
	Hook bool `json:"hook,omitempty"`

	// trace (with TimeoutMS)
	TraceID string `json:"trace_id,omitempty"`

	// lookup / wait
	MsgID     string `json:"msg_id,omitempty"`
	Until     string `json:"until,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`

	// recv / ack
	Max    int      `json:"max,omitempty"`
	Follow bool     `json:"follow,omitempty"`
	Window int      `json:"window,omitempty"`
	Acks   []string `json:"acks,omitempty"`

	// replay (with MsgID) / purge_dead
	Known    bool     `json:"known,omitempty"`     // replay: only what MsgID was replayed as (Sent, Again); nothing is sent
	Raw      []byte   `json:"raw,omitempty"`       // a dead letter's body from bridge.dlq
	Sig      []byte   `json:"sig,omitempty"`       // its fleet-sig header
	SignedBy string   `json:"signed_by,omitempty"` // its fleet-host header
	MsgIDs   []string `json:"msg_ids,omitempty"`
}

// allOps is every op of the protocol.
var allOps = []string{OpHello, OpJoin, OpLeave, OpRoster, OpStatus, OpSend, OpLookup, OpRecv, OpAck, OpDead, OpOpenDead,
	OpWhoami, OpWait, OpBcast, OpAsk, OpGroups, OpSpawn, OpStop, OpWaitReply, OpGatewayStatus, OpReplay,
	OpPurgeDead, OpTrace, OpWatch, OpAccept}

// TestLegacyRequestsDecode: what the commands of earlier builds sent, for
// every op (every field its handler reads set), decodes into that op's
// type with every field kept.
func TestLegacyRequestsDecode(t *testing.T) {
	tok := "gid.secret"
	for _, tc := range []struct {
		old  legacyRequest
		want Request
	}{
		{legacyRequest{Op: OpHello, Proto: Proto}, &HelloRequest{Head: Head{Op: OpHello}, Proto: Proto}},
		{legacyRequest{Op: OpJoin, Name: "w1", Mode: "inject", TmuxTarget: "%3", Exec: "cat", Nudge: "x", Groups: []string{"a", "b"},
			Program: "claude", Turns: "hooks", Paste: "bracketed", Header: "on", IdleScreenMS: 1500},
			&JoinRequest{Head: Head{Op: OpJoin}, Name: "w1", Mode: "inject", TmuxTarget: "%3", Exec: "cat", Nudge: "x", Groups: []string{"a", "b"},
				Program: "claude", Turns: "hooks", Paste: "bracketed", Header: "on", IdleScreenMS: 1500}},
		{legacyRequest{Op: OpLeave, Name: "w1"}, &LeaveRequest{Head: Head{Op: OpLeave}, Name: "w1"}},
		{legacyRequest{Op: OpRoster}, &RosterRequest{Head: Head{Op: OpRoster}}},
		{legacyRequest{Op: OpStatus, Token: tok, Status: "busy", Pane: true},
			&StatusRequest{Head: Head{Op: OpStatus, Token: tok}, Status: "busy", Pane: true}},
		{legacyRequest{Op: OpSend, Token: tok, To: "bob@h2", Body: "hi \u00e9\n", ReplyTo: "r1", AnswerTo: "a1", Wait: true, TimeoutMS: 5000, MsgID: "m1"},
			&SendRequest{Head: Head{Op: OpSend, Token: tok}, To: "bob@h2", Body: "hi \u00e9\n", ReplyTo: "r1", AnswerTo: "a1", Wait: true, TimeoutMS: 5000, MsgID: "m1"}},
		{legacyRequest{Op: OpLookup, Token: tok, MsgID: "m1"}, &LookupRequest{Head: Head{Op: OpLookup, Token: tok}, MsgID: "m1"}},
		{legacyRequest{Op: OpRecv, Token: tok, Max: 3, Follow: true, Window: 2, Hook: true},
			&RecvRequest{Head: Head{Op: OpRecv, Token: tok}, Max: 3, Follow: true, Window: 2, Hook: true}},
		{legacyRequest{Op: OpAck, Acks: []string{"m1", "m2"}}, &AckRequest{Head: Head{Op: OpAck}, Acks: []string{"m1", "m2"}}},
		{legacyRequest{Op: OpDead, Name: "w1"}, &DeadRequest{Head: Head{Op: OpDead}, Name: "w1"}},
		{legacyRequest{Op: OpWhoami, Token: tok}, &WhoamiRequest{Head: Head{Op: OpWhoami, Token: tok}}},
		{legacyRequest{Op: OpWait, Token: tok, MsgID: "m1", Until: "delivered", TimeoutMS: 30000},
			&WaitRequest{Head: Head{Op: OpWait, Token: tok}, MsgID: "m1", Until: "delivered", TimeoutMS: 30000}},
		{legacyRequest{Op: OpBcast, Token: tok, Group: "reviewers", Body: "all hands"},
			&BcastRequest{Head: Head{Op: OpBcast, Token: tok}, Group: "reviewers", Body: "all hands"}},
		{legacyRequest{Op: OpAsk, Token: tok, To: "bob", Body: "?", TurnID: "t1", TimeoutMS: 60000, ReplyTo: "m0", WaitHost: true},
			&AskRequest{Head: Head{Op: OpAsk, Token: tok}, To: "bob", Body: "?", TurnID: "t1", TimeoutMS: 60000, ReplyTo: "m0", WaitHost: true}},
		{legacyRequest{Op: OpGroups, Name: "w1", Add: []string{"a"}, Remove: []string{"b"}},
			&GroupsRequest{Head: Head{Op: OpGroups}, Name: "w1", Add: []string{"a"}, Remove: []string{"b"}}},
		{legacyRequest{Op: OpSpawn, Token: tok, Name: "w2", Host: "h2", Profile: "claude", Groups: []string{"g"}, Args: []string{"--x", "y"},
			RequestID: "once", TimeoutMS: 20000},
			&SpawnRequest{Head: Head{Op: OpSpawn, Token: tok}, Name: "w2", Host: "h2", Profile: "claude", Groups: []string{"g"}, Args: []string{"--x", "y"},
				RequestID: "once", TimeoutMS: 20000}},
		{legacyRequest{Op: OpStop, Token: tok, Target: "w2@h2", TimeoutMS: 20000},
			&StopRequest{Head: Head{Op: OpStop, Token: tok}, Target: "w2@h2", TimeoutMS: 20000}},
		{legacyRequest{Op: OpWaitReply, Token: tok, MsgID: "m1", TimeoutMS: 1000},
			&WaitReplyRequest{Head: Head{Op: OpWaitReply, Token: tok}, MsgID: "m1", TimeoutMS: 1000}},
		{legacyRequest{Op: OpGatewayStatus}, &GatewayStatusRequest{Head: Head{Op: OpGatewayStatus}}},
		{legacyRequest{Op: OpReplay, Token: tok, MsgID: "m1", Known: true}, &ReplayRequest{Head: Head{Op: OpReplay, Token: tok}, MsgID: "m1", Known: true}},
		{legacyRequest{Op: OpReplay, Raw: []byte("{\"v\":1}\x00\xff"), Sig: []byte{1, 2, 3}, SignedBy: "h2"},
			&ReplayRequest{Head: Head{Op: OpReplay}, Raw: []byte("{\"v\":1}\x00\xff"), Sig: []byte{1, 2, 3}, SignedBy: "h2"}},
		{legacyRequest{Op: OpPurgeDead, MsgIDs: []string{"m1", "m2"}}, &PurgeDeadRequest{Head: Head{Op: OpPurgeDead}, MsgIDs: []string{"m1", "m2"}}},
		{legacyRequest{Op: OpTrace, Token: tok, TraceID: "t1", TimeoutMS: 3000}, &TraceRequest{Head: Head{Op: OpTrace, Token: tok}, TraceID: "t1", TimeoutMS: 3000}},
		// a newer command's op: kept as it is, for the gateway to refuse
		{legacyRequest{Op: "frobnicate", Token: tok, Name: "x"}, &UnknownRequest{Head: Head{Op: "frobnicate", Token: tok}}},
	} {
		t.Run(tc.old.Op, func(t *testing.T) {
			data, err := json.Marshal(&tc.old)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeRequest(data)
			if err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("%s\ndecoded %#v\nwant    %#v", data, got, tc.want)
			}
		})
	}
}

// fill sets every field of the struct v points to, Head's too, to a value
// of its own (the field's index in it), so that a field lost on the way
// shows.
func fill(v reflect.Value, seed string) {
	for i := range v.NumField() {
		f, name := v.Field(i), seed+v.Type().Field(i).Name
		switch f.Kind() {
		case reflect.Struct:
			fill(f, name+".")
		case reflect.String:
			f.SetString("v-" + name + " \u00e9\"\n")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(1000 + len(name)*7 + i))
		case reflect.Slice:
			switch f.Type().Elem().Kind() {
			case reflect.Uint8:
				f.SetBytes([]byte("b-" + name + "\x00\xff"))
			case reflect.String:
				f.Set(reflect.ValueOf([]string{"s1-" + name, "s2-" + name}))
			default:
				panic("no filler for " + f.Type().String())
			}
		default:
			panic("no filler for " + f.Type().String())
		}
	}
}

// TestRequestsReadByLegacy: every field of every op's type goes out under
// a name the gateways of earlier builds read (the legacy struct decodes
// the frame with nothing lost: it encodes to the same JSON object), and
// such a frame, written again by the legacy struct, decodes back to the
// same request.
func TestRequestsReadByLegacy(t *testing.T) {
	seen := map[reflect.Type]bool{}
	for _, op := range allOps {
		t.Run(op, func(t *testing.T) {
			r := newRequest(op)
			if _, unknown := r.(*UnknownRequest); unknown {
				t.Fatalf("op %s has no type", op)
			}
			if seen[reflect.TypeOf(r)] {
				t.Fatalf("op %s shares the type %T with another op", op, r)
			}
			seen[reflect.TypeOf(r)] = true
			fill(reflect.ValueOf(r).Elem(), "")
			r.head().Op = r.op()
			if OpOf(r) != op {
				t.Fatalf("%T says op %q, want %q", r, OpOf(r), op)
			}
			data, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			var old legacyRequest
			if err := json.Unmarshal(data, &old); err != nil {
				t.Fatal(err)
			}
			again, err := json.Marshal(&old)
			if err != nil {
				t.Fatal(err)
			}
			var a, b map[string]any
			json.Unmarshal(data, &a)
			json.Unmarshal(again, &b)
			for k := range a {
				if f, ok := sinceLegacy[k]; ok && b[k] == nil {
					if !slices.Contains(Features, f) {
						t.Fatalf("%s is read under feature %q, which the gateway does not announce", k, f)
					}
					delete(a, k) // the command asks for the feature first
					clearField(reflect.ValueOf(r).Elem(), k)
				}
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("the legacy struct does not read %T whole:\nsent  %s\nread  %s", r, data, again)
			}
			back, err := DecodeRequest(again)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, r) {
				t.Fatalf("round trip through the legacy struct:\nsent %#v\ngot  %#v", r, back)
			}
		})
	}
}

// sinceLegacy are the request fields added since the legacy struct, each
// with the feature a gateway announces in its hello when it reads it: a
// command that sets one checks the feature first (cli.session.needs), as
// a gateway of an earlier build would drop the field silently.
var sinceLegacy = map[string]string{
	"wait_for_broker_ms": FeatureWaitForBroker,
	"cause":              FeatureCause,
	"urgent":             FeatureUrgent,
}

// clearField zeroes the field of v (a struct) whose JSON name is name.
func clearField(v reflect.Value, name string) {
	for i := 0; i < v.NumField(); i++ {
		if strings.Split(v.Type().Field(i).Tag.Get("json"), ",")[0] == name {
			v.Field(i).SetZero()
		}
	}
}

// TestDecodeRequestRefuses: what is not a request is a bad frame, as
// before; an op given twice is one.
func TestDecodeRequestRefuses(t *testing.T) {
	for _, tc := range []struct{ frame, says string }{
		{``, "malformed request"},
		{`[]`, "malformed request"},
		{`"send"`, "malformed request"},
		{`{}`, "no op"},
		{`{"to":"bob","body":"hi"}`, "no op"},
		{`{"op":""}`, "no op"},
		{`{"op":"send","body":1}`, "malformed request"},
		{`{"op":"send","body":"x"`, "malformed request"},
		{`{"op":"send","op":"recv"}`, "op \"send\", then \"recv\""},
		{`{"op":"send"} {}`, "malformed request"},
	} {
		_, err := DecodeRequest([]byte(tc.frame))
		if err == nil {
			t.Errorf("%s: decoded, want %q", tc.frame, tc.says)
			continue
		}
		wantBadFrame(t, err, tc.says)
	}
	// members before the op are skipped, whatever they hold; case as
	// json.Unmarshal matches it; members of other ops, or of a newer
	// build, are ignored
	for _, frame := range []string{
		`{"op":"send","token":"t","groups":["a"],"hook":true,"acks":["m"],"future":{"op":"recv","n":[1,2]}}`,
		`{"token":"t","body":"{\"op\":\"recv\"}","extra":["x",{"op":"recv"}],"op":"send"}`,
		`{"Op":"send","token":"t"}`,
	} {
		r, err := DecodeRequest([]byte(frame))
		if _, ok := r.(*SendRequest); err != nil || !ok {
			t.Errorf("%s: %#v, %v; want a send", frame, r, err)
		}
	}
}

// TestAllOpsListed: every op constant of proto.go is in allOps (so a
// new op gets a type, a newRequest case and a row in the tests above).
func TestAllOpsListed(t *testing.T) {
	src, err := os.ReadFile("proto.go")
	if err != nil {
		t.Fatal(err)
	}
	consts := regexp.MustCompile(`(?m)^\s*Op\w+\s*=\s*"([a-z_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(consts) < 20 {
		t.Fatalf("found %d op constants in proto.go: the pattern no longer matches", len(consts))
	}
	for _, m := range consts {
		if !slices.Contains(allOps, m[1]) {
			t.Errorf("op %q is not in allOps", m[1])
		}
	}
	if len(consts) != len(allOps) {
		t.Errorf("%d op constants, %d in allOps", len(consts), len(allOps))
	}
}

// BenchmarkDecodeRequest: the gateway's decoding of a send of 512 bytes,
// the op read first and then the frame into SendRequest, beside a plain
// json.Unmarshal into the one struct of earlier builds (legacy); and the
// client's encoding of the same send, either way.
func BenchmarkDecodeRequest(b *testing.B) {
	req := &SendRequest{Head: Head{Op: OpSend, Token: "h1.0196a0c1-2b3c-7d4e-8f90-a1b2c3d4e5f6.c2VjcmV0c2VjcmV0c2VjcmV0"},
		To: "bob", Body: strings.Repeat("a longer body é\n", 32), MsgID: "0196a0c1-2b3c-7d4e-8f90-a1b2c3d4e5f7"}
	data, _ := json.Marshal(req)
	b.Run("decode/types", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeRequest(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/legacy", func(b *testing.B) {
		for b.Loop() {
			var r legacyRequest
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/types", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(req)
		}
	})
	old := &legacyRequest{Op: OpSend, Token: req.Token, To: req.To, Body: req.Body, MsgID: req.MsgID}
	b.Run("encode/legacy", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(old)
		}
	})
}
