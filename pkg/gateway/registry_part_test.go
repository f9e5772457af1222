package gateway

import (
	"slices"
	"sync"
	"testing"

	"github.com/fleetd/fleet/pkg/ident"
	"github.com/fleetd/fleet/pkg/store"
)

// The registry alone (registry.go): the live entities by gid and by name,
// and nothing else.

func liveBox(name string, groups ...string) *mailbox {
	return &mailbox{ent: store.Entity{Gid: ident.NewGid("h1"), Name: name, Host: "h1", Groups: groups}}
}

func TestRegistryFindsByGidNameAndGroup(t *testing.T) {
	r := newRegistry()
	alice, bob := liveBox("alice", "ops"), liveBox("bob", "ops", "dev")
	r.Add(alice)
	r.Add(bob)
	ag := alice.snapshot().Gid
	if r.Get(ag) != alice || r.ByName("alice") != alice || r.Len() != 2 {
		t.Fatal("alice is not found by gid and by name")
	}
	if gid, ok := r.Named("bob"); !ok || gid != bob.snapshot().Gid {
		t.Fatalf("Named(bob) = %s, %v", gid, ok)
	}
	if r.Get("h1.0190aaaa-0000-7000-8000-00000000ffff") != nil || r.ByName("carl") != nil || r.Row("carl") != nil {
		t.Fatal("an entity nobody added is found")
	}
	if _, ok := r.Named("carl"); ok {
		t.Fatal("Named(carl) found one")
	}
	names := r.Names()
	slices.Sort(names)
	if !slices.Equal(names, []string{"alice", "bob"}) {
		t.Fatalf("Names %v", names)
	}
	if got := len(r.Members("ops")); got != 2 {
		t.Fatalf("ops has %d members, want 2", got)
	}
	if dev := r.Members("dev"); len(dev) != 1 || dev[0] != bob {
		t.Fatalf("dev %v, want bob", dev)
	}
	if got := len(r.Members("all")); got != 2 {
		t.Fatalf("all has %d members, want every one", got)
	}
	if row := r.Row("alice"); row == nil || row.Gid != ag || row.Host != "h1" {
		t.Fatalf("Row(alice) %+v", row)
	}
	if rows := r.Rows(); len(rows) != 2 {
		t.Fatalf("Rows %v", rows)
	}

	if r.Remove(ag) != alice || r.Remove(ag) != nil {
		t.Fatal("Remove does not hand back alice once")
	}
	if r.Get(ag) != nil || r.ByName("alice") != nil || r.Len() != 1 || len(r.Members("ops")) != 1 {
		t.Fatal("alice is still found after Remove")
	}
}

// Adds, removes and reads at once keep the two indexes together (run
// with -race).
func TestRegistryConcurrent(t *testing.T) {
	r := newRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := liveBox(string(rune('a' + i)))
			for range 100 {
				r.Add(b)
				_ = r.Names()
				_ = r.Members("all")
				r.Remove(b.snapshot().Gid)
			}
		}()
	}
	wg.Wait()
	if r.Len() != 0 || len(r.Names()) != 0 {
		t.Fatalf("after every add was removed: %d live, names %v", r.Len(), r.Names())
	}
}
