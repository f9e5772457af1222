#!/usr/bin/env bash
# Cross-host benchmark on the private RabbitMQ node: starts the node when it
# is down (scripts/rabbitmq-node.sh start), builds the binaries into a
# temporary folder (or uses $BIN), then runs scripts/benchbroker, which
# starts real fleet-gw gateways in one vhost of its own (default "bench",
# created and deleted by the run). Extra arguments go to the benchmark
# (e.g. -asks 500 -phases ask,bcast; -h lists them).
#
# Whatever the exit, every gateway it started, every spawned process group
# and the vhost are gone afterwards: the benchmark cleans up itself, and
# this wrapper finishes from the pid files and the vhost marker it leaves.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
RMQ=scripts/rabbitmq-node.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/fbb.XXXXXX")
piddir="$work/pids"
mkdir -p "$piddir"
bench_pid=

# stop_pid PID [GROUP]: SIGTERM, up to 5s, then SIGKILL (GROUP: the process group)
stop_pid() {
	local pid=$1 target=$1
	[ "${2:-}" = group ] && target=-$1
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM -- "$target" 2>/dev/null || true
	for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL -- "$target" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	# the benchmark first: it stops its gateways and deletes its vhost itself when it can ...
	if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
		kill -TERM "$bench_pid" 2>/dev/null || true
		for _ in $(seq 600); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$bench_pid" 2>/dev/null || true
	fi
	# ... then whatever it left: gateways,
	for f in "$piddir"/gw-*.pid; do
		[ -s "$f" ] || continue
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null; then
			echo "bench-broker: stopping leftover fleet-gw (pid $pid)" >&2
			stop_pid "$pid"
		fi
	done
	# spawned commands (each leads its own process group; only our sleeps),
	if [ -s "$piddir/spawned.pids" ]; then
		while read -r pid; do
			case $pid in '' | *[!0-9]*) continue ;; esac
			if { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q '^sleep 120'; then
				echo "bench-broker: stopping leftover spawned process group $pid" >&2
				stop_pid "$pid" group
			fi
		done <"$piddir/spawned.pids"
	fi
	# and the vhost, if the benchmark created it and could not delete it
	if [ -s "$piddir/vhost" ]; then
		vhost=$(cat "$piddir/vhost")
		echo "bench-broker: deleting leftover vhost $vhost" >&2
		timeout 90 "$RMQ" ctl delete_vhost "$vhost" >/dev/null 2>&1 || echo "bench-broker: could not delete vhost $vhost" >&2
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$RMQ" start
if [ -n "${BIN:-}" ]; then
	bin=$BIN
else
	echo "bench-broker: building the binaries into $work/bin" >&2
	CGO_ENABLED=0 "$GO" build -trimpath -tags urfave_cli_no_docs -o "$work/bin/" ./cmd/... # as make build
	bin="$work/bin"
fi
"$GO" build -o "$work/benchbroker" ./scripts/benchbroker
echo "bench-broker: source tree $(git describe --always --dirty 2>/dev/null || echo unknown), binaries from $bin" >&2

"$work/benchbroker" -bin "$bin" -rmq "$RMQ" -broker "$("$RMQ" url)" -dir "$work" -piddir "$piddir" "$@" &
bench_pid=$!
wait "$bench_pid"
