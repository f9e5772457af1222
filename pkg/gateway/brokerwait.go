package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/backoff"
	"github.com/fleetd/fleet/pkg/fault"
)

// brokerState is what a send waiting for the broker needs to know of it:
// whether it is connected now (broker.Broker).
type brokerState interface{ Connected() bool }

// brokerWait holds one send whose broker is down (fleet-send
// --wait-for-broker) and tries it again, under the same msg id, once the
// broker is back or a step has passed, until the caller's bound runs out.
// Nothing is kept but the call itself: a gateway that stops ends the wait
// with the last error, and the caller's connection goes with it.
type brokerWait struct {
	broker brokerState
	ctx    context.Context // the work in flight's: done past the drain bound
	stop   <-chan struct{} // closed when shutdown starts
	poll   time.Duration   // how often the broker's state is read while down
}

// waitsForBroker is whether err is one a broker coming back can mend: not
// sent because it is down or blocks publishers, or sent with its outcome
// unknown (a retry under the same msg id is kept once by the receiver).
func waitsForBroker(err error) bool {
	switch fault.KindOf(err) {
	case fault.KindBrokerDown, fault.KindBrokerBlocked, fault.KindOutcomeUnknown, fault.KindBrokerTimeout:
		return true
	}
	return false
}

// Do runs attempt, and again while its error is one the broker's return
// can mend and bound has not run out. The first attempt gets again=false,
// the later ones true. Its result: nil once an attempt is confirmed; the
// outcome unknown (74) if any attempt may have reached the broker and none
// was confirmed; else the last error (69: never sent), saying how long it
// waited.
// A nil wait runs attempt once.
func (w *brokerWait) Do(bound time.Duration, attempt func(again bool) error) error {
	err := attempt(false)
	if w == nil || bound <= 0 || err == nil || !waitsForBroker(err) {
		return err
	}
	start := time.Now()
	deadline := start.Add(bound)
	var unknown error // the last attempt that may have been sent
	for err != nil && waitsForBroker(err) {
		if fault.CodeOf(err) == fault.OutcomeUnknown {
			unknown = err
		}
		if !w.sleep(deadline) {
			break
		}
		err = attempt(true)
	}
	if err == nil || !waitsForBroker(err) {
		return err
	}
	waited := time.Since(start).Round(100 * time.Millisecond)
	if unknown != nil {
		err = unknown
	}
	var fe *fault.Error
	if errors.As(err, &fe) {
		named := *fe
		named.Msg = fmt.Sprintf("%s (waited %v for the broker)", fe.Msg, waited)
		return &named
	}
	return err
}

// sleep waits until the broker reads connected (then a last poll step, so
// that its consumers and publishers are set up again), or deadline, or
// shutdown. It is whether an attempt is still worth making.
func (w *brokerWait) sleep(deadline time.Time) bool {
	return backoff.Poll(w.poll, deadline, w.broker.Connected, w.stop, w.ctx.Done())
}
