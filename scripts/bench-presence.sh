#!/usr/bin/env bash
# Presence in O(hosts) (issue 13 point 2): what presence costs the broker
# with 3, 30 and 100 hosts of 100 entities each, for the scheme before
# snapshots (one heartbeat per entity per interval: the baseline) and for
# snapshots plus change notices, side by side in each run. Simulated
# gateways on the private RabbitMQ node (started when needed): each has a
# publishing connection and its real roster queue, publishes exactly what
# a gateway of that scheme publishes (pkg/gateway BenchmarkPresenceTraffic
# says how), and counts what the broker delivers to it. 3 runs; medians
# and ranges; "demanded" is what the scheme asks of the broker — where the
# deliveries fall short of it, the node fell behind.
# FLEET_BENCH_PRESENCE_INTERVAL sets the interval (default 5s, the deployed
# default); RUNS the number of runs (3).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RMQ=scripts/rabbitmq-node.sh
"$RMQ" start >/dev/null
export FLEET_TEST_BROKER
FLEET_TEST_BROKER=$("$RMQ" url)
interval=${FLEET_BENCH_PRESENCE_INTERVAL:-5s}
export FLEET_BENCH_PRESENCE_INTERVAL=$interval
out=$($GO test -run '^$' -bench 'BenchmarkPresenceTraffic' -benchtime 1x -count "${RUNS:-3}" -timeout 60m ./pkg/gateway)
echo "$out" | awk -v interval="$interval" '
/^BenchmarkPresenceTraffic\// {
	split($1, a, "/"); hosts = a[2]; sub(/^hosts=/, "", hosts); scheme = a[3]; sub(/-[0-9]+$/, "", scheme)
	k = hosts " " scheme
	if (!(hosts in seen)) { seen[hosts] = 1; order[++nh] = hosts }
	for (i = 5; i < NF; i += 2) v[k, $(i + 1)] = v[k, $(i + 1)] " " $i
}
function stats(list,   n, x, i, j, t) {
	n = split(list, x, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
	med = x[int((n + 1) / 2)]; lo = x[1]; hi = x[n]
}
function cell(k, unit, fmt_) {
	stats(v[k, unit])
	return sprintf(fmt_ " (" fmt_ "-" fmt_ ")", med, lo, hi)
}
# old/new, run by run (run i of the old scheme beside run i of the new)
function ratio(h, unit, f,   n, m, o, w, i, r) {
	n = split(v[h " old", unit], o, " "); m = split(v[h " new", unit], w, " ")
	r = ""
	for (i = 1; i <= n && i <= m; i++) if (w[i] > 0) r = r " " o[i] / w[i]
	stats(r)
	return sprintf(f "x (" f "-" f "x)", med, lo, hi)
}
END {
	printf "presence on bridge.roster: 100 entities per host, interval %s; median of %d runs (range)\n", interval, split(v[order[1] " old", "published/s"], z, " ")
	printf "%-6s %-24s %-22s %-26s %-22s %s\n", "hosts", "scheme", "published msgs/s", "deliveries/s", "KiB/s delivered", "deliveries/s demanded"
	for (i = 1; i <= nh; i++) {
		h = order[i]
		for (s = 1; s <= 2; s++) {
			sc = s == 1 ? "old" : "new"
			name = sc == "old" ? "per entity (baseline)" : "snapshots + notices"
			stats(v[h " " sc, "demanded-deliveries/s"]); dem = med
			printf "%-6s %-24s %-22s %-26s %-22s %.0f\n", h, name, cell(h " " sc, "published/s", "%.1f"), cell(h " " sc, "delivered/s", "%.0f"), cell(h " " sc, "KiB-delivered/s", "%.0f"), dem
		}
		printf "%-6s %-24s %-22s %-26s %s\n", h, "old/new", ratio(h, "published/s", "%.0f"), ratio(h, "delivered/s", "%.0f"), ratio(h, "KiB-delivered/s", "%.2f")
	}
}'
