package gateway

// sealkeys.go — this host's sealing keys as a running gateway keeps them
// (issue 27, rotation): the keyring (pkg/seal) that opens what other hosts
// sealed to this one, watched for `fleet-gw seal rotate` — a rotated key
// is announced at once, in a presence snapshot, not an interval later —
// and the retired keys past their grace destroyed, at start and every
// destroyEvery after. The other hosts' keys as they announce them are in
// peers.go (peerView.SealKey).

import (
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet/pkg/seal"
)

// How often a running gateway looks at its key files: a rotation is
// announced within watchEvery; a key past its grace is destroyed within
// destroyEvery (it opens nothing from its deadline on either way).
const (
	sealWatchEvery   = time.Second
	sealDestroyEvery = time.Minute
)

// sealKeys owns this host's keyring in a running gateway and the
// goroutine that watches it.
type sealKeys struct {
	kr  *seal.Keyring
	log *slog.Logger

	mu      sync.Mutex
	current string        // the public key last seen current
	rotated func()        // told when the current key changed (the announcer's Rekey)
	quit    chan struct{} // closed by Stop
	done    chan struct{} // closed when the watcher returned
}

// openSealKeys loads the keyring in stateDir (making the key on first
// use) and destroys the retired keys already past their grace.
func openSealKeys(stateDir string, log *slog.Logger) (*sealKeys, error) {
	kr, err := seal.LoadKeyring(stateDir)
	if err != nil {
		return nil, err
	}
	s := &sealKeys{kr: kr, log: log, current: kr.Public().String()}
	s.destroy()
	return s, nil
}

// Keyring is the keyring itself: what opens sealed bodies (gateway sealing).
func (s *sealKeys) Keyring() *seal.Keyring { return s.kr }

// Public is the current public sealing key (age1...): what presence
// announces ("" without keys: single-host mode). The keyring rereads its
// files when they changed.
func (s *sealKeys) Public() string {
	if s == nil {
		return ""
	}
	return s.kr.Public().String()
}

// Start watches the key files until Stop: rotated is called (from the
// watcher's goroutine) each time the current key changes.
func (s *sealKeys) Start(rotated func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quit != nil {
		return
	}
	s.rotated, s.quit, s.done = rotated, make(chan struct{}), make(chan struct{})
	go s.watch(s.quit, s.done)
}

// Stop ends the watcher and waits for it.
func (s *sealKeys) Stop() {
	s.mu.Lock()
	quit, done := s.quit, s.done
	s.quit = nil
	s.mu.Unlock()
	if quit == nil {
		return
	}
	close(quit)
	<-done
}

func (s *sealKeys) watch(quit, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(sealWatchEvery)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-quit:
			return
		case now := <-t.C:
			s.Check()
			if now.Sub(last) >= sealDestroyEvery {
				last = now
				s.destroy()
			}
		}
	}
}

// Check looks once whether the current key changed (another process
// rotated it) and, if it did, says so and tells rotated.
func (s *sealKeys) Check() {
	pub := s.kr.Public()
	s.mu.Lock()
	changed := pub.String() != s.current
	s.current = pub.String()
	rotated := s.rotated
	s.mu.Unlock()
	if !changed {
		return
	}
	s.log.Info("this host's sealing key was rotated: announcing the new one", "seal_key_id", pub.ID().String(), "seal_key", pub.String())
	if rotated != nil {
		rotated()
	}
}

// destroy removes the retired keys past their grace.
func (s *sealKeys) destroy() {
	gone, err := s.kr.Destroy()
	for _, id := range gone {
		s.log.Info("retired sealing key destroyed: its grace ended", "seal_key_id", id.String())
	}
	if err != nil {
		s.log.Warn("retired sealing keys not all destroyed: tried again later", "err", err)
	}
}

// sealKeyHost names the host whose public sealing key has id, as far as
// this gateway knows the keys: announced in presence, else on a trusted
// host's trust line ("" if neither).
func sealKeyHost(id string, peers *peerView, a *admission) string {
	if h := peers.SealKeyHost(id); h != "" {
		return h
	}
	if a == nil {
		return ""
	}
	for _, h := range a.trustedHosts() {
		if k, ok := a.file.SealKey(h); ok {
			if r, err := seal.ParseRecipient(k); err == nil && r.ID().String() == id {
				return h
			}
		}
	}
	return ""
}
