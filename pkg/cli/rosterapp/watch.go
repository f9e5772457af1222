package rosterapp

import (
	"github.com/fleetd/fleet/pkg/api"
	fleetcli "github.com/fleetd/fleet/pkg/cli"
	ucli "github.com/urfave/cli/v2"
)

// rowEvent are the watch events after which the roster's rows are read
// again at once (the others wait for the next poll).
var rowEvent = map[string]bool{"joined": true, "left": true, "status": true}

// eventStream is the gateway's watch stream (op watch), read on a
// connection of its own: its events, then err once it ends.
type eventStream struct {
	client *api.Client
	ch     chan api.WatchEvent
	err    error // why the stream ended, once ch is closed
}

// openEvents opens the stream and waits for the gateway's word that it
// is open: every event after that is sent.
func openEvents(c *ucli.Context) (*eventStream, error) {
	s, err := fleetcli.Connect(c)
	if err != nil {
		return nil, err
	}
	if _, err := s.Client.Call(&api.WatchRequest{Text: lineageBool(c, "text")}); err != nil {
		s.Client.Close()
		return nil, err
	}
	es := &eventStream{client: s.Client, ch: make(chan api.WatchEvent, 64)}
	go func() {
		defer close(es.ch)
		for {
			resp, err := es.client.Read()
			if err != nil {
				es.err = err
				return
			}
			if resp.Event != nil {
				es.ch <- *resp.Event
			}
		}
	}()
	return es, nil
}

// events is the stream's channel; nil (never ready) without a stream.
func (es *eventStream) events() <-chan api.WatchEvent {
	if es == nil {
		return nil
	}
	return es.ch
}

func (es *eventStream) close() { es.client.Close() }
