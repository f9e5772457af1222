package gateway

import (
	"crypto/ed25519"
	"encoding/base64"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/api"
	"github.com/fleetd/fleet/pkg/envelope"
	"github.com/fleetd/fleet/pkg/fault"
	"github.com/fleetd/fleet/pkg/seal"
	"github.com/fleetd/fleet/pkg/trust"
)

// Sealed dead letters (issue 27, point 5): a copy in bridge.dlq sealed by
// h2 to h1 (the recipient's host) and h2 opens in h1's deadLetters part
// with h1's real keyring once its signature is proven; one sealed to
// other hosts, or not proven, or sealed to a destroyed key, is named
// with the hosts it is sealed to and not opened; a replay opens it the
// same way, or says on which host to run it.

type sealedDLQRig struct {
	r    *intakeRig
	d    *deadLetters
	kr   *seal.Keyring // h1's
	h2   ed25519.PrivateKey
	h2kr *seal.Keyring
	dir  string // h1's state folder
}

func newSealedDLQRig(t *testing.T) *sealedDLQRig {
	r, d, _ := newDeadLettersRig(t)
	dir := filepath.Join(t.TempDir(), "h1")
	kr, err := seal.LoadKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	h2kr, err := seal.LoadKeyring(filepath.Join(t.TempDir(), "h2"))
	if err != nil {
		t.Fatal(err)
	}
	_, h2, _ := ed25519.GenerateKey(nil)
	own, _, _ := ed25519.GenerateKey(nil)
	path := filepath.Join(t.TempDir(), "trust")
	if _, err := trust.Add(path, trust.Entry{Host: "h2", Key: base64.StdEncoding.EncodeToString(h2.Public().(ed25519.PublicKey))}); err != nil {
		t.Fatal(err)
	}
	a := &admission{host: "h1", own: own, file: trust.Open(path), memo: newVerified(16),
		dedupWindow: time.Hour, presenceTTL: 15 * time.Second, untrusted: map[string]time.Time{}}
	peers := newPeerView(time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	peers.HearSealKey("h2", 1, h2kr.Public().String()) // h2 announced its key
	d.admit = func() *admission { return a }
	d.keys = func() *seal.Keyring { return kr }
	d.keyHost = func(id string) string { return sealKeyHost(id, peers, a) }
	return &sealedDLQRig{r: r, d: d, kr: kr, h2: h2, h2kr: h2kr, dir: dir}
}

// sealedSend is a SEND from from to to, its text sealed to keys (binding:
// kind, msg id, signer), and its encoding.
func sealedSend(t *testing.T, from, to envelope.Party, signer, text string, keys ...*seal.Recipient) (*envelope.Envelope, []byte) {
	t.Helper()
	env := envelope.New(envelope.Send, from, to, "")
	sealed, err := seal.Seal(seal.Bind(string(env.Kind), env.MsgID, signer), []byte(text), keys)
	if err != nil {
		t.Fatal(err)
	}
	env.Sealed = sealed
	raw, err := envelope.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	return env, raw
}

// copyOf is h2's message from bob to to, its body sealed to the keys of
// to (binding: kind, msg id, h2), signed by h2: as bridge.dlq holds it.
func (s *sealedDLQRig) copyOf(t *testing.T, to envelope.Party, text string, keys ...*seal.Recipient) *api.OpenDeadRequest {
	_, raw := sealedSend(t, ibob, to, "h2", text, keys...)
	return &api.OpenDeadRequest{Raw: raw, Sig: ed25519.Sign(s.h2, raw), SignedBy: "h2"}
}

func TestDeadLettersSealed(t *testing.T) {
	s := newSealedDLQRig(t)
	carol := s.r.entity("carol")
	stranger, err := seal.LoadKeyring(filepath.Join(t.TempDir(), "h3"))
	if err != nil {
		t.Fatal(err)
	}

	// sealed to h1 and h2: opened here, both hosts named
	mine := s.copyOf(t, carol, "the brief for carol", s.kr.Public(), s.h2kr.Public())
	res, err := s.d.OpenDead(mine)
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; !o.Readable || o.Text != "the brief for carol" || !slices.Equal(o.SealedTo, []string{"h1", "h2"}) {
		t.Fatalf("sealed to h1 and h2: %+v", o)
	}

	// sealed to h2 and a host this one does not know: not opened
	other := s.copyOf(t, carol, "not for h1", s.h2kr.Public(), stranger.Public())
	res, err = s.d.OpenDead(other)
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; o.Readable || o.Text != "" || o.Reason != "not_for_us" ||
		!slices.Equal(o.SealedTo, []string{"h2", "key " + stranger.Public().ID().String()}) {
		t.Fatalf("sealed to other hosts: %+v", o)
	}

	// a signature not proven: nothing is opened, even sealed to h1
	forged := s.copyOf(t, carol, "forged", s.kr.Public())
	forged.Sig[0] ^= 1
	res, err = s.d.OpenDead(forged)
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; o.Readable || o.Text != "" || o.Reason != "not_authentic" {
		t.Fatalf("a forged copy: %+v", o)
	}

	// not sealed: refused as a usage error
	plain := envelope.New(envelope.Send, ibob, carol, "plain")
	raw, _ := envelope.Encode(plain)
	_, err = s.d.OpenDead(&api.OpenDeadRequest{Raw: raw, Sig: ed25519.Sign(s.h2, raw), SignedBy: "h2"})
	faultKind(t, err, fault.KindUsage)

	// a replay of one sealed elsewhere: refused, names where to run it;
	// the dead letter is not delivered
	_, err = s.d.Replay(asReplay(other))
	faultKind(t, err, fault.KindNotReplayable)
	if fault.CodeOf(err) != fault.Refused || !strings.Contains(fault.HintOf(err), "on host h2") ||
		!strings.Contains(err.Error(), "sealed to hosts h2, key ") {
		t.Fatalf("replay of a copy sealed elsewhere: %v (exit %d, hint %q)", err, fault.CodeOf(err), fault.HintOf(err))
	}
	if got := s.r.inbox(carol); len(got) != 0 {
		t.Fatalf("carol's inbox after a refused replay: %q", got)
	}

	// a replay of one this host opens: delivered with its text
	res, err = s.d.Replay(asReplay(mine))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.r.inbox(carol); !slices.Equal(got, []string{"the brief for carol"}) {
		t.Fatalf("carol's inbox after the replay: %q", got)
	}
	if res.Sent.ReplayOf == "" || res.Sent.Gid != carol.Gid {
		t.Fatalf("replay: %+v", res.Sent)
	}

	// sealed to a key h1 rotated out with no grace and destroyed
	old := s.copyOf(t, carol, "under the old key", s.kr.Public())
	if _, err := s.kr.Rotate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kr.Destroy(); err != nil {
		t.Fatal(err)
	}
	res, err = s.d.OpenDead(old)
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; o.Readable || o.Reason != "unknown_seal_key" {
		t.Fatalf("sealed to a destroyed key: %+v", o)
	}
	_, err = s.d.Replay(asReplay(old))
	if fault.KindOf(err) != fault.KindNotReplayable || !strings.Contains(fault.HintOf(err), "purge") {
		t.Fatalf("replay of a copy sealed to a destroyed key: %v (hint %q)", err, fault.HintOf(err))
	}
}

// One of h1's own messages that died in a broker inbox is kept in h1's
// store as it was published, sealed (deaths.go): fleet-dlq reads its
// text here (OpOpenDead by msg id), and a replay opens it and goes on to
// send its text (here: no broker, so it stops there); once h1's key is
// destroyed, neither.
func TestDeadLettersSealedInStore(t *testing.T) {
	s := newSealedDLQRig(t)
	alice := s.r.entity("alice")
	env, raw := sealedSend(t, alice, ibob, "h1", "died in bob's inbox", s.h2kr.Public(), s.kr.Public())
	if err := s.r.st.RecordOutboundKeep(env, time.Now(), nil)(); err != nil {
		t.Fatal(err)
	}
	if dead, err := s.r.st.KillOutbound(env.MsgID, raw, ReasonBrokerExpired, time.Now()); err != nil || !dead {
		t.Fatalf("KillOutbound: %v %v", dead, err)
	}
	res, err := s.d.OpenDead(&api.OpenDeadRequest{MsgID: env.MsgID})
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; !o.Readable || o.Text != "died in bob's inbox" || !slices.Equal(o.SealedTo, []string{"h2", "h1"}) {
		t.Fatalf("this host's sealed dead letter: %+v", o)
	}
	_, err = s.d.OpenDead(&api.OpenDeadRequest{MsgID: envelope.NewID()})
	faultKind(t, err, fault.KindUnknownMessage)
	// opened, then sent by the normal path: no broker here
	_, err = s.d.Replay(&api.ReplayRequest{MsgID: env.MsgID})
	faultKind(t, err, fault.KindBrokerDown)

	if _, err := s.kr.Rotate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kr.Destroy(); err != nil {
		t.Fatal(err)
	}
	res, err = s.d.OpenDead(&api.OpenDeadRequest{MsgID: env.MsgID})
	if err != nil {
		t.Fatal(err)
	}
	if o := res.Opened; o.Readable || o.Reason != "unknown_seal_key" {
		t.Fatalf("after h1's key was destroyed: %+v", o)
	}
	_, err = s.d.Replay(&api.ReplayRequest{MsgID: env.MsgID})
	faultKind(t, err, fault.KindNotReplayable)
	if !strings.Contains(fault.HintOf(err), "on host h2") {
		t.Fatalf("hint %q: want the other host it is sealed to", fault.HintOf(err))
	}
}

// asReplay is the replay of the dead letter req opens.
func asReplay(req *api.OpenDeadRequest) *api.ReplayRequest {
	return &api.ReplayRequest{MsgID: req.MsgID, Raw: req.Raw, Sig: req.Sig, SignedBy: req.SignedBy}
}
