#!/usr/bin/env bash
# Installs what the tests need when it is missing: tmux (the real terminal
# for inject tests), ipython3 (a real bracketed-paste REPL), openssl and
# setpriv (RabbitMQ itself is installed by scripts/rabbitmq-node.sh), node
# and npm, and from the npm registry the MCP Inspector (a real MCP client
# for fleet-mcp's tests), pinned, into FLEET_TEST_NPM (default
# ~/.cache/fleet-npm). Installs Debian packages only as root; otherwise says
# what is missing.
set -euo pipefail
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v openssl >/dev/null 2>&1 || missing+=(openssl) # the broker node's test certificates
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux) # the other-user socket test
command -v ipython3 >/dev/null 2>&1 || missing+=(ipython3)  # a real bracketed-paste REPL (inject_repl.txtar)
command -v node >/dev/null 2>&1 || missing+=(nodejs)         # the MCP Inspector runs on node
command -v npm >/dev/null 2>&1 || missing+=(npm)

inspector() {
	local version=2.12.0 dir="${FLEET_TEST_NPM:-$HOME/.cache/fleet-npm}"
	if [ "$(cd "$dir" 2>/dev/null && npm ls --prefix "$dir" --depth=0 --parseable --long @modelcontextprotocol/inspector 2>/dev/null | sed -n 's/.*:@modelcontextprotocol\/inspector@//p')" = "$version" ]; then
		return 0
	fi
	echo "test-deps: installing @modelcontextprotocol/inspector@$version into $dir" >&2
	mkdir -p "$dir"
	npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@modelcontextprotocol/inspector@$version" >&2
}

if [ ${#missing[@]} -eq 0 ]; then
	inspector
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
inspector
