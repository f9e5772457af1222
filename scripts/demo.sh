#!/usr/bin/env bash
# The main job on the embedded store, no broker: start a gateway, register
# two entities, send, reply, receive, and show the roster. Everything lives
# in a temporary folder that is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/fleet-gw ] || make build >/dev/null
export PATH="$PWD/bin:$PATH"
demo=$(mktemp -d /tmp/fleet-demo.XXXXXX)
export FLEET_STATE_DIR="$demo/state" FLEET_SOCKET="$demo/gw.sock" FLEET_HOST="${FLEET_HOST:-demo}"
unset FLEET_CONFIG FLEET_TOKEN
gw_pid=
cleanup() {
	[ -n "$gw_pid" ] && kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null
	rm -rf "$demo"
}
trap cleanup EXIT

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

say "fleet-gw run &    # the gateway, on its embedded store (log: $demo/gw.log)"
fleet-gw run 2>"$demo/gw.log" &
gw_pid=$!
for _ in $(seq 100); do fleet-roster >/dev/null 2>&1 && break; sleep 0.05; done

say 'export FLEET_TOKEN=$(fleet-roster join main --mode pull)'
main_token=$(fleet-roster join main --mode pull)
say "fleet-roster join worker --mode inject --exec 'cat >> $demo/worker.inbox'"
fleet-roster join worker --mode inject --exec "cat >> $demo/worker.inbox" >/dev/null

say 'FLEET_TOKEN=$main_token fleet-send worker "please summarise README.md"'
read -r msg_id trace_id < <(FLEET_TOKEN=$main_token fleet-send worker "please summarise README.md")
echo "$msg_id $trace_id"
for _ in $(seq 100); do [ -s "$demo/worker.inbox" ] && break; sleep 0.05; done
say "cat $demo/worker.inbox    # what the worker's exec adapter received"
cat "$demo/worker.inbox"
say "FLEET_TOKEN=\$main_token fleet-send --status $msg_id"
FLEET_TOKEN=$main_token fleet-send --status "$msg_id"

say "fleet-send --as worker --reply-to $msg_id 'done: it is a messaging fabric'"
fleet-send --as worker --reply-to "$msg_id" "done: it is a messaging fabric"
say 'FLEET_TOKEN=$main_token fleet-recv --json'
FLEET_TOKEN=$main_token fleet-recv --json

run fleet-roster
echo
echo "demo: ok — one gateway, two entities, a send, its delivery, a reply in the same trace ($trace_id)"
