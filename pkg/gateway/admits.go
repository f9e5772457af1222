package gateway

// admits.go — which hosts each other host admits (issue 24, point 3).
//
// Each snapshot of a host's presence says, on its first page, which other
// hosts its trust file admits now, and whether it also admits hosts its
// operators certify (presenceBody.Admits, AdmitsCertified). This part keeps
// the latest word of each host heard, so a send to an entity of a host
// that does not admit this one fails before it is published (77, naming
// the host and the command that fixes it), instead of being refused there.
// A host whose word is unknown (a gateway before this, or not heard within
// the presence TTL) is sent to as before; a host that admits certified
// hosts while this one presents a certificate may admit it.

import (
	"sort"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/trust"
)

// maxAdmits bounds the hosts one host's word lists (a hostile host cannot
// make this one hold more).
const maxAdmits = 4096

type admitsWord struct {
	hosts     map[string]bool
	certified bool
	at        time.Time
}

// admitsView is the latest word of each other host on whom it admits.
type admitsView struct {
	self string
	ttl  time.Duration

	mu    sync.Mutex
	words map[string]*admitsWord
}

func newAdmitsView(self string, ttl time.Duration) *admitsView {
	return &admitsView{self: self, ttl: ttl, words: map[string]*admitsWord{}}
}

// heard keeps host's word: the hosts it admits, and whether it admits the
// hosts its operators certify.
func (v *admitsView) heard(host string, hosts []string, certified bool, now time.Time) {
	if v == nil {
		return
	}
	w := &admitsWord{hosts: map[string]bool{}, certified: certified, at: now}
	for i, h := range hosts {
		if i >= maxAdmits {
			break
		}
		if trust.HostRE.MatchString(h) {
			w.hosts[h] = true
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.words[host] = w
}

// admits says whether host admits this one: known is false when its word
// is unknown or older than the TTL. certified: this host presents an
// operator certificate.
func (v *admitsView) admits(host string, certified bool, now time.Time) (admits, known bool) {
	if v == nil || host == v.self {
		return true, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.words[host]
	if w == nil || now.Sub(w.at) > v.ttl {
		return true, false
	}
	return w.hosts[v.self] || (w.certified && certified), true
}

// check is the send's test: nil, or 77 naming host and the fix.
func (v *admitsView) check(host string, certified bool, now time.Time) error {
	if ok, known := v.admits(host, certified, now); ok || !known {
		return nil
	}
	return fault.New(fault.Refused, fault.KindPeer, "host %s does not admit this host (%s): the message was not sent", host, v.self).
		WithHint("on %s run: fleet-gw trust add %s KEY (KEY is what `fleet-gw key` prints here), or have an operator certify %s", host, v.self, v.self)
}

// list is what this host says it admits, sorted, for its presence.
func admitsList(hosts []string) []string {
	out := append([]string{}, hosts...)
	sort.Strings(out)
	if len(out) > maxAdmits {
		out = out[:maxAdmits]
	}
	return out
}
