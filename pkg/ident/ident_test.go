package ident

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetd/fleet/pkg/fault"
)

func wantRefused(t *testing.T, err error, kind fault.Kind) *fault.Error {
	t.Helper()
	if err == nil {
		t.Fatal("got no error, want a refusal")
	}
	var fe *fault.Error
	if !errors.As(err, &fe) {
		t.Fatalf("error %v is not a *fault.Error", err)
	}
	if fe.Code != fault.Refused || fault.CodeOf(err) != 77 {
		t.Errorf("error %v: code %d, want 77", err, fe.Code)
	}
	if fe.Kind != kind {
		t.Errorf("error %v: kind %q, want %q", err, fe.Kind, kind)
	}
	return fe
}

func TestIssueParseCheck(t *testing.T) {
	const gid = "h1.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10"
	token, hash := Issue(gid)
	if !strings.HasPrefix(token, "fleet1."+gid+".") {
		t.Fatalf("token %q does not start with fleet1.<gid>.", token)
	}
	g, secret, err := Parse(token)
	if err != nil {
		t.Fatal(err)
	}
	if g != gid {
		t.Errorf("gid = %q, want %q", g, gid)
	}
	if len(secret) != 64 {
		t.Errorf("secret %q is %d characters, want 64 hex", secret, len(secret))
	}
	if hash != Hash(secret) || strings.Contains(hash, secret) {
		t.Errorf("hash %q is not the stored form of the secret", hash)
	}
	if !Check(secret, hash) {
		t.Error("Check refused the issued secret")
	}

	// Surrounding whitespace, as read from a file or an env var, is fine.
	if g2, s2, err := Parse("  " + token + "\n"); err != nil || g2 != gid || s2 != secret {
		t.Errorf("Parse with whitespace = %q, %q, %v", g2, s2, err)
	}

	token2, hash2 := Issue(gid)
	if token2 == token || hash2 == hash {
		t.Error("two Issue calls gave the same credential")
	}
	_, secret2, _ := Parse(token2)
	for name, bad := range map[string]string{
		"other credential's secret": secret2,
		"altered last character":    secret[:63] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", secret[63])+1)%16]),
		"truncated":                 secret[:63],
		"extended":                  secret + "0",
		"empty":                     "",
		"the hash itself":           hash,
	} {
		if Check(bad, hash) {
			t.Errorf("Check accepted %s", name)
		}
	}
	if Check(secret, "") || Check(secret, hash2) {
		t.Error("Check accepted a secret against the wrong hash")
	}
}

func TestParseRefusesMalformed(t *testing.T) {
	for _, tok := range []string{
		"", "   ", "fleet1.", "fleet1.gid", "fleet1..secret", "fleet1.gid.",
		"fleet2.gid.secret", "FLEET1.gid.secret", "Bearer abc", "gid.secret",
	} {
		_, _, err := Parse(tok)
		wantRefused(t, err, fault.KindBadCredential)
	}
	// A gid holds one dot (host.uuid), a secret none: the last dot splits,
	// and what is before it must be a gid.
	const gid = "h1.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10"
	if g, s, err := Parse("fleet1." + gid + ".abc"); err != nil || g != gid || s != "abc" {
		t.Errorf("Parse = %q, %q, %v", g, s, err)
	}
	for _, tok := range []string{"fleet1.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10.abc", "fleet1." + gid + ".", "fleet1.h1.gid.abc"} {
		_, _, err := Parse(tok)
		wantRefused(t, err, fault.KindBadCredential)
	}
}

func TestGid(t *testing.T) {
	g := NewGid("h-1_x")
	if !IsGid(g) || GidHost(g) != "h-1_x" {
		t.Fatalf("NewGid = %q: IsGid %v, host %q", g, IsGid(g), GidHost(g))
	}
	for _, s := range []string{
		"", "0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10", // no host: the form before hosts were in gids
		"h1.0B5C1C8E-6D2F-4F7A-9A51-2C9A3C1D7E10", // upper case: one spelling only
		"h1.h2.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10", ".0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10",
		"-h.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10", "h1.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e1",
		"h#.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10", "h1.0b5c1c8e-6d2f-4f7a-9a51-2c9a3c1d7e10\n",
	} {
		if IsGid(s) || GidHost(s) != "" {
			t.Errorf("IsGid(%q) = true", s)
		}
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	token, _ := Issue("gid-bob")
	path, err := Save(dir, "bob", token)
	if err != nil {
		t.Fatal(err)
	}
	if path != File(dir, "bob") || path != filepath.Join(dir, "credentials", "bob.token") {
		t.Errorf("Save wrote %s", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credential file mode %v, want 0600", fi.Mode().Perm())
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm()&0o077 != 0 {
		t.Errorf("credentials folder mode %v, want owner-only", di.Mode().Perm())
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left behind: %v", err)
	}
	got, err := Load(dir, "bob")
	if err != nil || got != token {
		t.Fatalf("Load = %q, %v; want %q", got, err, token)
	}
	Remove(dir, "bob")
	_, err = Load(dir, "bob")
	wantRefused(t, err, fault.KindNoCredential)
}

func TestLoadReadsOwnerOnlyFile(t *testing.T) {
	dir := t.TempDir()
	path := File(dir, "alice")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("\n  fleet1.gid-a.s3cret \n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil { // whatever the umask
		t.Fatal(err)
	}
	got, err := Load(dir, "alice")
	if err != nil || got != "fleet1.gid-a.s3cret" {
		t.Fatalf("Load = %q, %v", got, err)
	}
	// A read-only owner file is owner-only too.
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, "alice"); err != nil {
		t.Errorf("mode 0400 refused: %v", err)
	}
}

func TestLoadRefusesReadableByOthers(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o606, 0o777} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			token, _ := Issue("gid-bob")
			path, err := Save(dir, "bob", token)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
			got, err := Load(dir, "bob")
			if got != "" {
				t.Errorf("Load returned the credential %q with the error", got)
			}
			fe := wantRefused(t, err, fault.KindBadCredential)
			if !strings.Contains(fe.Hint, "chmod 600 "+path) {
				t.Errorf("hint %q does not say how to fix it", fe.Hint)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	dir := t.TempDir()
	got, err := Load(dir, "carol")
	fe := wantRefused(t, err, fault.KindNoCredential)
	if got != "" {
		t.Errorf("got %q", got)
	}
	if !strings.Contains(fe.Hint, "fleet-roster join carol") {
		t.Errorf("hint %q does not name the command to run", fe.Hint)
	}
	if !strings.Contains(err.Error(), `"carol"`) {
		t.Errorf("error %q does not name the entity", err)
	}
}

func TestDescribeHidesSecret(t *testing.T) {
	gid := NewGid("h1")
	token, _ := Issue(gid)
	_, secret, err := Parse(token)
	if err != nil || secret == "" {
		t.Fatalf("Parse(%q): %q, %v", token, secret, err)
	}
	d := Describe(token)
	if strings.Contains(d, secret) || !strings.HasPrefix(d, gid) {
		t.Errorf("Describe = %q", d)
	}
	if Describe("nonsense") != "invalid" {
		t.Errorf("Describe(nonsense) = %q", Describe("nonsense"))
	}
}

func TestValidName(t *testing.T) {
	for _, name := range []string{"a", "bob", "Worker1", "ci-runner_2", "x" + strings.Repeat("y", 63)} {
		if !ValidName(name) || CheckName(name) != nil {
			t.Errorf("%q refused", name)
		}
	}
	for _, name := range []string{
		"", "1bob", "-bob", "_bob", "bob.token", "../../x", "../bob", "a/b", "/etc/passwd", "bob ",
		" bob", "bob\n", "bo b", "bob@h1", "é", "x" + strings.Repeat("y", 64), ".", "..",
	} {
		if ValidName(name) {
			t.Errorf("%q accepted", name)
		}
		err := CheckName(name)
		if fault.CodeOf(err) != fault.Usage || !strings.Contains(err.Error(), "is not a valid name") {
			t.Errorf("CheckName(%q) = %v (code %d), want a usage error", name, err, fault.CodeOf(err))
		}
	}
}

// TestLoadRefusesPathNames: Load takes a name, never a path — not even to
// a file that exists, is owner-only and holds a credential.
func TestLoadRefusesPathNames(t *testing.T) {
	root := t.TempDir()
	stateDir := filepath.Join(root, "state")
	token, _ := Issue("gid-x")
	if _, err := Save(stateDir, "bob", token); err != nil {
		t.Fatal(err)
	}
	// what "../../x" would reach from STATE_DIR/credentials
	if err := os.WriteFile(filepath.Join(root, "x.token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"../../x", "../credentials/bob", "bob/../bob", filepath.Join(root, "x")} {
		got, err := Load(stateDir, name)
		if got != "" {
			t.Errorf("Load(%q) read the credential %q", name, got)
		}
		if fault.CodeOf(err) != fault.Usage || fault.KindOf(err) != fault.KindUsage {
			t.Errorf("Load(%q) = %v (code %d), want a usage error (64)", name, err, fault.CodeOf(err))
		}
	}
	if got, err := Load(stateDir, "bob"); err != nil || got != token {
		t.Errorf("Load(bob) = %q, %v", got, err)
	}
}
