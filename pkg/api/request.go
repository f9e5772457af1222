package api

import (
	"encoding/json"
	"strconv"
)

// appendJSON appends r as encoding/json would marshal it, byte for byte
// (TestRequestJSONMatchesMarshal sets every field in turn and compares).
//
// Marshalling a struct by reflection first builds the encoders of all its
// fields, and for a one-shot command that is most of the cost of its first
// frame: in a fresh process, on the machine of the figures in scripts/BENCHMARKS.md, ~10
// page faults and about half a millisecond for Request's 36 fields.
// Each value here goes through encoding/json as a plain string, slice or
// number, which builds no struct encoder, so the escaping is the library's.
func (r *Request) appendJSON(b []byte) ([]byte, error) {
	w := reqWriter{b: append(b, '{')}
	w.int("proto", int64(r.Proto))
	w.str("op", r.Op, false)
	w.str("token", r.Token, true)
	w.str("name", r.Name, true)
	w.str("mode", r.Mode, true)
	w.str("tmux_target", r.TmuxTarget, true)
	w.str("exec", r.Exec, true)
	w.str("nudge", r.Nudge, true)
	w.strs("groups", r.Groups)
	w.str("program", r.Program, true)
	w.str("turns", r.Turns, true)
	w.str("paste", r.Paste, true)
	w.str("header", r.Header, true)
	w.int("idle_screen_ms", r.IdleScreenMS)
	w.str("to", r.To, true)
	w.str("body", r.Body, true)
	w.str("reply_to", r.ReplyTo, true)
	w.bool("wait", r.Wait)
	w.str("group", r.Group, true)
	w.str("turn_id", r.TurnID, true)
	w.str("answer_to", r.AnswerTo, true)
	w.bool("wait_for_host", r.WaitHost)
	w.str("host", r.Host, true)
	w.str("profile", r.Profile, true)
	w.strs("args", r.Args)
	w.str("request_id", r.RequestID, true)
	w.str("target", r.Target, true)
	w.strs("add", r.Add)
	w.strs("remove", r.Remove)
	w.str("status", r.Status, true)
	w.bool("pane", r.Pane)
	w.bool("hook", r.Hook)
	w.str("trace_id", r.TraceID, true)
	w.str("msg_id", r.MsgID, true)
	w.str("until", r.Until, true)
	w.int("timeout_ms", r.TimeoutMS)
	w.int("max", int64(r.Max))
	w.bool("follow", r.Follow)
	w.int("window", int64(r.Window))
	w.strs("acks", r.Acks)
	w.bool("known", r.Known)
	w.bytes("raw", r.Raw)
	w.bytes("sig", r.Sig)
	w.str("signed_by", r.SignedBy, true)
	w.strs("msg_ids", r.MsgIDs)
	if w.err != nil {
		return nil, w.err
	}
	return append(w.b, '}'), nil
}

// reqWriter appends the members of one JSON object; every method but str
// with omitEmpty false leaves out a zero value, as ",omitempty" does.
type reqWriter struct {
	b     []byte
	comma bool
	err   error
}

func (w *reqWriter) key(k string) {
	if w.comma {
		w.b = append(w.b, ',')
	}
	w.comma = true
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

// value appends v as encoding/json marshals it on its own (escaping
// included).
func (w *reqWriter) value(v any) {
	if w.err != nil {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		w.err = err
		return
	}
	w.b = append(w.b, data...)
}

func (w *reqWriter) str(k, v string, omitEmpty bool) {
	if v == "" && omitEmpty {
		return
	}
	w.key(k)
	w.value(v)
}

func (w *reqWriter) strs(k string, v []string) {
	if len(v) == 0 {
		return
	}
	w.key(k)
	w.value(v)
}

func (w *reqWriter) bytes(k string, v []byte) {
	if len(v) == 0 {
		return
	}
	w.key(k)
	w.value(v)
}

func (w *reqWriter) int(k string, v int64) {
	if v == 0 {
		return
	}
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *reqWriter) bool(k string, v bool) {
	if !v {
		return
	}
	w.key(k)
	w.b = append(w.b, "true"...)
}
