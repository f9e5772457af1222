package gateway

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// hookBox is a live mailbox of a pull entity stored in a real store in a
// temp folder.
func hookBox(t *testing.T) (*store.Store, *mailbox) {
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	e := &store.Entity{Name: "alice", Gid: ident.NewGid("h1"), Host: "h1", Mode: "pull",
		Status: stIdle, StatusAt: now, Created: now}
	if err := st.CreateEntity(e); err != nil {
		t.Fatal(err)
	}
	return st, &mailbox{ent: *e}
}

// stored is the entity as the store has it.
func stored(t *testing.T, st *store.Store, gid string) store.Entity {
	t.Helper()
	ents, err := st.Entities()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Gid == gid {
			return *e
		}
	}
	t.Fatalf("entity %s not stored", gid)
	return store.Entity{}
}

// A turn hook's status is recorded in the store and in memory together,
// as the hook's own, and a busy hook is the paste's proof.
func TestMailboxHookRecordsStatus(t *testing.T) {
	st, b := hookBox(t)
	before := time.Now()
	changed := b.watch()
	e, program, err := b.hook(context.Background(), st, stBusy, 0)
	if err != nil {
		t.Fatal(err)
	}
	if program != "" {
		t.Errorf("program = %q for an entity without a pane", program)
	}
	if e.Status != stBusy || e.HookAt.IsZero() {
		t.Errorf("hook returned status %q hook at %v", e.Status, e.HookAt)
	}
	s, m := stored(t, st, e.Gid), b.snapshot()
	if s.Status != stBusy || m.Status != stBusy || !s.HookAt.Equal(m.HookAt) || !s.StatusAt.Equal(m.StatusAt) {
		t.Errorf("store %q/%v, memory %q/%v: want both busy, the same hook time", s.Status, s.HookAt, m.Status, m.HookAt)
	}
	if !b.busySince(before) {
		t.Error("a busy hook is not the paste's proof")
	}
	select {
	case <-changed:
	default:
		t.Error("the mailbox's waiters were not woken")
	}
	if _, _, err := b.hook(context.Background(), st, stIdle, 0); err != nil {
		t.Fatal(err)
	}
	if s, m := stored(t, st, e.Gid), b.snapshot(); s.Status != stIdle || m.Status != stIdle {
		t.Errorf("after an idle hook: store %q, memory %q", s.Status, m.Status)
	}
}

// A status other than busy or idle changes nothing, in either place.
func TestMailboxHookRefusesOtherStatus(t *testing.T) {
	st, b := hookBox(t)
	_, _, err := b.hook(context.Background(), st, "asleep", 0)
	if fault.CodeOf(err) != fault.Usage {
		t.Fatalf("hook(asleep) = %v, want a usage error", err)
	}
	s, m := stored(t, st, b.snapshot().Gid), b.snapshot()
	if s.Status != stIdle || m.Status != stIdle || !s.HookAt.IsZero() || !m.HookAt.IsZero() {
		t.Errorf("store %q/%v, memory %q/%v: want idle, no hook", s.Status, s.HookAt, m.Status, m.HookAt)
	}
}

// A hook of an entity the store no longer has fails, and memory keeps
// what the store last had.
func TestMailboxHookGoneEntity(t *testing.T) {
	st, b := hookBox(t)
	if _, err := st.DeleteEntity(b.snapshot().Gid, "left"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.hook(context.Background(), st, stBusy, 0); fault.CodeOf(err) != fault.CantCreate {
		t.Fatalf("hook of a deleted entity = %v, want cannot record", err)
	}
	if m := b.snapshot(); m.Status != stIdle {
		t.Errorf("memory %q after a failed hook, want idle", m.Status)
	}
}
