package config

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/pkg/fault"
)

// isolate clears every FLEET_* variable and points the XDG folders at
// fresh temporary ones, so the host's environment cannot leak in. It
// returns the XDG_CONFIG_HOME folder. The host id is set through the env
// because the machine's hostname may not be a valid host id.
func isolate(t *testing.T) (configHome string) {
	t.Helper()
	for _, k := range Keys {
		t.Setenv(k.Env, "") // EnvLookup treats "" as unset
	}
	t.Setenv("FLEET_CONFIG", "")
	root := t.TempDir()
	configHome = filepath.Join(root, "config")
	t.Setenv("XDG_CONFIG_HOME", configHome)
	t.Setenv("XDG_STATE_HOME", filepath.Join(root, "state"))
	t.Setenv("XDG_RUNTIME_DIR", filepath.Join(root, "run"))
	t.Setenv("HOME", filepath.Join(root, "home"))
	t.Setenv("FLEET_HOST", "testhost")
	return configHome
}

// flags returns a Lookup that plays the command-line flags in m, then
// falls back to the environment, as the CLI's lookup does.
func flags(m map[string]string) Lookup {
	return func(name, env string) (string, bool) {
		if v, ok := m[name]; ok {
			return v, true
		}
		return EnvLookup(name, env)
	}
}

func writeFile(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// defaultFile writes the config file Load finds on its own.
func defaultFile(t *testing.T, configHome, text string) string {
	t.Helper()
	return writeFile(t, filepath.Join(configHome, "fleet", "config"), text)
}

func wantUsage(t *testing.T, err error, mentions ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("got no error, want a usage error")
	}
	var fe *fault.Error
	if !errors.As(err, &fe) {
		t.Fatalf("error %v is not a *fault.Error", err)
	}
	if fe.Code != fault.Usage || fault.CodeOf(err) != 64 || fe.Kind != fault.KindUsage {
		t.Errorf("error %v: code %d kind %q, want 64 usage", err, fe.Code, fe.Kind)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
}

func TestDefaults(t *testing.T) {
	configHome := isolate(t)
	c, err := Load(flags(nil), "")
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(filepath.Dir(configHome), "state", "fleet")
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"Host", c.Host, "testhost"},
		{"StateDir", c.StateDir, state},
		{"Socket", c.Socket, filepath.Join(filepath.Dir(configHome), "run", "fleet", "gw.sock")},
		{"File", c.File, ""},
		{"MaxBody", c.MaxBody, 1 << 20},
		{"DeliveryAttempts", c.DeliveryAttempts, 5},
		{"RetryBase", c.RetryBase, time.Second},
		{"RetryMax", c.RetryMax, time.Minute},
		{"NudgeAfter", c.NudgeAfter, 30 * time.Second},
		{"NudgeMax", c.NudgeMax, 30 * time.Minute},
		{"SettleDelay", c.SettleDelay, 150 * time.Millisecond},
		{"ExecTimeout", c.ExecTimeout, 30 * time.Second},
		{"DedupWindow", c.DedupWindow, 168 * time.Hour},
		{"DeadRetention", c.DeadRetention, 720 * time.Hour},
		{"DrainTimeout", c.DrainTimeout, 10 * time.Second},
		{"Uncertain", c.Uncertain, "hold"},
	} {
		if f.got != f.want {
			t.Errorf("default %s = %v, want %v", f.name, f.got, f.want)
		}
	}
}

func TestPrecedence(t *testing.T) {
	type layers struct{ file, env, flag string }
	cases := []struct {
		key    string
		get    func(*Config) any
		values layers
		parsed [4]any // default, +file, +env, +flag
	}{
		{"retry-base", func(c *Config) any { return c.RetryBase },
			layers{"2s", "3s", "4s"}, [4]any{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second}},
		{"max-body", func(c *Config) any { return c.MaxBody },
			layers{"2000", "3000", "4000"}, [4]any{1 << 20, 2000, 3000, 4000}},
		{"uncertain", func(c *Config) any { return c.Uncertain },
			layers{"reinject", "hold", "reinject"}, [4]any{"hold", "reinject", "hold", "reinject"}},
		{"socket", func(c *Config) any { return c.Socket },
			layers{"/file.sock", "/env.sock", "/flag.sock"}, [4]any{nil, "/file.sock", "/env.sock", "/flag.sock"}},
		{"host", func(c *Config) any { return c.Host },
			layers{"filehost", "envhost", "flaghost"}, [4]any{"testhost", "filehost", "envhost", "flaghost"}},
	}
	env := map[string]string{}
	for _, k := range Keys {
		env[k.Name] = k.Env
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			for depth := range 4 {
				configHome := isolate(t)
				if tc.key == "host" {
					if depth == 0 {
						continue // the default is this machine's hostname
					}
					t.Setenv("FLEET_HOST", "")
				}
				defaultFile(t, configHome, "# nothing\n")
				fl := map[string]string{}
				if depth >= 1 {
					defaultFile(t, configHome, tc.key+" = "+tc.values.file+"\n")
				}
				if depth >= 2 {
					t.Setenv(env[tc.key], tc.values.env)
				}
				if depth >= 3 {
					fl[tc.key] = tc.values.flag
				}
				c, err := Load(flags(fl), "")
				if err != nil {
					t.Fatalf("depth %d: %v", depth, err)
				}
				if want := tc.parsed[depth]; want != nil && tc.get(c) != want {
					t.Errorf("depth %d (default/file/env/flag): %s = %v, want %v", depth, tc.key, tc.get(c), want)
				}
			}
		})
	}
}

func TestPrecedenceIsPerKey(t *testing.T) {
	configHome := isolate(t)
	path := defaultFile(t, configHome, "retry-base = 2s\nretry-max = 2m\nnudge-after = 2h\n")
	t.Setenv("FLEET_RETRY_MAX", "3m")
	t.Setenv("FLEET_NUDGE_AFTER", "3h")
	c, err := Load(flags(map[string]string{"nudge-after": "4h"}), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.RetryBase != 2*time.Second || c.RetryMax != 3*time.Minute || c.NudgeAfter != 4*time.Hour || c.NudgeMax != 30*time.Minute {
		t.Errorf("got base %v max %v nudge %v nudge-max %v", c.RetryBase, c.RetryMax, c.NudgeAfter, c.NudgeMax)
	}
	if c.File != path {
		t.Errorf("File = %q, want %q", c.File, path)
	}
}

func TestNilLookupReadsEnv(t *testing.T) {
	isolate(t)
	t.Setenv("FLEET_DELIVERY_ATTEMPTS", "9")
	c, err := Load(nil, "")
	if err != nil || c.DeliveryAttempts != 9 {
		t.Fatalf("Load(nil) = %+v, %v", c, err)
	}
}

func TestFileSyntax(t *testing.T) {
	isolate(t)
	path := writeFile(t, filepath.Join(t.TempDir(), "fleet.conf"), `
# a comment

   state-dir   =   /var/lib/fleet
socket = "/run/with space.sock"
broker = amqp://localhost
exec-timeout=1m30s
`)
	c, err := Load(flags(nil), path)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != "/var/lib/fleet" || c.Socket != "/run/with space.sock" || c.ExecTimeout != 90*time.Second || c.File != path {
		t.Errorf("got %+v", c)
	}
}

func TestFileErrors(t *testing.T) {
	cases := map[string]struct{ text, mention string }{
		"unknown key":  {"retry-base = 1s\nretry-bsae = 2s\n", `"retry-bsae"`},
		"env name":     {"FLEET_HOST = x\n", `"FLEET_HOST"`},
		"no equals":    {"state-dir /tmp\n", ":1:"},
		"bad duration": {"drain-timeout = forever\n", "drain-timeout"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			configHome := isolate(t)
			// Both as the default file and as an explicit one.
			p := defaultFile(t, configHome, tc.text)
			_, err := Load(flags(nil), "")
			wantUsage(t, err, tc.mention)
			_, err = Load(flags(nil), p)
			wantUsage(t, err, tc.mention)
		})
	}
	t.Run("line number", func(t *testing.T) {
		isolate(t)
		p := writeFile(t, filepath.Join(t.TempDir(), "c"), "# one\nhost = a\n\nbogus = 1\n")
		_, err := Load(flags(nil), p)
		wantUsage(t, err, p+":4:", `"bogus"`)
	})
}

func TestMalformedValuesAreUsageErrors(t *testing.T) {
	cases := []struct{ key, value string }{
		{"max-body", "ten"},
		{"max-body", "0"},
		{"max-body", "-5"},
		{"max-body", "1.5"},
		{"delivery-attempts", "many"},
		{"retry-base", "5"}, // no unit
		{"retry-max", "soon"},
		{"settle-delay", "-1s"},
		{"dedup-window", "7d"},
		{"dead-retention", "30d"},
		{"dead-retention", "0"},
		{"dead-retention", "0s"},
		{"dead-retention", "-1h"},
		{"uncertain", "maybe"},
		{"host", "a.b"},
		{"host", "has space"},
		{"host", "x@y"},
		{"inbox-queue-type", "stream"},
		{"broker", "http://broker/"},
		{"broker", "amqp://a/,http://b/"},
		{"broker", ","},
	}
	env := map[string]string{}
	for _, k := range Keys {
		env[k.Name] = k.Env
	}
	for _, tc := range cases {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			for _, layer := range []string{"flag", "env", "file"} {
				configHome := isolate(t)
				if tc.key == "host" {
					t.Setenv("FLEET_HOST", "")
				}
				fl := map[string]string{}
				switch layer {
				case "flag":
					fl[tc.key] = tc.value
				case "env":
					t.Setenv(env[tc.key], tc.value)
				case "file":
					defaultFile(t, configHome, tc.key+" = "+tc.value+"\n")
				}
				c, err := Load(flags(fl), "")
				if err == nil {
					t.Fatalf("%s %s=%q accepted: %+v", layer, tc.key, tc.value, c)
				}
				if c != nil {
					t.Errorf("a config came back with the error")
				}
				wantUsage(t, err, tc.key)
			}
		})
	}
}

// A cluster: several node URIs in one setting.
func TestBrokerNodes(t *testing.T) {
	isolate(t)
	c, err := Load(flags(map[string]string{"broker": "amqps://n1:5671/f, amqps://n2:5671/f", "inbox-queue-type": "quorum"}), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.InboxQueueType != "quorum" || !strings.Contains(c.Broker, "n2") {
		t.Fatalf("%+v", c)
	}
}

func TestEveryBadValueIsReported(t *testing.T) {
	isolate(t)
	_, err := Load(flags(map[string]string{"max-body": "x", "retry-base": "y", "uncertain": "z"}), "")
	wantUsage(t, err, "max-body", "retry-base", "uncertain")
}

func TestZeroDurationIsAllowed(t *testing.T) {
	isolate(t)
	c, err := Load(flags(map[string]string{"settle-delay": "0s"}), "")
	if err != nil || c.SettleDelay != 0 {
		t.Fatalf("settle-delay 0s: %+v, %v", c, err)
	}
}

func TestConfigFileLocation(t *testing.T) {
	t.Run("missing default is fine", func(t *testing.T) {
		isolate(t)
		c, err := Load(flags(nil), "")
		if err != nil {
			t.Fatal(err)
		}
		if c.File != "" {
			t.Errorf("File = %q, want empty", c.File)
		}
	})
	t.Run("missing explicit path is an error", func(t *testing.T) {
		isolate(t)
		missing := filepath.Join(t.TempDir(), "nope.conf")
		_, err := Load(flags(nil), missing)
		wantUsage(t, err, missing)
	})
	t.Run("missing FLEET_CONFIG is an error", func(t *testing.T) {
		isolate(t)
		missing := filepath.Join(t.TempDir(), "nope.conf")
		t.Setenv("FLEET_CONFIG", missing)
		_, err := Load(flags(nil), "")
		wantUsage(t, err, missing)
	})
	t.Run("FLEET_CONFIG is read", func(t *testing.T) {
		configHome := isolate(t)
		defaultFile(t, configHome, "retry-base = 2s\n")
		p := writeFile(t, filepath.Join(t.TempDir(), "env.conf"), "retry-base = 5s\n")
		t.Setenv("FLEET_CONFIG", p)
		c, err := Load(flags(nil), "")
		if err != nil || c.RetryBase != 5*time.Second || c.File != p {
			t.Fatalf("got %+v, %v", c, err)
		}
	})
	t.Run("explicit path beats FLEET_CONFIG and the default", func(t *testing.T) {
		configHome := isolate(t)
		defaultFile(t, configHome, "retry-base = 2s\n")
		t.Setenv("FLEET_CONFIG", writeFile(t, filepath.Join(t.TempDir(), "env.conf"), "retry-base = 5s\n"))
		p := writeFile(t, filepath.Join(t.TempDir(), "flag.conf"), "retry-base = 7s\n")
		c, err := Load(flags(nil), p)
		if err != nil || c.RetryBase != 7*time.Second || c.File != p {
			t.Fatalf("got %+v, %v", c, err)
		}
	})
	t.Run("unreadable default is an error", func(t *testing.T) {
		configHome := isolate(t)
		// A folder where the file should be: it exists, but cannot be read as one.
		if err := os.MkdirAll(filepath.Join(configHome, "fleet", "config"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := Load(flags(nil), "")
		wantUsage(t, err)
	})
}

func TestDefaultSocket(t *testing.T) {
	t.Run("runtime dir", func(t *testing.T) {
		isolate(t)
		run := t.TempDir()
		t.Setenv("XDG_RUNTIME_DIR", run)
		c, err := Load(flags(nil), "")
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(run, "fleet", "gw.sock"); c.Socket != want {
			t.Errorf("Socket = %q, want %q", c.Socket, want)
		}
	})
	t.Run("state dir without runtime dir", func(t *testing.T) {
		isolate(t)
		t.Setenv("XDG_RUNTIME_DIR", "")
		state := t.TempDir()
		t.Setenv("XDG_STATE_HOME", state)
		c, err := Load(flags(nil), "")
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(state, "fleet"); c.StateDir != want {
			t.Errorf("StateDir = %q, want %q", c.StateDir, want)
		}
		if want := filepath.Join(state, "fleet", "gw.sock"); c.Socket != want {
			t.Errorf("Socket = %q, want %q", c.Socket, want)
		}
	})
	t.Run("follows a configured state dir", func(t *testing.T) {
		isolate(t)
		t.Setenv("XDG_RUNTIME_DIR", "")
		c, err := Load(flags(map[string]string{"state-dir": "/srv/fleet"}), "")
		if err != nil {
			t.Fatal(err)
		}
		if c.Socket != "/srv/fleet/gw.sock" {
			t.Errorf("Socket = %q, want /srv/fleet/gw.sock", c.Socket)
		}
	})
	t.Run("home without XDG_STATE_HOME", func(t *testing.T) {
		isolate(t)
		t.Setenv("XDG_RUNTIME_DIR", "")
		t.Setenv("XDG_STATE_HOME", "")
		home := t.TempDir()
		t.Setenv("HOME", home)
		c, err := Load(flags(nil), "")
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(home, ".local", "state", "fleet", "gw.sock"); c.Socket != want {
			t.Errorf("Socket = %q, want %q", c.Socket, want)
		}
	})
}

func TestKeysTable(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Keys {
		if seen[k.Name] || k.Name == "" || k.Usage == "" || k.Default == "" {
			t.Errorf("bad or duplicate key %+v", k)
		}
		seen[k.Name] = true
		if want := "FLEET_" + strings.ToUpper(strings.ReplaceAll(k.Name, "-", "_")); k.Env != want {
			t.Errorf("key %s: env %s, want %s", k.Name, k.Env, want)
		}
	}
	// Every key is accepted in the file.
	configHome := isolate(t)
	var text strings.Builder
	for _, k := range Keys {
		text.WriteString(k.Name + " = ")
		_, durErr := time.ParseDuration(k.Default)
		_, numErr := strconv.Atoi(k.Default)
		switch {
		case k.Name == "host":
			text.WriteString("filehost")
		case k.Name == "uncertain":
			text.WriteString("reinject")
		case k.Name == "inbox-queue-type":
			text.WriteString("quorum")
		case k.Name == "drain-timeout":
			text.WriteString("2s")
		case k.Name == "broker":
			text.WriteString("amqp://localhost")
		case k.Name == "presence-ttl":
			text.WriteString("15s")
		case k.Name == "plaintext-hosts":
			text.WriteString("old1,old2")
		case k.Name == "seal-fallback":
			text.WriteString("clear")
		case k.Name == "accept-default":
			text.WriteString("@h2/SEND group:ops")
		case durErr == nil || numErr == nil:
			text.WriteString(k.Default) // a valid value, whatever the key
		default:
			text.WriteString("/tmp/x")
		}
		text.WriteString("\n")
	}
	defaultFile(t, configHome, text.String())
	t.Setenv("FLEET_HOST", "")
	c, err := Load(flags(nil), "")
	if err != nil {
		t.Fatalf("a file setting every key was refused: %v", err)
	}
	if c.Host != "filehost" || c.DrainTimeout != 2*time.Second || c.StateDir != "/tmp/x" || c.Uncertain != "reinject" ||
		len(c.AcceptDefault) != 2 || c.AcceptDefault[1].Group != "ops" {
		t.Errorf("got %+v", c)
	}
}

func TestDeadRetention(t *testing.T) {
	isolate(t)
	t.Setenv("FLEET_DEAD_RETENTION", "48h")
	c, err := Load(flags(nil), "")
	if err != nil || c.DeadRetention != 48*time.Hour {
		t.Fatalf("FLEET_DEAD_RETENTION=48h: %+v, %v", c, err)
	}
	// shorter than the dedup window is fine: the store keeps the msg id's
	// record for the dedup window and drops only the dead letter
	c, err = Load(flags(map[string]string{"dead-retention": "1h", "dedup-window": "168h"}), "")
	if err != nil || c.DeadRetention != time.Hour {
		t.Fatalf("dead-retention 1h under a 168h dedup window: %+v, %v", c, err)
	}
}

// The socket a gateway recorded is believed only from a private regular
// file of this user, naming a socket of this user.
func TestRecordedSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "gw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rec := SocketRecord(dir)
	write := func(data string, mode os.FileMode) {
		t.Helper()
		os.Remove(rec)
		if err := os.WriteFile(rec, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(rec, mode)
	}
	write(sock+"\n", 0o600)
	if got := RecordedSocket(dir); got != sock {
		t.Errorf("a private record: %q, want %q", got, sock)
	}
	write(sock+"\n", 0o666)
	if got := RecordedSocket(dir); got != "" {
		t.Errorf("a record others may write was believed: %q", got)
	}
	write(filepath.Join(dir, "config")+"\n", 0o600)
	os.WriteFile(filepath.Join(dir, "config"), nil, 0o600)
	if got := RecordedSocket(dir); got != "" {
		t.Errorf("a record naming a file that is not a socket was believed: %q", got)
	}
	os.Remove(rec)
	other := filepath.Join(dir, "elsewhere")
	os.WriteFile(other, []byte(sock+"\n"), 0o600)
	if err := os.Symlink(other, rec); err != nil {
		t.Fatal(err)
	}
	if got := RecordedSocket(dir); got != "" {
		t.Errorf("a symlinked record was believed: %q", got)
	}
}

// A config file holding the broker password is refused while its group or
// others may read or write it, with the file and the fix named; without a
// password, or at 0600, it is read.
func TestConfigWithPasswordMustBePrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config")
	for _, c := range []struct {
		text   string
		mode   os.FileMode
		refuse bool
	}{
		{"broker = amqp://gw:s3cret@broker/fleet\n", 0o644, true},
		{"broker = amqps://n1/fleet, amqp://gw:s3cret@n2/fleet\n", 0o640, true},
		{"broker = amqp://gw:s3cret@broker/fleet\n", 0o602, true},
		{"broker = amqp://gw:s3cret@broker/fleet\n", 0o600, false},
		{"broker = amqp://gw@broker/fleet\nbroker-key = /etc/fleet/client.key\n", 0o644, false},
		{"broker = amqp://gw@broker/fleet\nbroker-key = /etc/fleet/client.key\n", 0o664, true},
	} {
		if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadClient(func(string, string) (string, bool) { return "", false }, path)
		if !c.refuse {
			if err != nil {
				t.Errorf("%q mode %v: %v", c.text, c.mode, err)
			}
			continue
		}
		if !HasPassword(c.text) {
			if fault.CodeOf(err) != fault.Refused || !strings.Contains(err.Error(), "may be written by others") || fault.HintOf(err) != "chmod go-w "+path {
				t.Errorf("%q mode %v: err = %v (hint %q), want a refusal naming chmod go-w", c.text, c.mode, err, fault.HintOf(err))
			}
			continue
		}
		if fault.CodeOf(err) != fault.Refused || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "holding the broker password") || fault.HintOf(err) != "chmod 600 "+path {
			t.Errorf("%q mode %v: err = %v (hint %q), want a refusal naming %s and chmod 600", c.text, c.mode, err, fault.HintOf(err), path)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the refusal shows the password: %v", err)
		}
	}
}

// plaintext-hosts names hosts by id, separated by commas; none by
// default, and a name outside the host grammar is refused.
func TestPlaintextHosts(t *testing.T) {
	isolate(t)
	c, err := Load(flags(nil), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.PlaintextHosts) != 0 {
		t.Fatalf("plaintext hosts by default: %v", c.PlaintextHosts)
	}
	c, err = Load(flags(map[string]string{"plaintext-hosts": "h1, old-2,h1"}), "")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.PlaintextHosts, " ") != "h1 old-2" {
		t.Fatalf("plaintext hosts %v", c.PlaintextHosts)
	}
	_, err = Load(flags(map[string]string{"plaintext-hosts": "h1,a.b"}), "")
	wantUsage(t, err, "plaintext-hosts", `"a.b"`)
}

// seal-fallback is refuse by default, or clear; anything else is one
// usage error that names the choices.
func TestSealFallback(t *testing.T) {
	isolate(t)
	c, err := Load(flags(nil), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.SealFallback != "refuse" {
		t.Fatalf("seal-fallback by default: %q", c.SealFallback)
	}
	c, err = Load(flags(map[string]string{"seal-fallback": "clear"}), "")
	if err != nil || c.SealFallback != "clear" {
		t.Fatalf("seal-fallback clear: %v %q", err, c.SealFallback)
	}
	_, err = Load(flags(map[string]string{"seal-fallback": "maybe"}), "")
	wantUsage(t, err, "seal-fallback", `"maybe"`, "refuse or clear")
	if h := fault.HintOf(err); !strings.Contains(h, "seal-fallback = clear") {
		t.Errorf("hint %q does not say the choice", h)
	}
}

// A bad accept-default is refused with the pattern and a hint.
func TestAcceptDefaultBad(t *testing.T) {
	configHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", configHome)
	t.Setenv("FLEET_ACCEPT_DEFAULT", "bob@h2 group:")
	_, err := Load(flags(nil), "")
	if err == nil || !strings.Contains(err.Error(), `accept-default: accept pattern "group:"`) || !strings.Contains(err.Error(), "hint") {
		t.Fatalf("err = %v", err)
	}
}
