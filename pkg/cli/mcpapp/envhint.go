package mcpapp

import (
	"fmt"
	"os"
	"strings"

	"github.com/fleetd/fleet/pkg/fault"
)

// MCP clients start their servers with only part of their own
// environment, each its own way (read from the clients' own code, the
// versions the tests pin: Claude Code 2.1.332, Codex 0.169.0's
// rmcp-client, Gemini CLI 0.61.0's sanitizeEnvironment, the MCP
// Inspector 2.12.0):
//
//   - Claude Code passes its environment and the entry's "env".
//   - Codex passes a few variables (HOME, PATH, USER, ...), then those the
//     entry names in env_vars and sets in env.
//   - Gemini CLI drops every variable whose name holds TOKEN, KEY, SECRET,
//     AUTH, ... — FLEET_TOKEN among them, even as "$FLEET_TOKEN" in the
//     entry's env — unless security.environmentVariableRedaction.allowed
//     names it.
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
// fleet-mcp; or, where the client keeps them from it whatever its config
// says (Gemini CLI and FLEET_TOKEN), the flags that do the same (alt).
func clientConfigHint(vars []string, alt string) string {
	var env, genv, list []string
	for _, v := range vars {
		env = append(env, fmt.Sprintf("%q: \"${%s}\"", v, v))
		genv = append(genv, fmt.Sprintf("%q: \"$%s\"", v, v))
		list = append(list, fmt.Sprintf("%q", v))
	}
	gemini := "Gemini CLI (settings.json mcpServers.fleet): \"env\": {" + strings.Join(genv, ", ") + "}"
	if alt != "" {
		gemini = "Gemini CLI (settings.json mcpServers.fleet, which drops any variable named *TOKEN* unless " +
			"security.environmentVariableRedaction.allowed lists it): \"args\": [" + alt + "]"
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
		clientConfigHint([]string{"FLEET_TOKEN"}, `"--as", "NAME"`) + "; in any client, args --as NAME works"
	return fault.New(fault.Refused, fault.KindNoCredential, "no credential: fleet-mcp serves one entity; looked for --as NAME (not given), %s",
		envLooked("FLEET_TOKEN", "FLEET_ENTITY")).WithHint("%s", hint)
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
			"%s; in any client, args --socket PATH works", clientConfigHint([]string{"FLEET_SOCKET"}, ""))
}
