package mcpapp

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// inboxURI is the resource that tells how much mail waits; the server
// marks it updated when that changes.
const inboxURI = "fleet://inbox"

// watcher learns how much mail waits by asking the gateway (whoami: the
// stored messages and the live asks) every poll interval, on one
// connection of its own, and after every tool call. Polling rather than
// following the inbox: a follow stream holds the inbox's drain lease,
// which would lock out this server's own receive and any fleet-recv of
// the same entity, and would stand the gateway's nudges down. A whoami
// costs the gateway a map lookup and a count.
type watcher struct {
	s     *server
	mu    sync.Mutex
	cl    *api.Client
	last  seen
	known bool
	at    time.Time
}

func newWatcher(s *server) *watcher { return &watcher{s: s} }

func (w *watcher) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check(ctx)
		}
	}
}

func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cl != nil {
		w.cl.Close()
		w.cl = nil
	}
}

// seen is what a check learns: the counts, and the newest message and
// ask waiting. A change of any of them is new mail or mail taken; the
// counts alone would miss a message that came as another one went.
type seen struct {
	Inbox
	seq uint64
	ask string
}

func seenOf(e *api.EntityRow) seen {
	return seen{Inbox: Inbox{Messages: e.Pending, Asks: e.Asks}, seq: e.NewestSeq, ask: e.NewestAsk}
}

// now is the inbox as of now, for a tool result; the last known state if
// the gateway cannot say.
func (w *watcher) now() Inbox {
	st, _ := w.check(context.Background())
	return st
}

// check asks the gateway and marks the resource updated when the counts
// changed since the last check.
func (w *watcher) check(ctx context.Context) (Inbox, error) {
	w.mu.Lock()
	now, err := w.whoami()
	changed := err == nil && w.known && now != w.last
	if err == nil {
		w.last, w.known, w.at = now, true, time.Now().UTC()
	}
	st := w.last.Inbox
	w.mu.Unlock()
	if changed {
		w.s.mcp.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: inboxURI})
	}
	return st, err
}

// whoami asks on the watcher's connection, dialing again once if it was
// lost (a gateway restarted since). Called with mu held.
func (w *watcher) whoami() (seen, error) {
	for try := 0; ; try++ {
		if w.cl == nil {
			cl, err := w.s.dial()
			if err != nil {
				return seen{}, err
			}
			w.cl = cl
		}
		resp, err := w.cl.Call(&api.WhoamiRequest{})
		if err == nil {
			return seenOf(resp.Entity), nil
		}
		w.cl.Close()
		w.cl = nil
		if try > 0 || fault.KindOf(err) != fault.KindNoGateway {
			return seen{}, err
		}
	}
}

// inboxView is the resource's content.
type inboxView struct {
	Entity   string    `json:"entity"`
	Messages int       `json:"messages"`
	Asks     int       `json:"asks"`
	Checked  time.Time `json:"checked"`
	Hint     string    `json:"hint,omitempty"`
	Error    string    `json:"error,omitempty"`
}

func (s *server) addResources() {
	s.mcp.AddResource(&mcp.Resource{URI: inboxURI, Name: "inbox", Title: "fleet inbox of " + s.me.Name + "@" + s.me.Host,
		MIMEType: "application/json",
		Description: "How much mail waits for you: messages and live asks. Subscribe to it: the server sends " +
			"resources/updated when new mail comes or mail is taken (checked every few seconds). Take the mail with the receive tool."},
		func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			st, err := s.inbox.check(ctx)
			v := inboxView{Entity: s.me.Name + "@" + s.me.Host, Messages: st.Messages, Asks: st.Asks}
			s.inbox.mu.Lock()
			v.Checked = s.inbox.at
			s.inbox.mu.Unlock()
			if err != nil {
				v.Error = toolError(err, "").Error()
			}
			if st.Messages+st.Asks > 0 {
				v.Hint = "call the receive tool"
			}
			data, _ := json.Marshal(v)
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: inboxURI, MIMEType: "application/json", Text: string(data)}}}, nil
		})
}
