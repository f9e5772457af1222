package gateway

import (
	"slices"
	"sync"

	"github.com/fleetd/fleet/pkg/api"
)

// registry owns this host's live entities: their mailboxes by gid, and
// gids by name. Nothing else holds a map of entities. The store is where
// entities are durable (store.Entity); the registry is where they are live.
type registry struct {
	mu     sync.RWMutex
	boxes  map[string]*mailbox // gid -> mailbox
	byName map[string]string   // name -> gid
}

func newRegistry() *registry {
	return &registry{boxes: map[string]*mailbox{}, byName: map[string]string{}}
}

// Add makes b live under its gid and name.
func (r *registry) Add(b *mailbox) {
	e := b.snapshot()
	r.mu.Lock()
	r.boxes[e.Gid] = b
	r.byName[e.Name] = e.Gid
	r.mu.Unlock()
}

// Remove takes gid's mailbox out and returns it (nil if there was none).
func (r *registry) Remove(gid string) *mailbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[gid]
	delete(r.boxes, gid)
	if b != nil {
		delete(r.byName, b.snapshot().Name)
	}
	return b
}

// Get returns gid's mailbox, or nil.
func (r *registry) Get(gid string) *mailbox {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.boxes[gid]
}

// Named returns the gid of the entity called name.
func (r *registry) Named(name string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	gid, ok := r.byName[name]
	return gid, ok
}

// Names are the names of the local entities.
func (r *registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.byName))
	for n := range r.byName {
		out = append(out, n)
	}
	return out
}

// ByName returns the mailbox of the entity called name, or nil.
func (r *registry) ByName(name string) *mailbox {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.boxes[r.byName[name]]
}

// Members are the entities of group ("all": every one).
func (r *registry) Members(group string) []*mailbox {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*mailbox
	for _, b := range r.boxes {
		if group == "all" || slices.Contains(b.snapshot().Groups, group) {
			out = append(out, b)
		}
	}
	return out
}

// Len is how many entities are live.
func (r *registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.boxes)
}

// Rows are the live entities' names, gids and host, for the names' checks
// (names.go).
func (r *registry) Rows() []api.EntityRow {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]api.EntityRow, 0, len(r.boxes))
	for _, b := range r.boxes {
		e := b.snapshot()
		out = append(out, api.EntityRow{Name: e.Name, Host: e.Host, Gid: e.Gid})
	}
	return out
}

// Row is the live entity called name as Rows gives it, or nil.
func (r *registry) Row(name string) *api.EntityRow {
	r.mu.RLock()
	defer r.mu.RUnlock()
	b := r.boxes[r.byName[name]]
	if b == nil {
		return nil
	}
	e := b.snapshot()
	return &api.EntityRow{Name: e.Name, Host: e.Host, Gid: e.Gid}
}
