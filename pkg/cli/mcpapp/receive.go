package mcpapp

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// receive takes whole messages from the inbox, oldest first, within the
// call's bounds, and acknowledges exactly those it returns — the protocol
// fleet-recv follows (a message leaves the inbox once acknowledged after
// the client has it): what did not fit is never acknowledged and comes
// first next time.
func (s *server) receive(ctx context.Context, req *mcp.CallToolRequest, in ReceiveIn) (*mcp.CallToolResult, ReceiveOut, error) {
	maxN, err := bounded("max_messages", in.MaxMessages, defaultMaxMessages, 1, maxMaxMessages)
	if err != nil {
		return nil, ReceiveOut{}, toolError(err, "")
	}
	maxB, err := s.maxBytes(in.MaxBytes)
	if err != nil {
		return nil, ReceiveOut{}, toolError(err, "")
	}
	if in.WaitSeconds != 0 {
		wait, err := seconds("wait_seconds", in.WaitSeconds, 0)
		if err != nil {
			return nil, ReceiveOut{}, toolError(err, "")
		}
		stop := s.progress(ctx, req, "waiting for mail")
		err = s.awaitMail(ctx, wait)
		stop()
		if err != nil {
			return nil, ReceiveOut{}, toolError(err, "")
		}
	}
	out, err := s.drain(ctx, maxN, maxB)
	if err != nil {
		return nil, ReceiveOut{}, toolError(err, "")
	}
	out.Left = s.inbox.now()
	switch {
	case in.WaitSeconds > 0 && len(out.Messages) == 0 && out.NextBytes == 0:
		out.Note = fmt.Sprintf("no mail came within %ds; call receive again (wait_seconds) to go on waiting", in.WaitSeconds)
	case out.NextBytes > 0 && len(out.Messages) == 0:
		out.Note = fmt.Sprintf("the oldest waiting message is %d bytes, over max_bytes %d: call receive with max_bytes %d or more to take it",
			out.NextBytes, maxB, out.NextBytes)
	}
	return nil, out, nil
}

// awaitMail returns once the inbox holds something or wait passes (no
// error: the drain after it finds nothing). It follows the inbox without
// acknowledging anything and hangs up at the first batch, so the batch
// stays in the inbox for the bounded drain that follows.
func (s *server) awaitMail(ctx context.Context, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	cl, _, err := s.openRecv(wctx, &api.RecvRequest{Follow: true, Max: 1, Window: 1})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if wctx.Err() != nil {
			return nil // waited long enough
		}
		return err
	}
	cl.Close()
	return nil
}

// openRecv starts a recv stream and reads its first frame. The drain
// lease of a stream this server just hung up on is given back a moment
// later, so "inbox busy" is tried again for a short while.
func (s *server) openRecv(ctx context.Context, req *api.RecvRequest) (*api.Client, *api.Response, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		cl, err := s.dial()
		if err != nil {
			return nil, nil, err
		}
		if err := cl.Send(req); err != nil {
			cl.Close()
			return nil, nil, err
		}
		resp, err := readHeld(ctx, cl)
		if err == nil {
			return cl, resp, nil
		}
		cl.Close()
		if fault.KindOf(err) != fault.KindInboxBusy || time.Now().After(deadline) {
			return nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// drain takes up to maxN whole messages whose bodies add up to at most
// maxB bytes. The gateway sends batches of up to maxN (live asks first,
// alone) and waits for each one's acknowledgement; drain acknowledges the
// prefix that fits. Once something does not fit, the acknowledgement has
// to be known recorded before the connection is dropped: the gateway
// records it while it offers the rest again, and settles it before
// taking the next acknowledgement — so an empty one to that offer, and
// the frame after it, say it is on disk.
//
// Messages are returned once their acknowledgement is sent, whatever
// follows: if recording it fails they may come again (at least once),
// which is better than a message recorded delivered that nobody saw.
func (s *server) drain(ctx context.Context, maxN, maxB int) (ReceiveOut, error) {
	out := ReceiveOut{Messages: []Message{}}
	cl, resp, err := s.openRecv(ctx, &api.RecvRequest{Max: maxN, Window: maxN})
	if err != nil {
		return out, err
	}
	defer cl.Close()
	used := 0
	for !resp.End {
		take := 0
		for _, d := range resp.Batch {
			n := len(d.Envelope.Body)
			if used+n > maxB || len(out.Messages)+take >= maxN {
				break
			}
			used += n
			take++
		}
		acks := make([]string, 0, take)
		for _, d := range resp.Batch[:take] {
			acks = append(acks, d.Envelope.MsgID)
		}
		if take == 0 {
			// nothing fits: hang up without acknowledging; all stays
			out.NextBytes = len(resp.Batch[0].Envelope.Body)
			return out, nil
		}
		if err := cl.Send(&api.AckRequest{Acks: acks}); err != nil {
			if len(out.Messages) == 0 {
				return out, err
			}
			// earlier batches are taken and must be shown; this one stays
			out.Note = fmt.Sprintf("stopped early (%s (%d): %v); the rest stays in the inbox", fault.KindOf(err), fault.CodeOf(err), err)
			return out, nil
		}
		for _, d := range resp.Batch[:take] {
			out.Messages = append(out.Messages, view(d.Envelope, maxB))
		}
		if take < len(resp.Batch) {
			out.NextBytes = len(resp.Batch[take].Envelope.Body)
			if err := settle(ctx, cl); err != nil {
				out.Note = ackNote(err)
			}
			return out, nil
		}
		if resp, err = readHeld(ctx, cl); err != nil {
			out.Note = ackNote(err)
			return out, nil
		}
	}
	return out, nil
}

// settle waits until the gateway has recorded the last acknowledgement:
// the next frame is the end (recorded before it is sent) or the rest
// offered again, which an empty acknowledgement answers; the frame after
// that comes only once the last one is recorded.
func settle(ctx context.Context, cl *api.Client) error {
	resp, err := readHeld(ctx, cl)
	if err != nil || resp.End {
		return err
	}
	if err := cl.Send(&api.AckRequest{}); err != nil {
		return err
	}
	_, err = readHeld(ctx, cl)
	return err
}

func ackNote(err error) string {
	return fmt.Sprintf("these messages were shown but their acknowledgement may not be recorded (%s (%d): %v): some may come again",
		fault.KindOf(err), fault.CodeOf(err), err)
}
