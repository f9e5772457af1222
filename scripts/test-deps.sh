#!/usr/bin/env bash
# Installs what the tests need when it is missing: tmux (the real terminal
# for inject tests), ipython3 (a real bracketed-paste REPL), openssl and setpriv (RabbitMQ itself is installed by
# scripts/rabbitmq-node.sh). Installs only as root; otherwise says what is missing.
set -euo pipefail
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v openssl >/dev/null 2>&1 || missing+=(openssl) # the broker node's test certificates
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux) # the other-user socket test
command -v ipython3 >/dev/null 2>&1 || missing+=(ipython3)  # a real bracketed-paste REPL (inject_repl.txtar)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "test-deps: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
	exit 1
fi
echo "test-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
