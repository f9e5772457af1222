#!/usr/bin/env bash
# What watching costs the gateway (issue 38 point 4), on the private
# RabbitMQ node: starts the node when it is down (scripts/rabbitmq-node.sh
# start), builds the binaries into a temporary folder (or uses $BIN), then
# runs scripts/benchtop: 10 real fleet-gw gateways in a vhost of their own
# (default "benchtop", created and deleted by the run), 1,000 entities,
# 100 messages a second, and h1's CPU with and without fleet-roster
# --watch and fleet-top (in a private tmux server) watching. Extra
# arguments go to the benchmark (-h lists them).
#
# PROFILE=DIR builds fleet-gw with -tags pprof and keeps h1's CPU profile
# of every window of an extra round 0, left out of the summary, in DIR
# (go tool pprof -top DIR/gw-top-0.pprof).
#
# Whatever the exit, the gateways, the tmux server and the vhost are gone
# afterwards: the benchmark cleans up itself, and this wrapper finishes
# from the pid files and markers it leaves.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RMQ=scripts/rabbitmq-node.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/fbt.XXXXXX")
piddir="$work/pids"
mkdir -p "$piddir"
bench_pid=

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
		kill -TERM "$bench_pid" 2>/dev/null || true
		for _ in $(seq 600); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$bench_pid" 2>/dev/null || true
	fi
	for f in "$piddir"/gw-*.pid; do
		[ -s "$f" ] || continue
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null; then
			echo "bench-top: stopping leftover fleet-gw (pid $pid)" >&2
			kill -TERM "$pid" 2>/dev/null || true
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	if [ -s "$piddir/tmux" ]; then
		tmux -L "$(cat "$piddir/tmux")" kill-server 2>/dev/null || true
	fi
	if [ -s "$piddir/vhost" ]; then
		vhost=$(cat "$piddir/vhost")
		echo "bench-top: deleting leftover vhost $vhost" >&2
		timeout 90 "$RMQ" ctl delete_vhost "$vhost" >/dev/null 2>&1 || echo "bench-top: could not delete vhost $vhost" >&2
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$RMQ" start
tags=urfave_cli_no_docs
extra=()
if [ -n "${PROFILE:-}" ]; then
	tags=urfave_cli_no_docs,pprof
	mkdir -p "$PROFILE"
	extra=(-pprof-port 16060 -profile "$(cd "$PROFILE" && pwd)")
fi
if [ -n "${BIN:-}" ]; then
	bin=$BIN
else
	echo "bench-top: building the binaries into $work/bin" >&2
	CGO_ENABLED=0 "$GO" build -trimpath -tags "$tags" -o "$work/bin/" ./cmd/... # as make build
	bin="$work/bin"
fi
"$GO" build -o "$work/benchtop" ./scripts/benchtop
echo "bench-top: source tree $(git describe --always --dirty 2>/dev/null || echo unknown), binaries from $bin" >&2

"$work/benchtop" -bin "$bin" -rmq "$RMQ" -broker "$("$RMQ" url)" -dir "$work" -piddir "$piddir" "${extra[@]}" "$@" &
bench_pid=$!
wait "$bench_pid"
