package gateway

import (
	"errors"

	"github.com/fleetd/fleet/pkg/broker"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
)

// takeBrokerBatch is the broker's batch handler for a local inbox: what
// its consumer had waiting, in order. Messages for the entity's inbox
// (SEND, REPLY, BROADCAST copies) that come one after another are stored
// in one store operation — one log record and one flush for the run,
// instead of one each — and every other kind goes through takeBroker
// alone, in its place. So the order of an inbox's intake is kept: a run
// is stored before what follows it is handled, and at the first message
// not taken in (not a refusal) nothing after it is tried
// (broker.ErrNotTried): the broker carries on from there one at a time.
func (g *Gateway) takeBrokerBatch(envs []*envelope.Envelope) []error {
	errs := make([]error, len(envs))
	var run []int // indexes of mail waiting for one store operation
	// flush stores the run; false: it could not be (nothing of it was)
	flush := func() bool {
		if len(run) == 0 {
			return true
		}
		batch := make([]*envelope.Envelope, len(run))
		for k, i := range run {
			batch[k] = envs[i]
		}
		recs, dups, err := g.acceptAll(batch)
		if err != nil {
			errs[run[0]] = holdFull(err)
			for _, i := range run[1:] {
				errs[i] = broker.ErrNotTried
			}
			run = nil
			return false
		}
		// the newest first: past the cap, what came last is refused
		for k := len(batch) - 1; k >= 0; k-- {
			g.expireTaken(batch[k], recs[k], dups[k])
		}
		run = run[:0]
		return true
	}
	stopAt := func(i int, err error) []error {
		errs[i] = err
		for k := i + 1; k < len(envs); k++ {
			errs[k] = broker.ErrNotTried
		}
		return errs
	}
	for i, env := range envs {
		switch env.Kind {
		case envelope.Send, envelope.Reply, envelope.Broadcast:
			b, err := g.intakeBox(env)
			var r *broker.Refusal
			switch {
			case errors.As(err, &r):
				errs[i] = err // refused: nothing of it is kept, the order of the rest is unchanged
				continue
			case err != nil:
				if !flush() {
					return stopAt(i, broker.ErrNotTried)
				}
				return stopAt(i, err)
			}
			if !g.ownCopy(env, b) {
				run = append(run, i)
			}
			continue
		}
		if !flush() {
			return stopAt(i, broker.ErrNotTried)
		}
		err := g.takeBroker(env)
		var r *broker.Refusal
		if err != nil && !errors.As(err, &r) {
			return stopAt(i, err)
		}
		errs[i] = err
	}
	flush()
	return errs
}

// holdFull is takeBroker's mapping of a store that cannot take anything
// now (a full disk): the broker holds the inbox's intake, in order, until
// it can.
func holdFull(err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) && fe.Kind == fault.KindStateDir {
		return broker.Hold(err)
	}
	return err
}
