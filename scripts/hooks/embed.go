// Package hooks is the agent CLIs' turn-hook recipes — the snippets beside
// this file, one per CLI (OpenCode's a plugin, Copilot CLI's a hook file of its own) — and fleet-turn, the hook they run, embedded so
// that fleet-roster hooks install writes exactly what ships here
// (pkg/hooks merges them into each CLI's settings).
package hooks

import _ "embed"

var (
	//go:embed claude-code-settings.json
	Claude []byte
	//go:embed codex-hooks.json
	Codex []byte
	//go:embed gemini-settings.json
	Gemini []byte
	//go:embed opencode-plugin.js
	OpenCode []byte
	//go:embed copilot-hooks.json
	Copilot []byte
	//go:embed fleet-turn
	FleetTurn []byte
)
