#!/usr/bin/env bash
# A private three-node RabbitMQ cluster on this machine, for the cluster
# tests: nodes fleet-c1..3@localhost, each with its own ports and data
# folder under one temporary folder and one shared Erlang cookie, each
# started by scripts/rabbitmq-node.sh (so it installs Debian's
# rabbitmq-server when missing, as root). Node 2 and 3 join node 1.
#
#   scripts/rabbitmq-cluster.sh start|stop|status|urls
#   scripts/rabbitmq-cluster.sh kill N        SIGKILL node N (its disk stays)
#   scripts/rabbitmq-cluster.sh start-node N  start node N again (it rejoins)
#   scripts/rabbitmq-cluster.sh stop-node N   stop node N cleanly
#   scripts/rabbitmq-cluster.sh ctl N ARGS... rabbitmqctl on node N
#   scripts/rabbitmq-cluster.sh url N         node N's AMQP URL (guest)
#
# Environment: FLEET_RMQC_DIR (default /tmp/fleet-rmqc-$UID), FLEET_RMQC_PORT
# (default 5710: node N listens on 5710+2(N-1), TLS on the port after).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${FLEET_RMQC_DIR:-/tmp/fleet-rmqc-$(id -u)}
port0=${FLEET_RMQC_PORT:-5710}
nodes=(1 2 3)

port() { echo $((port0 + 2 * ($1 - 1))); }
name() { echo "fleet-c$1@localhost"; }

# node N ARGS... runs rabbitmq-node.sh for node N
node() {
	local n=$1
	shift
	FLEET_RMQ_DIR="$base/n$n" FLEET_RMQ_PORT=$(port "$n") FLEET_RMQ_NODE=$(name "$n") FLEET_RMQ_MANAGEMENT_PORT= \
		FLEET_RMQ_CONSUMER_TIMEOUT=${FLEET_RMQ_CONSUMER_TIMEOUT:-60000} "$here/rabbitmq-node.sh" "$@"
}

cookie() {
	mkdir -p "$base"
	if [ ! -s "$base/cookie" ]; then
		(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$base/cookie")
	fi
	local n
	for n in "${nodes[@]}"; do
		mkdir -p "$base/n$n"
		if ! cmp -s "$base/cookie" "$base/n$n/.erlang.cookie" 2>/dev/null; then
			rm -f "$base/n$n/.erlang.cookie"
			cp "$base/cookie" "$base/n$n/.erlang.cookie"
			chmod 400 "$base/n$n/.erlang.cookie"
		fi
	done
}

joined() { node "$1" ctl cluster_status --formatter json 2>/dev/null | grep -q "\"$(name 1)\".*\"$(name "$1")\"\|\"$(name "$1")\".*\"$(name 1)\""; }

start() {
	cookie
	# all at once: after a whole-cluster stop, a node waits at boot for the
	# nodes that ran after it, so one started alone could wait for ever
	local n pids=() failed=0
	for n in "${nodes[@]}"; do
		node "$n" start &
		pids+=($!)
	done
	for n in "${pids[@]}"; do wait "$n" || failed=1; done
	[ "$failed" -eq 0 ] || { echo "rabbitmq-cluster: a node did not start; see $base/n*/log" >&2; exit 69; }
	for n in 2 3; do
		if ! joined "$n"; then
			node "$n" ctl stop_app >/dev/null
			node "$n" ctl reset >/dev/null
			node "$n" ctl join_cluster "$(name 1)" >/dev/null
			node "$n" ctl start_app >/dev/null
		fi
	done
	node 1 ctl await_online_nodes 3 >/dev/null
	echo "rabbitmq-cluster: 3 nodes up: $(urls)" >&2
}

# stop, one node after the other, each gone before the next stops: the
# last to stop is then known to all (start starts them all at once anyway)
stop() {
	local n pid i
	for n in 3 2 1; do
		pid=$(nodepid "$n")
		node "$n" stop || true
		for i in $(seq 600); do
			[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	done
}

# nodepid N: node N's Erlang VM, from its pid file, or (a node up whose
# pid file went missing: seen once on a shared machine) from the data
# folder its command line names
nodepid() {
	cat "$base/n$1/rabbit.pid" 2>/dev/null || pgrep -f -- "beam.smp .* -home $base/n$1( |$)" | head -1 || true
}

kill_node() {
	local pid
	pid=$(nodepid "$1")
	[ -n "$pid" ] || { echo "rabbitmq-cluster: node $1 has no pid file, and no process of its data folder runs" >&2; exit 69; }
	kill -9 "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

urls() {
	local n out=""
	for n in "${nodes[@]}"; do out+="${out:+,}amqp://guest:guest@127.0.0.1:$(port "$n")/"; done
	echo "$out"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) for n in "${nodes[@]}"; do printf '%s ' "$(name "$n")"; node "$n" status || true; done ;;
urls) urls ;;
url) echo "amqp://guest:guest@127.0.0.1:$(port "$2")/" ;;
kill) kill_node "$2" ;;
start-node) cookie; node "$2" start ;;
stop-node) node "$2" stop ;;
ctl) n=$2; shift 2; node "$n" ctl "$@" ;;
*) echo "usage: $0 start|stop|status|urls|url N|kill N|start-node N|stop-node N|ctl N ARGS..." >&2; exit 64 ;;
esac
