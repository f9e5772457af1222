package gateway_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/ident"
)

// rowsNamed returns g's roster rows of name.
func (g *testGW) rowsNamed(name string) []api.EntityRow {
	g.t.Helper()
	var out []api.EntityRow
	for _, r := range g.must("", &api.RosterRequest{}).Entities {
		if r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

// conflictSeen waits until g's roster has name on both hosts of gids,
// each row marked with the holder's NAME@HOST.
func (g *testGW) conflictSeen(name, holder string, gids ...string) {
	g.t.Helper()
	eventually(g.t, g.Host+" lists "+name+" twice, held by "+holder, func() error {
		rows := g.rowsNamed(name)
		if len(rows) != len(gids) {
			return fmt.Errorf("%d rows: %+v", len(rows), rows)
		}
		for _, r := range rows {
			if r.NameHolder != holder {
				return fmt.Errorf("row %s@%s: name_holder %q", r.Name, r.Host, r.NameHolder)
			}
		}
		return nil
	})
}

// A name a trusted host has is refused to a join and to a spawn on
// another host, 64 name_taken, naming where it lives; the name stays one
// entity for every sender.
func TestCrossNameTakenRefused(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := newConfigOnly(t, dir, "h1", url)
	h2 := &testGW{t: t, Host: "h2", logs: &syncBuffer{}, Cfg: newConfig(t, dir, "h2", settings{"broker": url, "file": profiles(dir)})}
	enrol(t, h1, h2)
	for _, g := range []*testGW{h1, h2} {
		g.start()
		t.Cleanup(g.stop)
	}
	main2 := h1.join("main2")
	carol := h1.join("carol")
	h2.resolves("main2@h1")
	_, err := h2.call("", &api.JoinRequest{Name: "main2", Mode: "pull"})
	fe := faultOf(t, err, fault.Usage)
	if fe.Kind != fault.KindNameTaken || !strings.Contains(fe.Error(), "main2@h1") || !strings.Contains(fe.Hint, "main2@h1") {
		t.Fatalf("join of main2 on h2: %v (%s; hint %q)", fe, fe.Kind, fe.Hint)
	}
	// a spawn on h2 of the name is refused there before anything starts
	h1.resolves("carol@h1")
	_, err = carol.spawn(api.SpawnRequest{Name: "main2", Host: "h2", Profile: "w"})
	if fe := faultOf(t, err, fault.Usage); fe.Kind != fault.KindNameTaken || !strings.Contains(fe.Error(), "main2@h1") {
		t.Fatalf("spawn of main2 on h2: %v (%s)", fe, fe.Kind)
	}
	if rows := h2.rowsNamed("main2"); len(rows) != 1 || rows[0].Gid != main2.Gid || rows[0].NameHolder != "" {
		t.Fatalf("main2 on h2 after the refusals: %+v", rows)
	}
	// h1 stops: main2 keeps its name and inbox while h1 is away
	h1.stop()
	h2.waitLog(`"msg":"host left the view: it stopped"`)
	_, err = h2.call("", &api.JoinRequest{Name: "main2", Mode: "pull"})
	if fe := faultOf(t, err, fault.Usage); fe.Kind != fault.KindNameTaken || !strings.Contains(fe.Error(), "host h1 is gone") ||
		!strings.Contains(fe.Hint, "fleet-gw trust remove h1") {
		t.Fatalf("join of main2 on h2 while h1 is gone: %v (hint %q)", fe, fe.Hint)
	}
}

// Two joins of one name that neither host could see (here: before the two
// trusted each other) both stand; then the name means the entity made
// first on every host — a bare send from either goes there, with a
// warning — both rosters mark both rows, the later one's host logs an
// error once and the other a warning; when the holder leaves, the name is
// the other's.
func TestCrossNameJoinedBeforeTrust(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := newConfigOnly(t, dir, "h1", url)
	h2 := newConfigOnly(t, dir, "h2", url)
	for _, g := range []*testGW{h1, h2} {
		g.start()
		t.Cleanup(g.stop)
	}
	first := h2.join("main2") // made first: the holder, though h1 sorts first
	second := h1.join("main2")
	if !strings.HasPrefix(first.Gid, "h2.") || second.Gid <= "h1."+first.Gid[3:] {
		t.Fatalf("gids %s, %s not in the order they were made", first.Gid, second.Gid)
	}
	ann, bea := h1.join("ann"), h2.join("bea")
	enrol(t, h1, h2) // read without a restart
	h1.conflictSeen("main2", "main2@h2", first.Gid, second.Gid)
	h2.conflictSeen("main2", "main2@h2", first.Gid, second.Gid)
	h1.waitLog(`"level":"ERROR","msg":"name conflict: an entity of this host has a name that another trusted host's entity had first`)
	h2.waitLog(`"level":"WARN","msg":"name conflict: a name is on more than one trusted host`)
	for _, e := range []entity{ann, bea} {
		s := e.mustSend("main2", "bare from "+e.gw.Host)
		if s.Gid != first.Gid || s.Recipient != "main2@h2" || !strings.Contains(s.Warning, "sent to main2@h2, the first to join") ||
			!strings.Contains(s.Warning, "main2@h1") {
			t.Fatalf("bare main2 from %s: %+v", e.gw.Host, s)
		}
		first.collect("bare from " + e.gw.Host)
	}
	ann.mustSend("main2@h1", "to the later one")
	second.collect("to the later one")
	// told once, however often the roster is read or presence repeats
	h1.resolves("ann@h1")
	if n := h1.logCount(`"msg":"name conflict: an entity of this host`); n != 1 {
		t.Fatalf("the conflict told %d times on h1", n)
	}
	// the holder leaves: the name is one entity again, h1's
	h2.must("", &api.LeaveRequest{Name: "main2"})
	h1.waitLog(`"msg":"name conflict over: the name is one entity again"`)
	eventually(t, "bare main2 goes to main2@h1", func() error {
		s := bea.mustSend("main2", "now h1's")
		if s.Gid != second.Gid || s.Warning != "" {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	if rows := h2.rowsNamed("main2"); len(rows) != 1 || rows[0].NameHolder != "" {
		t.Fatalf("main2 on h2: %+v", rows)
	}
}

// Two joins of one name at the same moment on two hosts that trust each
// other: one may be refused (it heard of the other first), never both;
// if both stand, every host agrees the name means the one made first.
func TestCrossNameJoinedAtOnce(t *testing.T) {
	h1, h2 := twoHosts(t)
	ann, bea := h1.join("ann"), h2.join("bea")
	h1.resolves("bea@h2")
	h2.resolves("ann@h1")
	for round := range 4 {
		name := fmt.Sprintf("twin%d", round)
		var wg sync.WaitGroup
		resps := make([]*api.Response, 2)
		errs := make([]error, 2)
		for i, g := range []*testGW{h1, h2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resps[i], errs[i] = g.call("", &api.JoinRequest{Name: name, Mode: "pull"})
			}()
		}
		wg.Wait()
		var gids []string
		for i, other := range []string{"h2", "h1"} {
			switch err := errs[i]; {
			case err == nil:
				gids = append(gids, resps[i].Entity.Gid)
			case fault.KindOf(err) == fault.KindNameTaken && strings.Contains(err.Error(), name+"@"+other):
			default:
				t.Fatalf("%s: join on h%d: %v", name, i+1, err)
			}
		}
		switch len(gids) {
		case 0:
			t.Fatalf("%s: both joins refused", name)
		case 1:
			t.Logf("%s: one join refused", name)
			continue
		}
		t.Logf("%s: both joins stood", name)
		h, other := gids[0], gids[1]
		if strings.Split(other, ".")[1] < strings.Split(h, ".")[1] {
			h, other = other, h
		}
		holder := name + "@" + ident.GidHost(h)
		h1.conflictSeen(name, holder, h, other)
		h2.conflictSeen(name, holder, h, other)
		for _, e := range []entity{ann, bea} {
			if s := e.mustSend(name, "which?"); s.Gid != h {
				t.Fatalf("bare %s from %s went to %s, not the holder %s", name, e.gw.Host, s.Gid, h)
			}
		}
		loser := h1
		if ident.GidHost(other) == "h2" {
			loser = h2
		}
		eventually(t, loser.Host+" logs an error for "+name, func() error {
			for _, l := range strings.Split(loser.logs.String(), "\n") {
				if strings.Contains(l, `"level":"ERROR","msg":"name conflict`) && strings.Contains(l, `"entity":"`+name+`"`) {
					return nil
				}
			}
			return errors.New("not logged")
		})
	}
}

// A name only a host this gateway does not trust announces is 67
// untrusted_host, naming that host — never a "did you mean" of another
// entity here — and the host's entities are never routed to.
func TestCrossNameOnUntrustedHost(t *testing.T) {
	url := brokerURL(t)
	dir := t.TempDir()
	h1 := startGW(t, dir, "h1", settings{"broker": url})
	h2 := startGW(t, dir, "h2", settings{"broker": url})
	carol := h1.join("carol")
	h1.join("main") // what a "did you mean" would offer
	h2.join("main2")
	var fe *fault.Error
	eventually(t, "h1 names h2 for main2", func() error {
		_, err := carol.send("main2", "hello?")
		fe = faultOf(t, err, fault.NoRecipient)
		if fe.Kind != fault.KindUntrustedHost {
			return fmt.Errorf("%v (%s; hint %q)", fe, fe.Kind, fe.Hint)
		}
		return nil
	})
	if !strings.Contains(fe.Error(), "host h2, which this gateway does not trust, announces main2") ||
		strings.Contains(fe.Hint, "did you mean") || !strings.Contains(fe.Hint, "fleet-gw trust add h2 KEY") {
		t.Fatalf("main2 on untrusted h2: %v (hint %q)", fe, fe.Hint)
	}
	_, err := carol.send("main2@h2", "hello?")
	if fe := faultOf(t, err, fault.NoRecipient); fe.Kind != fault.KindUntrustedHost || !strings.Contains(fe.Error(), "host h2 is not trusted") {
		t.Fatalf("main2@h2 on untrusted h2: %v (%s)", fe, fe.Kind)
	}
	// a name nobody has is still 67 with a "did you mean"
	_, err = carol.send("mian", "hello?")
	if fe := faultOf(t, err, fault.NoRecipient); fe.Kind != fault.KindUnknownRecipient || !strings.Contains(fe.Hint, "did you mean main?") {
		t.Fatalf("mian: %v (hint %q)", fe, fe.Hint)
	}
	// and the join of main2 here is not refused: an untrusted word holds nothing
	h1.join("main2")
	if rows := h1.rowsNamed("main2"); len(rows) != 1 || rows[0].Host != "h1" || rows[0].NameHolder != "" {
		t.Fatalf("main2 on h1: %+v", rows)
	}
}
