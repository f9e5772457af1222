package gateway

import (
	"context"

	"github.com/fleetd/fleet/pkg/deliver"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/store"
)

// hook is the mailbox's verb for an agent's turn hook: status (busy or
// idle) recorded as the hook's own, in the store and in memory together
// (putStatus); agent, if not 0, bound as the entity's agent process; and,
// for a pane entity whose program is not known yet (an agent started from
// the pane's shell), the program the pane runs while its hook runs. It
// returns the entity as stored and the program learnt ("" if none).
func (b *mailbox) hook(ctx context.Context, st *store.Store, status string, agent int) (*store.Entity, string, error) {
	if status != stBusy && status != stIdle {
		return nil, "", fault.New(fault.Usage, fault.KindUsage, "status must be busy or idle, not %q", status)
	}
	ent := b.snapshot()
	program := ""
	if ent.TmuxTarget != "" && ent.Program == "" {
		if p, err := deliver.Probe(ctx, ent.PaneTarget()); err == nil && agentInFront(p) {
			program = p.Command
		}
	}
	e, err := b.putStatus(st, status, "", true, program)
	if err == nil && agent != 0 {
		// the hook's own agent process: the one the pane must have in front
		e, err = b.bindAgent(st, agent)
	}
	if err != nil {
		return nil, "", fault.Wrap(fault.CantCreate, fault.KindStateDir, err, "cannot record the status")
	}
	return e, program, nil
}
