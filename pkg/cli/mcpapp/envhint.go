package mcpapp

import (
	"fmt"
	"os"
	"strings"

	"github.com/fleetd/fleet/pkg/fault"
)

// MCP clients start their servers with only part of their own
// environment, each its own way (the versions the tests pin; the Claude
// Code, Codex and Inspector cases seen in agent_mcp_test.go and
// mcp_inspector.txtar, Gemini's read from its sanitizeEnvironment):
//
//   - Claude Code passes its environment and the entry's "env".
//   - Codex passes a few variables (HOME, PATH, USER, ...), then those the
//     entry names in env_vars and sets in env.
//   - Gemini CLI passes its environment but for every variable whose name
//     holds TOKEN, KEY, SECRET, AUTH, ... — FLEET_TOKEN among them — unless
//     the entry's env names it ("FLEET_TOKEN": "$FLEET_TOKEN").
//   - The MCP Inspector passes HOME, PATH, SHELL, TERM, USER and its -e.
//
// So the credential is the variable most often lost, and --as NAME (a
// credential file, found by HOME or FLEET_STATE_DIR) the way that works in
// every client.

// envLooked names the variables fleet-mcp reads to find its credential
// and its gateway, each with whether it was set.
func envLooked(names ...string) string {
	var parts []string
	for _, n := range names {
		state := "not set"
		if os.Getenv(n) != "" {
			state = "set"
		}
		parts = append(parts, n+" ("+state+")")
	}
	return strings.Join(parts, ", ")
}

// clientConfigHint says how each client passes the variables vars to
// fleet-mcp.
func clientConfigHint(vars []string) string {
	var env, genv, list []string
	for _, v := range vars {
		env = append(env, fmt.Sprintf("%q: \"${%s}\"", v, v))
		genv = append(genv, fmt.Sprintf("%q: \"$%s\"", v, v))
		list = append(list, fmt.Sprintf("%q", v))
	}
	gemini := "Gemini CLI (settings.json mcpServers.fleet): \"env\": {" + strings.Join(genv, ", ") + "}"
	if strings.Contains(strings.Join(vars, " "), "TOKEN") {
		gemini = "Gemini CLI (settings.json mcpServers.fleet; it passes no variable named *TOKEN* unless asked): \"env\": {" +
			strings.Join(genv, ", ") + "}"
	}
	others := []string{
		"Claude Code (.mcp.json or --mcp-config): \"env\": {" + strings.Join(env, ", ") + "}",
		"Codex (config.toml [mcp_servers.fleet]): env_vars = [" + strings.Join(list, ", ") + "]",
	}
	if os.Getenv("GEMINI_CLI") == "1" { // Gemini CLI marks the servers it starts
		return gemini + "; in other clients: " + strings.Join(others, "; ")
	}
	return strings.Join(append(others, gemini), "; ")
}

// noCredential is the refusal of a start with no credential, naming what
// was looked for and how the client that started fleet-mcp can pass it.
func noCredential() error {
	hint := "set FLEET_TOKEN, or pass --as NAME for an entity registered on this host. "
	if n := os.Getenv("FLEET_ENTITY"); n != "" {
		hint = fmt.Sprintf("FLEET_ENTITY is %q: pass --as %s (its credential file) or FLEET_TOKEN. ", n, n)
	}
	hint += "An MCP client may start fleet-mcp without your environment; pass it in the client's config: " +
		clientConfigHint([]string{"FLEET_TOKEN"}) + "; in any client, args --as NAME works"
	return fault.New(fault.Refused, fault.KindNoCredential, "no credential: fleet-mcp serves one entity; looked for --as NAME (not given), %s",
		envLooked("FLEET_TOKEN", "FLEET_ENTITY")).WithHint("%s", hint)
}

// noCredentialFile rewrites the refusal of --as NAME whose credential file
// is not where the state folder was looked for: an MCP client that dropped
// the environment makes fleet-mcp look in another state folder than the
// shell's, where NAME exists, so "register it" would point elsewhere. It
// names the file looked for, what chose its folder, and both ways out.
func noCredentialFile(err error, name string, stateDirFlag bool) error {
	if fault.KindOf(err) != fault.KindNoCredential || !strings.HasPrefix(err.Error(), "no credential for ") {
		return err
	}
	flag := "not given"
	if stateDirFlag {
		flag = "given"
	}
	return fault.New(fault.Refused, fault.KindNoCredential, "%s; its state folder chosen by --state-dir (%s), %s",
		err.Error(), flag, envLooked("FLEET_STATE_DIR", "XDG_STATE_HOME", "HOME", "FLEET_CONFIG")).
		WithHint("if %s is registered (fleet-roster whoami --as %s works in your shell), the MCP client started fleet-mcp "+
			"without the variables above: pass the shell's state folder in the entry's args, --state-dir DIR "+
			"(DIR: $FLEET_STATE_DIR, else $XDG_STATE_HOME/fleet, else ~/.local/state/fleet), or its variables: %s; "+
			"if it is not, register it with: fleet-roster join %s --mode pull",
			name, name, clientConfigHint([]string{"FLEET_STATE_DIR"}), name)
}

// noGateway adds to the "no gateway" error (which names the sockets
// tried) the variables that choose the socket, and how a client that
// dropped them passes them.
func noGateway(err error) error {
	if fault.KindOf(err) != fault.KindNoGateway {
		return err
	}
	return fault.New(fault.Unavailable, fault.KindNoGateway, "%s; socket chosen by %s", err.Error(),
		envLooked("FLEET_SOCKET", "XDG_RUNTIME_DIR", "FLEET_STATE_DIR", "XDG_STATE_HOME", "FLEET_CONFIG")).
		WithHint("start one with: fleet-gw run; if one runs, the MCP client may have started fleet-mcp without the variables above: "+
			"%s; in any client, args --socket PATH works", clientConfigHint([]string{"FLEET_SOCKET"}))
}
