#!/usr/bin/env bash
# What trust costs per message (issue: trust by default): decoding an
# envelope from the broker alone (what a gateway does anyway) beside
# decoding plus every admission check — field grammar, the Ed25519
# verification against the trust file, the signer and roster claims, the
# time windows — and what signing costs the publisher. Go benchmarks in
# pkg/gateway (BenchmarkAdmission), run 5 times; medians and ranges.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$($GO test -run '^$' -bench 'BenchmarkAdmission' -benchtime 3000x -count 5 ./pkg/gateway)
echo "$out" | awk '
/^BenchmarkAdmission\// {
	split($1, a, "/"); name = a[2]; sub(/-[0-9]+$/, "", name)
	v[name] = v[name] " " $3
}
function stats(list,   n, x, i, j, t) {
	n = split(list, x, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	med = x[int((n + 1) / 2)]; lo = x[1]; hi = x[n]
}
END {
	stats(v["decode"]); d = med; dl = lo; dh = hi
	stats(v["decode+checks"]); c = med; cl = lo; ch = hi
	stats(v["sign"]); s = med; sl = lo; sh = hi
	printf "trust checks, per message from the broker (median of 5; range)\n"
	printf "  decode alone (baseline):        %7.1f us  (%.1f-%.1f)\n", d / 1000, dl / 1000, dh / 1000
	printf "  decode + every admission check: %7.1f us  (%.1f-%.1f)  = %.2fx the baseline\n", c / 1000, cl / 1000, ch / 1000, c / d
	printf "  the checks add:                 %7.1f us on the receiver\n", (c - d) / 1000
	printf "  signing, on the publisher:      %7.1f us  (%.1f-%.1f)\n", s / 1000, sl / 1000, sh / 1000
}'
