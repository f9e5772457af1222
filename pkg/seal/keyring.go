package seal

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"filippo.io/age"
	"github.com/fleetd/fleet/pkg/private"
)

// The keyring's files in the state folder.
const (
	// KeyFile is the current sealing key, an age identity file.
	KeyFile = "seal.key"
	// RetiredDir holds the retired keys, one file each, named
	// UNTIL-KEYID.key (UNTIL in UTC, 20061231T150405Z): the key opens
	// messages until then, and Destroy removes it after.
	RetiredDir = "seal-retired"
	// destroyedFile lists the ids of the keys destroyed (no secret), so
	// a message sealed to one is told as such, not as another host's.
	destroyedFile = "destroyed"
	stampLayout   = "20060102T150405Z"
	maxDestroyed  = 256
	maxKeyFile    = 4096
)

// Keyring is a host's sealing keys: the current one, which other hosts
// seal to, and the retired ones still inside their grace. It rereads its
// files when they change (another process rotated), at most one stat of
// each per call.
type Keyring struct {
	dir string
	now func() time.Time

	mu        sync.Mutex
	stamp     [2]fileStamp
	current   *age.X25519Identity
	pub       *Recipient
	retired   map[KeyID]retired
	destroyed map[KeyID]bool
	gone      []KeyID // destroyed, oldest first
}

type retired struct {
	id    *age.X25519Identity
	until time.Time
	path  string
}

type fileStamp struct {
	ino          uint64
	size         int64
	mtime, ctime time.Time
}

// Key describes one key of the ring (no secret).
type Key struct {
	ID      string    `json:"id"`
	Public  string    `json:"public"`
	Current bool      `json:"current,omitempty"`
	Until   time.Time `json:"until,omitzero"` // a retired key's grace deadline
}

// LoadKeyring returns the sealing keys in stateDir, making the current
// key on first use (0600, beside the signing key).
func LoadKeyring(stateDir string) (*Keyring, error) {
	k := &Keyring{dir: stateDir, now: time.Now}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// Public is the current key's public half: what other hosts seal to.
func (k *Keyring) Public() *Recipient {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refresh()
	return k.pub
}

// Keys lists the current key, then the retired ones by deadline.
func (k *Keyring) Keys() []Key {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refresh()
	out := []Key{{ID: k.pub.ID().String(), Public: k.pub.String(), Current: true}}
	var rs []Key
	for id, r := range k.retired {
		rs = append(rs, Key{ID: id.String(), Public: r.id.Recipient().String(), Until: r.until})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].Until.Before(rs[j].Until) })
	return append(out, rs...)
}

// Rotate makes a new current key and retires the old one until now+grace:
// other hosts seal to the new key once they hold its line (or
// certificate), and what they sealed to the old one meanwhile still
// opens. It returns the new public key.
func (k *Keyring) Rotate(grace time.Duration) (*Recipient, error) {
	if grace < 0 {
		return nil, fmt.Errorf("a negative grace (%v)", grace)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refresh()
	next, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, err
	}
	// the old key first, then the new current one: a crash between the
	// two leaves the old key both current and retired, never lost
	until := k.now().Add(grace).UTC().Truncate(time.Second)
	old := k.pub.ID()
	dir := filepath.Join(k.dir, RetiredDir)
	if err := private.MakeDir(dir); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, until.Format(stampLayout)+"-"+old.String()+".key")
	if err := private.WriteFile(path, keyFileText(k.current, "a retired fleet sealing key: it opens what was sealed to it until "+until.Format(time.RFC3339)+", then it is destroyed"), 0o600); err != nil {
		return nil, err
	}
	if err := private.WriteFile(filepath.Join(k.dir, KeyFile), keyFileText(next, "this host's fleet sealing key: other hosts seal message bodies to its public half"), 0o600); err != nil {
		return nil, err
	}
	k.stamp = [2]fileStamp{}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k.pub, nil
}

// Destroy removes the retired keys whose grace has passed and returns
// their ids. Their ids are remembered, so a message sealed to one is
// refused as ErrUnknownKey.
func (k *Keyring) Destroy() ([]KeyID, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refresh()
	now := k.now()
	var gone []KeyID
	for id, r := range k.retired {
		if now.Before(r.until) {
			continue
		}
		gone = append(gone, id)
	}
	if len(gone) == 0 {
		return nil, nil
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i].String() < gone[j].String() })
	// remember first, then remove: a crash in between keeps a key one
	// more round, never forgets one it removed
	for _, id := range gone {
		k.destroyed[id] = true
		k.gone = append(k.gone, id)
	}
	if err := k.writeDestroyed(); err != nil {
		return nil, err
	}
	var errs []error
	for _, id := range gone {
		if err := os.Remove(k.retired[id].path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(k.retired, id)
	}
	k.stamp = [2]fileStamp{}
	return gone, errors.Join(errs...)
}

// find returns the first of ids that is a usable key of this host's, and
// its index; if none, an ErrUnknownKey error when one of them was this
// host's (retired past its grace, or destroyed), else ErrNotForUs.
func (k *Keyring) find(ids []KeyID) (*age.X25519Identity, int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refresh()
	var gone error
	for i, id := range ids {
		ident, err := k.identity(id)
		if ident != nil {
			return ident, i, nil
		}
		if err != nil && gone == nil {
			gone = err
		}
	}
	if gone != nil {
		return nil, -1, gone
	}
	return nil, -1, &Error{Kind: ErrNotForUs, Msg: fmt.Sprintf("%d recipient keys, none of this host's", len(ids))}
}

// identity returns the key with id to open with: nil, nil if id is not
// one of this host's; an ErrUnknownKey error if it was and is no longer
// usable. k.mu is held.
func (k *Keyring) identity(id KeyID) (*age.X25519Identity, error) {
	if id == k.pub.ID() {
		return k.current, nil
	}
	if r, ok := k.retired[id]; ok {
		if k.now().Before(r.until) {
			return r.id, nil
		}
		return nil, &Error{Kind: ErrUnknownKey, Key: id.String(),
			Msg: fmt.Sprintf("key %s retired, its grace ended %s", id, r.until.Format(time.RFC3339))}
	}
	if k.destroyed[id] {
		return nil, &Error{Kind: ErrUnknownKey, Key: id.String(), Msg: fmt.Sprintf("key %s was destroyed", id)}
	}
	return nil, nil
}

func keyFileText(id *age.X25519Identity, what string) []byte {
	return []byte("# " + what + ".\n# public key: " + id.Recipient().String() + "\n" + id.String() + "\n")
}

// stamps are the identities of the key file and the retired folder.
func (k *Keyring) stamps() [2]fileStamp {
	var out [2]fileStamp
	for i, p := range []string{filepath.Join(k.dir, KeyFile), filepath.Join(k.dir, RetiredDir)} {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil {
			out[i] = fileStamp{ino: st.Ino, size: st.Size,
				mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), ctime: time.Unix(st.Ctim.Sec, st.Ctim.Nsec)}
		}
	}
	return out
}

// refresh rereads the files if they changed; a reread that fails keeps
// the keys held (a key is never dropped for a file being rewritten).
func (k *Keyring) refresh() {
	if k.stamps() == k.stamp {
		return
	}
	_ = k.load()
}

// load reads the current key (making it if there is none), the retired
// keys and the destroyed ids.
func (k *Keyring) load() error {
	stamp := k.stamps()
	path := filepath.Join(k.dir, KeyFile)
	cur, err := readKey("sealing key", path)
	if errors.Is(err, os.ErrNotExist) {
		if err := private.MakeDir(k.dir); err != nil {
			return err
		}
		cur, err = age.GenerateX25519Identity()
		if err != nil {
			return err
		}
		// exclusive: two processes starting at once keep one key
		f, ferr := private.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(ferr, os.ErrExist) {
			return k.load()
		}
		if ferr != nil {
			return ferr
		}
		_, err = f.Write(keyFileText(cur, "this host's fleet sealing key: other hosts seal message bodies to its public half"))
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return err
		}
		stamp = k.stamps()
	} else if err != nil {
		return err
	}
	ret := map[KeyID]retired{}
	destroyed := map[KeyID]bool{}
	var gone []KeyID
	dir := filepath.Join(k.dir, RetiredDir)
	names, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, n := range names {
		if n.Name() == destroyedFile {
			data, err := private.ReadFile("destroyed sealing keys", filepath.Join(dir, destroyedFile), false, 64<<10)
			if err != nil {
				return err
			}
			for _, l := range strings.Fields(string(data)) {
				if id, err := parseKeyID(l); err == nil && !destroyed[id] {
					destroyed[id] = true
					gone = append(gone, id)
				}
			}
			continue
		}
		stampText, _, ok := strings.Cut(strings.TrimSuffix(n.Name(), ".key"), "-")
		if !ok || !strings.HasSuffix(n.Name(), ".key") || strings.HasPrefix(n.Name(), ".") {
			continue
		}
		until, err := time.Parse(stampLayout, stampText)
		if err != nil {
			continue
		}
		p := filepath.Join(dir, n.Name())
		id, err := readKey("retired sealing key", p)
		if err != nil {
			return err
		}
		ret[recipientOf(id).ID()] = retired{id: id, until: until, path: p}
	}
	k.current, k.pub, k.retired, k.destroyed, k.gone, k.stamp = cur, recipientOf(cur), ret, destroyed, gone, stamp
	delete(k.retired, k.pub.ID()) // a crash mid-rotation: current wins
	return nil
}

func parseKeyID(s string) (KeyID, error) {
	var id KeyID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return id, errors.New("not a key id")
	}
	copy(id[:], b)
	return id, nil
}

func (k *Keyring) writeDestroyed() error {
	if len(k.gone) > maxDestroyed {
		for _, id := range k.gone[:len(k.gone)-maxDestroyed] {
			delete(k.destroyed, id)
		}
		k.gone = k.gone[len(k.gone)-maxDestroyed:]
	}
	ids := make([]string, len(k.gone))
	for i, id := range k.gone {
		ids[i] = id.String()
	}
	dir := filepath.Join(k.dir, RetiredDir)
	if err := private.MakeDir(dir); err != nil {
		return err
	}
	return private.WriteFile(filepath.Join(dir, destroyedFile), []byte(strings.Join(ids, "\n")+"\n"), 0o600)
}

// readKey reads an age X25519 identity file (this user's, 0600).
func readKey(what, path string) (*age.X25519Identity, error) {
	data, err := private.ReadFile(what, path, true, maxKeyFile)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, err := age.ParseX25519Identity(line)
		if err != nil {
			return nil, fmt.Errorf("%s is not a fleet sealing key (an age X25519 identity): %v", path, err)
		}
		return id, nil
	}
	return nil, fmt.Errorf("%s is not a fleet sealing key (it holds no key)", path)
}
