#!/usr/bin/env bash
# Local benchmark: builds the binaries when missing, then runs
# scripts/benchlocal against a real fleet-gw in a temporary state folder.
# Extra arguments go to the benchmark (e.g. -n 5000 -calls 300; -h lists them).
# The gateway it starts is killed on exit, whatever the exit.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-run.XXXXXX")
pidfile="$work/gw.pid"
bench_pid=

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	# the benchmark first (it stops its gateway itself when it can) ...
	if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
		kill -TERM "$bench_pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$bench_pid" 2>/dev/null || true
	fi
	# ... then the gateway, if it is still there
	if [ -s "$pidfile" ]; then
		gw=$(cat "$pidfile")
		if kill -0 "$gw" 2>/dev/null; then
			echo "bench-local: stopping leftover fleet-gw (pid $gw)" >&2
			kill -TERM "$gw" 2>/dev/null || true
			for _ in $(seq 50); do kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$gw" 2>/dev/null || true
		fi
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -x bin/fleet-gw ] || [ ! -x bin/fleet-send ]; then
	echo "bench-local: building bin/" >&2
	if command -v make >/dev/null 2>&1; then
		make build
	else
		mkdir -p bin
		CGO_ENABLED=0 "$GO" build -trimpath -tags urfave_cli_no_docs -o bin/ ./cmd/... # as make build
	fi
fi
"$GO" build -o "$work/benchlocal" ./scripts/benchlocal
# the floors of the per-call figure, built as the fleet binaries are
mkdir -p "$work/floor"
CGO_ENABLED=0 "$GO" build -trimpath -o "$work/floor/" ./scripts/benchlocal/floor/...

"$work/benchlocal" -bin bin -dir "$work" -pidfile "$pidfile" -floor "$work/floor" "$@" &
bench_pid=$!
wait "$bench_pid"
