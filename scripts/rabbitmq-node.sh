#!/usr/bin/env bash
# A private RabbitMQ node for tests: its own name, ports and data folder, so
# tests may stop, restart and cut it without touching any system broker.
# Installs Debian's rabbitmq-server when it is missing and we run as root.
#
#   scripts/rabbitmq-node.sh start|stop|restart|status|ctl ARGS...|url|tls-url|tls-dir|management-url
#
# Environment: FLEET_RMQ_DIR (default /tmp/fleet-rmq-$UID), FLEET_RMQ_PORT
# (default 5699), FLEET_RMQ_NODE (default fleet-test@localhost),
# FLEET_RMQ_CONSUMER_TIMEOUT (ms, default 20000: low on purpose, so tests
# prove the gateway never holds a delivery that long),
# FLEET_RMQ_MANAGEMENT_PORT (default the AMQP port + 10000; empty: none).
#
# The management plugin listens on loopback, without statistics: the
# tests import definitions and remove vhosts through its HTTP API
# (internal/testnode), where each rabbitmqctl call starts an Erlang VM
# (a second of CPU; the suite made about two hundred).
set -euo pipefail
dir=${FLEET_RMQ_DIR:-/tmp/fleet-rmq-$(id -u)}
port=${FLEET_RMQ_PORT:-5699}
node=${FLEET_RMQ_NODE:-fleet-test@localhost}
timeout_ms=${FLEET_RMQ_CONSUMER_TIMEOUT:-20000}
mgmt=${FLEET_RMQ_MANAGEMENT_PORT-$((port + 10000))}

find_sbin() {
	local d
	for d in /usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin; do
		[ -x "$d/rabbitmq-server" ] && { echo "$d"; return 0; }
	done
	return 1
}

install_broker() {
	if find_sbin >/dev/null; then return 0; fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "rabbitmq-node: rabbitmq-server is not installed; run as root or: apt-get install rabbitmq-server" >&2
		exit 69
	fi
	echo "rabbitmq-node: installing Debian's rabbitmq-server" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null
	# Debian starts the system service when it can; we never use it.
}

setup_env() {
	sbin=$(find_sbin)
	mkdir -p "$dir/mnesia" "$dir/log"
	export HOME="$dir" # the Erlang cookie lives here, for the node and rabbitmqctl
	export RABBITMQ_NODENAME="$node"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT="$port"
	export RABBITMQ_DIST_PORT=$((port + 20000))
	export RABBITMQ_MNESIA_BASE="$dir/mnesia"
	export RABBITMQ_LOG_BASE="$dir/log"
	export RABBITMQ_CONFIG_FILE="$dir/rabbitmq"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
	export RABBITMQ_PID_FILE="$dir/rabbit.pid"
	export ERL_CRASH_DUMP="$dir/erl_crash.dump" # not in the caller's folder
	# Schedulers sleep when out of work instead of spinning: on a small
	# host the broker shares with gateways and tests, spinning takes the
	# CPU they need (the setting Red Hat OpenStack ships for its brokers).
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="${RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS:-+sbwt none +sbwtdcpu none +sbwtdio none}"
	export ERL_EPMD_ADDRESS=127.0.0.1
	make_certs
	cat >"$dir/rabbitmq.conf" <<-CONF
		listeners.tcp.default = 127.0.0.1:$port
		listeners.ssl.default = 127.0.0.1:$((port + 1))
		ssl_options.cacertfile = $dir/tls/ca.pem
		ssl_options.certfile = $dir/tls/server.pem
		ssl_options.keyfile = $dir/tls/server.key
		ssl_options.verify = verify_peer
		ssl_options.fail_if_no_peer_cert = true
		consumer_timeout = $timeout_ms
		log.console = false
		log.file.level = warning
	CONF
	if [ -n "$mgmt" ]; then
		cat >>"$dir/rabbitmq.conf" <<-CONF
			management.tcp.ip = 127.0.0.1
			management.tcp.port = $mgmt
			management.disable_stats = true
			management_agent.disable_metrics_collector = true
		CONF
		echo "[rabbitmq_management]." >"$dir/enabled_plugins"
	else
		echo "[]." >"$dir/enabled_plugins"
	fi
}

# A private CA, a server certificate for localhost and a client
# certificate, for the amqps:// tests (client certificates required).
make_certs() {
	local t="$dir/tls"
	[ -s "$t/client.pem" ] && return 0
	mkdir -p "$t"
	(
		cd "$t"
		openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=fleet test CA" \
			-keyout ca.key -out ca.pem 2>/dev/null
		for who in server client; do
			openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout $who.key -out $who.csr 2>/dev/null
			printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" >$who.ext
			openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
				-extfile $who.ext -out $who.pem 2>/dev/null
		done
		chmod 644 ./*.pem ./*.key
	)
}

ctl() { "$sbin/rabbitmqctl" -n "$node" "$@"; }

running() { ctl status >/dev/null 2>&1; }

start() {
	install_broker
	setup_env
	if running; then return 0; fi
	nohup "$sbin/rabbitmq-server" >"$dir/log/console.log" 2>&1 &
	if ! timeout 120 "$sbin/rabbitmqctl" -n "$node" wait --timeout 110 "$RABBITMQ_PID_FILE" >/dev/null 2>&1; then
		echo "rabbitmq-node: the node did not start; see $dir/log" >&2
		tail -20 "$dir/log/console.log" >&2 || true
		exit 69
	fi
	ctl await_startup >/dev/null
	echo "rabbitmq-node: $node up on amqp://guest:guest@127.0.0.1:$port/" >&2
}

stop() {
	install_broker
	setup_env
	if running; then ctl stop >/dev/null 2>&1 || true; fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
status) setup_env; running && echo up || { echo down; exit 1; } ;;
ctl) shift; setup_env; ctl "$@" ;;
url) echo "amqp://guest:guest@127.0.0.1:$port/" ;;
tls-url) echo "amqps://guest:guest@localhost:$((port + 1))/" ;;
tls-dir) echo "$dir/tls" ;;
management-url) [ -n "$mgmt" ] && echo "http://127.0.0.1:$mgmt" ;;
*) echo "usage: $0 start|stop|restart|status|ctl ARGS...|url|tls-url|tls-dir|management-url" >&2; exit 64 ;;
esac
