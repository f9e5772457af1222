package hooks

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/fleetd/fleet/pkg/private"
)

// Codex runs a user or project hook only once the user trusted it (its
// /hooks review). The trust is kept in the user's config.toml, a table per
// hook handler (docs/agent-clis/codex.md, as Codex 0.169 writes it):
//
//	[hooks.state."HOOKS_JSON:EVENT_LABEL:GROUP:HANDLER"]
//	trusted_hash = "sha256:HEX"
//
// EVENT_LABEL is the event in snake_case; HEX the sha256 of the handler's
// identity as canonical JSON (keys sorted, no spaces, no HTML escaping,
// absent fields left out; the timeout as Codex runs it: 600 when unset, at
// least 1, Interrupt's at most 3). A changed hook no longer matches and
// goes back to review.

type codexEntry struct{ key, hash string }

func codexLabel(event string) string {
	var b strings.Builder
	for i, c := range event {
		if unicode.IsUpper(c) {
			if i > 0 {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

// codexEntries are the trust entries of fleet's hooks (fleet-turn and
// fleet-recv --hook) in the hooks.json at path, by their place in it.
func codexEntries(path string) ([]codexEntry, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Hooks map[string][]struct {
			Matcher *string `json:"matcher"`
			Hooks   []struct {
				Type          string  `json:"type"`
				Command       string  `json:"command"`
				Timeout       *uint64 `json:"timeout"`
				Async         bool    `json:"async"`
				StatusMessage *string `json:"statusMessage"`
			} `json:"hooks"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	events := make([]string, 0, len(f.Hooks))
	for e := range f.Hooks {
		events = append(events, e)
	}
	sort.Strings(events)
	var out []codexEntry
	for _, event := range events {
		label := codexLabel(event)
		for gi, g := range f.Hooks[event] {
			for hi, h := range g.Hooks {
				if !ours(h.Command) {
					continue
				}
				timeout := uint64(600)
				if h.Timeout != nil {
					timeout = max(*h.Timeout, 1)
				}
				if event == "Interrupt" {
					timeout = min(timeout, 3)
				}
				handler := map[string]any{"type": h.Type, "command": h.Command, "timeout": timeout, "async": h.Async}
				if h.StatusMessage != nil {
					handler["statusMessage"] = *h.StatusMessage
				}
				id := map[string]any{"event_name": label, "hooks": []any{handler}}
				if g.Matcher != nil {
					id["matcher"] = *g.Matcher
				}
				var js bytes.Buffer
				enc := json.NewEncoder(&js)
				enc.SetEscapeHTML(false) // as serde_json writes it
				if err := enc.Encode(id); err != nil {
					return nil, err
				}
				sum := sha256.Sum256(bytes.TrimRight(js.Bytes(), "\n"))
				out = append(out, codexEntry{
					key:  fmt.Sprintf("%s:%s:%d:%d", abs, label, gi, hi),
					hash: "sha256:" + hex.EncodeToString(sum[:]),
				})
			}
		}
	}
	return out, nil
}

// CodexTrustTOML is the config.toml text that trusts fleet's hooks in
// the hooks.json at path.
func CodexTrustTOML(path string) (string, error) {
	entries, err := codexEntries(path)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range entries {
		key, err := tomlString(e.key)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n[hooks.state.%s]\ntrusted_hash = %q\n", key, e.hash)
	}
	return b.String(), nil
}

// tomlString is s as a TOML basic string; a control character in it (in
// a path) is refused rather than escaped the way Go escapes it.
func tomlString(s string) (string, error) {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "", fmt.Errorf("%q: a control character in a path", s)
		}
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`, nil
}

// codexTrusted reads which keys config.toml trusts with which hash.
func codexTrusted(home string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(codexHome(home), "config.toml"))
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	key := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if k, ok := strings.CutPrefix(line, "[hooks.state."); ok && strings.HasSuffix(k, "]") {
			key, _ = strconv.Unquote(strings.TrimSuffix(k, "]"))
			continue
		}
		if strings.HasPrefix(line, "[") {
			key = ""
			continue
		}
		if v, ok := strings.CutPrefix(line, "trusted_hash"); ok && key != "" {
			v = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), "="))
			out[key], _ = strconv.Unquote(v)
		}
	}
	return out, nil
}

// codexUntrusted counts fleet's hooks in the hooks.json at path that
// Codex's config.toml does not trust as they are.
func codexUntrusted(home, path string) (int, error) {
	entries, err := codexEntries(path)
	if err != nil {
		return 0, err
	}
	trusted, err := codexTrusted(home)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		if trusted[e.key] != e.hash {
			n++
		}
	}
	return n, nil
}

// CodexTrust records in Codex's config.toml that fleet's hooks in
// the hooks.json at path are trusted, as Codex's own /hooks review does
// ("Trust all"): what the user says by asking for it. Entries of these
// keys written before are replaced; nothing else in the file changes.
func CodexTrust(home, path string) error {
	entries, err := codexEntries(path)
	if err != nil {
		return err
	}
	cfg := filepath.Join(codexHome(home), "config.toml")
	b, err := os.ReadFile(cfg)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	drop := map[string]bool{}
	for _, e := range entries {
		drop[e.key] = true
	}
	var kept []string
	skip := false
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		t := strings.TrimSpace(line)
		if k, ok := strings.CutPrefix(t, "[hooks.state."); ok && strings.HasSuffix(k, "]") {
			key, _ := strconv.Unquote(strings.TrimSuffix(k, "]"))
			skip = drop[key]
		} else if strings.HasPrefix(t, "[") {
			skip = false
		}
		if !skip {
			kept = append(kept, line)
		}
	}
	text := strings.TrimRight(strings.Join(kept, "\n"), "\n")
	add, err := CodexTrustTOML(path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		return err
	}
	return private.WriteFile(cfg, []byte(strings.TrimLeft(text+"\n"+add, "\n")), 0o600)
}
