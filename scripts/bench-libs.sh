#!/usr/bin/env bash
# What fleet's hand-written replacements of a library pay for themselves:
# each Go benchmark named BenchmarkLib* measures its "fleet" way and its
# "library" way (encoding/json; formerly net.Dial) one after the other in
# the same run; the runs are repeated (-runs, 5) and this prints the
# medians side by side with the ratio library/fleet (above 1: fleet's is
# faster) and its range over the runs. Part of make bench.
#   scripts/bench-libs.sh [-runs N] [-benchtime D]
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
runs=5 benchtime=1s
while [ $# -gt 0 ]; do
	case $1 in
	-runs) runs=$2; shift 2 ;;
	-benchtime) benchtime=$2; shift 2 ;;
	*) echo "usage: $0 [-runs N] [-benchtime D]" >&2; exit 64 ;;
	esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-libs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# one test binary per package that has such a benchmark
bins=()
for d in $(grep -ls '^func BenchmarkLib' ./pkg/*/*_test.go ./internal/*/*_test.go | xargs -n1 dirname | sort -u); do
	b="$work/$(basename "$d").test"
	"$GO" test -c -o "$b" "$d"
	bins+=("$b")
done
for r in $(seq "$runs"); do
	for b in "${bins[@]}"; do
		"$b" -test.run '^$' -test.bench '^BenchmarkLib' -test.benchtime "$benchtime" | sed "s/^/run$r /"
	done
done >"$work/out"

awk '
$2 ~ /^BenchmarkLib/ {
	name = $2; sub(/-[0-9]+$/, "", name)
	if (split(name, part, "/") != 2) next
	key = substr(part[1], 13); way = part[2]; run = $1
	if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
	ns[key, way, run] = $4 + 0
	runsOf[key, run] = 1
}
function sort(arr, m,   i, j, t) {
	for (i = 2; i <= m; i++)
		for (j = i; j > 1 && arr[j-1] > arr[j]; j--) { t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t }
}
function med(arr, m) { return m % 2 ? arr[(m+1)/2] : (arr[m/2] + arr[m/2+1]) / 2 }
END {
	printf "%-8s %16s %16s %14s %16s\n", "what", "fleet ns/op", "library ns/op", "library/fleet", "ratio range"
	for (i = 1; i <= nk; i++) {
		k = order[i]; m = 0
		for (r = 1; r <= '"$runs"'; r++) {
			run = "run" r
			if (!((k, "fleet", run) in ns) || !((k, "library", run) in ns)) continue
			m++; f[m] = ns[k, "fleet", run]; l[m] = ns[k, "library", run]; q[m] = l[m] / f[m]
		}
		if (m == 0) continue
		sort(f, m); sort(l, m); sort(q, m)
		printf "%-8s %16.0f %16.0f %13.2fx %8.2f-%.2fx\n", k, med(f, m), med(l, m), med(q, m), q[1], q[m]
	}
	printf "medians over %d runs, each run measuring both ways one after the other\n", '"$runs"'
}' "$work/out"
