package gateway

import (
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/store"
)

// The peers' name index (peers.go ByName): what a host said is found by
// name, on the host asked, of trusted hosts only; a renamed or dropped
// entity leaves it; and it survives a restart through the store.
func TestPeerViewByName(t *testing.T) {
	const iv = time.Second
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	v := newPeerView(iv, log)
	t0 := time.Now()
	rows := func(host string, names ...string) []api.EntityRow {
		var out []api.EntityRow
		for _, n := range names {
			out = append(out, api.EntityRow{Name: n, Host: host, Gid: host + "." + n, Mode: "pull", Groups: []string{"ops"}})
		}
		return out
	}
	if err := v.Page("h2", 1, 0, iv, 1, 0, 1, rows("h2", "bob", "carol"), t0); err != nil {
		t.Fatal(err)
	}
	if err := v.Page("h3", 1, 0, iv, 1, 0, 1, rows("h3", "bob"), t0); err != nil {
		t.Fatal(err)
	}
	all := func(string) bool { return true }
	hosts := func(rs []api.EntityRow) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name+"@"+r.Host)
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		name, host string
		trusted    func(string) bool
		want       []string
	}{
		{"bob", "", all, []string{"bob@h2", "bob@h3"}},
		{"bob", "h3", all, []string{"bob@h3"}},
		{"bob", "", func(h string) bool { return h == "h2" }, []string{"bob@h2"}},
		{"carol", "h3", all, nil},
		{"dave", "", all, nil},
	} {
		if got := hosts(v.ByName(c.name, c.host, c.trusted)); !slices.Equal(got, c.want) {
			t.Errorf("ByName(%q, %q): %v, want %v", c.name, c.host, got, c.want)
		}
	}
	// h2's next snapshot calls carol's gid dora and has bob no more
	renamed := []api.EntityRow{{Name: "dora", Host: "h2", Gid: "h2.carol", Mode: "pull", Groups: []string{}}}
	if err := v.Page("h2", 2, 1, iv, 2, 0, 1, renamed, t0.Add(iv)); err != nil {
		t.Fatal(err)
	}
	if got := hosts(v.ByName("carol", "", all)); got != nil {
		t.Errorf("carol after the rename: %v, want nobody", got)
	}
	if got := hosts(v.ByName("dora", "", all)); !slices.Equal(got, []string{"dora@h2"}) {
		t.Errorf("dora: %v", got)
	}
	if got := hosts(v.ByName("bob", "", all)); !slices.Equal(got, []string{"bob@h3"}) {
		t.Errorf("bob after h2 dropped it: %v, want bob@h3", got)
	}
	v.Forget("h3.bob") // the broker has no inbox for it
	if got := v.ByName("bob", "", all); got != nil {
		t.Errorf("bob after Forget: %v", got)
	}

	// the last word kept in the store: found by name after a restart,
	// before its host is heard again
	st, err := store.Open(filepath.Join(t.TempDir(), "fleet.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put, drop := v.Unsaved()
	if err := st.SaveHeard(put, drop); err != nil {
		t.Fatal(err)
	}
	heard, err := st.Heard()
	if err != nil {
		t.Fatal(err)
	}
	again := newPeerView(iv, log)
	again.Remember(heard)
	if got := hosts(again.ByName("dora", "h2", all)); !slices.Equal(got, []string{"dora@h2"}) {
		t.Errorf("dora after a restart: %v", got)
	}
	if got := again.ByName("bob", "", all); got != nil {
		t.Errorf("bob after a restart: %v, want nobody (forgotten and dropped)", got)
	}
}
