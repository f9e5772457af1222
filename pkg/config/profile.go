package config

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Profile is how this gateway starts an entity for `fleet-spawn --profile
// NAME`. Profiles live only in the gateway's config file, as
// profile.NAME.KEY = VALUE lines:
//
//	profile.NAME.command   the command, run with sh -c (required); the entity's
//	                       name is $0, fleet-spawn's ARGS are "$@"
//	profile.NAME.launcher  tmux (default) or exec
//	profile.NAME.mode      inject or pull; default inject for tmux, pull for exec
//	profile.NAME.session   tmux: the session new windows open in (default fleet)
//	profile.NAME.dir       the command's working folder (default the gateway's)
//	profile.NAME.deliver   exec + inject: the command each message is handed to
//	                       (as fleet-roster join --exec)
//	profile.NAME.grace     a command that dies within this is a launch failure
//	                       (default 500ms; 0 checks nothing)
//	profile.NAME.program, .turns, .paste, .header, .idle-screen
//	                       tmux + inject: the agent in the pane, as
//	                       fleet-roster join's options of the same names
type Profile struct {
	Name     string
	Launcher string
	Command  string
	Mode     string
	Session  string
	Dir      string
	Deliver  string
	Nudge    string // pull: the entity's nudge hook (fleet-roster join --nudge)
	Grace    time.Duration
	// tmux + inject: the agent in the pane (fleet-roster join --program ...)
	Program, Turns, Paste, Header string
	IdleScreen                    time.Duration
}

// ProfileFields are the keys a profile takes.
var ProfileFields = []string{"command", "launcher", "mode", "session", "dir", "deliver", "nudge", "grace",
	"program", "turns", "paste", "header", "idle-screen"}

// profileName is compiled on first use: every short command loads the
// config, and an eager regexp is paid on each start.
var profileName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`) })

// IsProfileKey reports whether key is a profile.NAME.FIELD key with a known
// field and a valid name.
func IsProfileKey(key string) bool {
	name, field, ok := splitProfileKey(key)
	if !ok || !profileName().MatchString(name) {
		return false
	}
	for _, f := range ProfileFields {
		if f == field {
			return true
		}
	}
	return false
}

func splitProfileKey(key string) (name, field string, ok bool) {
	rest, ok := strings.CutPrefix(key, "profile.")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// profiles builds the profiles from the profile.* keys of a config file.
func profiles(file map[string]string) (map[string]*Profile, []error) {
	out := map[string]*Profile{}
	var errs []error
	keys := make([]string, 0, len(file))
	for k := range file {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !strings.HasPrefix(k, "profile.") {
			continue
		}
		name, field, _ := splitProfileKey(k)
		if !IsProfileKey(k) {
			errs = append(errs, fmt.Errorf("%s: not a profile setting (profile.NAME.{%s})", k, strings.Join(ProfileFields, ",")))
			continue
		}
		p := out[name]
		if p == nil {
			p = &Profile{Name: name, Grace: 500 * time.Millisecond}
			out[name] = p
		}
		v := file[k]
		switch field {
		case "command":
			p.Command = v
		case "launcher":
			p.Launcher = v
		case "mode":
			p.Mode = v
		case "session":
			p.Session = v
		case "dir":
			p.Dir = v
		case "deliver":
			p.Deliver = v
		case "nudge":
			p.Nudge = v
		case "program":
			p.Program = v
		case "turns":
			p.Turns = v
		case "paste":
			p.Paste = v
		case "header":
			p.Header = v
		case "grace", "idle-screen":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("%s: %q is not a duration such as 500ms", k, v))
				continue
			}
			if field == "grace" {
				p.Grace = d
			} else {
				p.IdleScreen = d
			}
		}
	}
	for _, name := range sortedNames(out) {
		p := out[name]
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("profile.%s: "+format, append([]any{name}, args...)...))
		}
		if p.Launcher == "" {
			p.Launcher = "tmux"
		}
		if p.Mode == "" {
			p.Mode = map[string]string{"tmux": "inject", "exec": "pull"}[p.Launcher]
		}
		if strings.TrimSpace(p.Command) == "" {
			bad("no command (set profile.%s.command)", name)
		}
		switch p.Launcher {
		case "tmux":
			if p.Deliver != "" {
				bad("deliver is for the exec launcher; a tmux entity gets its messages in its pane")
			}
		case "exec":
			if p.Session != "" {
				bad("session is for the tmux launcher")
			}
			if p.Mode == "inject" && p.Deliver == "" {
				bad("an exec entity in inject mode needs profile.%s.deliver, the command each message is handed to", name)
			}
		default:
			bad("launcher %q is not tmux or exec", p.Launcher)
		}
		switch p.Mode {
		case "inject", "pull", "hook":
		default:
			bad("mode %q is not inject, pull or hook", p.Mode)
		}
		if p.Mode != "inject" && p.Deliver != "" {
			bad("deliver is for inject mode")
		}
		if p.Mode != "pull" && p.Nudge != "" {
			bad("nudge is for pull mode")
		}
		if (p.Launcher != "tmux" || p.Mode != "inject") && p.Program+p.Turns+p.Paste+p.Header != "" || p.IdleScreen != 0 && p.Launcher != "tmux" {
			bad("program, turns, paste, header and idle-screen are for a tmux entity in inject mode")
		}
		if strings.ContainsAny(p.Session, ":.") {
			bad("session %q may not hold ':' or '.'", p.Session)
		}
	}
	return out, errs
}

// ProfileNames lists the configured profiles, sorted.
func (c *Config) ProfileNames() []string { return sortedNames(c.Profiles) }

func sortedNames(m map[string]*Profile) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
