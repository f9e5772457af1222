package dlqapp

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	ucli "github.com/urfave/cli/v2"
)

// Replayed is one replay as fleet-dlq prints it.
type Replayed struct {
	ReplayOf  string   `json:"replay_of"`
	MsgID     string   `json:"msg_id"`
	State     string   `json:"state"`
	Recipient string   `json:"recipient"`
	Where     string   `json:"where"`             // the first source of the dead letter
	Sources   []string `json:"sources,omitempty"` // every place it was removed from
	Again     bool     `json:"again,omitempty"`   // replayed before: sent once more, dropped by the recipient if it has it
	// a MSG_ID replayed before and no dead letter any more: nothing was
	// sent; MsgID and State are the replay made then
	AlreadyReplayed bool `json:"already_replayed,omitempty"`
}

// replayable says whether a dead letter of kind k is ever delivered again
// (the gateway's rule, gateway/dlq.go replayEnv).
func replayable(k string) bool {
	switch envelope.Kind(k) {
	case envelope.Send, envelope.Reply, envelope.Broadcast:
		return true
	}
	return false
}

func runReplay(c *ucli.Context) error {
	f, err := readFilter(c, true)
	if err != nil {
		return err
	}
	if f.empty() {
		return fleetcli.Usage("name the dead letters to replay: MSG_ID... or a filter")
	}
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.close()
	if s.client == nil {
		return fault.New(fault.Unavailable, fault.KindNoGateway, "a replay needs this host's gateway: it delivers and signs").
			WithHint("start it with: fleet-gw run")
	}
	list, err := s.letters(f)
	if err != nil {
		return err
	}
	var first error
	fail := func(e *Entry, err error) {
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s (%s): %s\n", inert(e.MsgID), inert(e.Where), inert(err.Error()))
		if first == nil {
			first = err
		}
	}
	say := func(r Replayed) {
		if jsonOut(c) {
			_ = fleetcli.PrintJSON(c.App.Writer, r)
			return
		}
		switch {
		case r.AlreadyReplayed:
			fmt.Fprintf(c.App.Writer, "%s was replayed already as %s to %s (%s): nothing sent\n", inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		case r.Again:
			fmt.Fprintf(c.App.Writer, "%s replayed as %s to %s: %s (replayed before: the same message sent again, a copy the recipient has is dropped)\n",
				inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		default:
			fmt.Fprintf(c.App.Writer, "%s replayed as %s to %s: %s\n", inert(r.ReplayOf), inert(r.MsgID), inert(r.Recipient), inert(r.State))
		}
	}
	done := map[string]bool{} // named ids that are a letter
	skipped := map[string]int{}
	n := 0
	for _, l := range list {
		e := l.row(false)
		named := len(f.ids) > 0 && l.named(f.ids)
		for _, cp := range l.copies {
			done[cp.MsgID] = true
			if cp.Envelope != nil {
				done[cp.Envelope.MsgID] = true
			}
		}
		known := l.first().Envelope != nil || l.stored() != nil // its kind is not just a header
		if known && !replayable(e.Kind) && !named {
			skipped[e.Kind]++ // a filter takes only what can be delivered again
			continue
		}
		n++
		resp, err := s.replay(l)
		if err != nil {
			fail(e, err)
			continue
		}
		say(Replayed{ReplayOf: e.MsgID, MsgID: resp.Sent.MsgID, State: resp.Sent.State, Recipient: resp.Sent.Recipient,
			Where: e.Where, Sources: e.Sources, Again: resp.Sent.Again})
	}
	// a MSG_ID that is no dead letter (any more): what it was replayed as,
	// if this host replayed it; nothing is sent
	for id := range f.ids {
		if done[id] {
			continue
		}
		n++
		resp, err := s.client.Call(&api.ReplayRequest{MsgID: id, Known: true})
		if err == nil && s.as != nil && !ownReplay(resp.Sent, s.as) {
			err = fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter %s of %s", id, s.as.Name)
		}
		if err != nil {
			fail(&Entry{MsgID: id, Where: whereStore}, err)
			continue
		}
		say(Replayed{ReplayOf: id, MsgID: resp.Sent.MsgID, State: resp.Sent.State, Recipient: resp.Sent.Recipient,
			Where: whereStore, AlreadyReplayed: true})
	}
	if len(skipped) > 0 {
		var kinds []string
		total := 0
		for k, m := range skipped {
			kinds = append(kinds, fmt.Sprintf("%s %d", inert(k), m))
			total += m
		}
		slices.Sort(kinds)
		fmt.Fprintf(c.App.ErrWriter, "fleet-dlq: %s never delivered again, skipped (%s); remove them with: fleet-dlq purge --kind KIND\n",
			plural(total), strings.Join(kinds, ", "))
	}
	if n == 0 {
		hint := "list them with: fleet-dlq list"
		if len(skipped) > 0 {
			hint = "only kinds that are never delivered again match: remove them with fleet-dlq purge --kind KIND"
		}
		return fault.New(fault.NoRecipient, fault.KindUnknownMessage, "no dead letter to replay matches").WithHint("%s", hint)
	}
	return inertError(first)
}

// ownReplay says whether a replay is of a message ent sent or was sent
// (a replay keeps both).
func ownReplay(sent *api.Sent, ent *api.EntityRow) bool {
	return sent.Gid == ent.Gid || sent.SenderGid == ent.Gid
}

// replay delivers letter l again through the gateway — this host's copy
// if it has one, else a copy from bridge.dlq its signature proves — and
// once delivered removes every copy of it from bridge.dlq (the gateway
// removes its own).
func (s *sources) replay(l *letter) (*api.Response, error) {
	var resp *api.Response
	var err error
	if e := l.stored(); e != nil {
		resp, err = s.client.Call(&api.ReplayRequest{MsgID: e.MsgID})
	} else {
		err = fault.New(fault.Data, fault.KindNotReplayable, "not an envelope: nothing to deliver again").
			WithHint("purge it: fleet-dlq purge %s", l.first().MsgID)
		for _, e := range l.copies {
			if e.Envelope == nil {
				continue
			}
			if !replayable(e.Kind) {
				err = fault.New(fault.Usage, fault.KindNotReplayable, "a %s is never delivered again", e.Kind).
					WithHint("purge it: fleet-dlq purge %s", e.MsgID)
				break
			}
			resp, err = s.client.Call(&api.ReplayRequest{Raw: e.body, Sig: e.sig, SignedBy: e.signedBy})
			if err == nil {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	for _, e := range l.copies {
		if e.Where == whereDLQ {
			if rerr := s.read.Remove(e.index); rerr != nil {
				return resp, rerr
			}
		}
	}
	return resp, nil
}

// inertError is err with its text made inert, its exit code and kind kept:
// a refusal may quote what a dead letter holds.
func inertError(err error) error {
	if err == nil {
		return nil
	}
	out := &fault.Error{Code: fault.CodeOf(err), Kind: fault.KindInternal, Msg: inert(err.Error()), Hint: inert(fault.HintOf(err))}
	var fe *fault.Error
	if errors.As(err, &fe) {
		out.Kind = fe.Kind
	}
	return out
}
