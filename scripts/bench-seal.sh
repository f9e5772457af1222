#!/usr/bin/env bash
# What sealing a body costs per message (issue 27, point 7), each side
# beside its floor measured in the same run — what the message costs
# unsealed: the sender's encode of the envelope and Ed25519 signature of
# it, beside the same with the body sealed first (a broadcast is sealed
# once, one age X25519 stanza per host; the sealed bytes go in the
# envelope as base64); one receiving host's verification and decode,
# beside the same and the body opened. Bytes: the plain envelope's size,
# and what sealing adds to it (the sealed envelope less the plain one).
# Cases: a 512 B body and a 64 KiB body to one host, a 512 B broadcast to
# 10 and to 100 hosts. Go benchmarks in pkg/seal (BenchmarkSeal), run
# RUNS times (5); CPU time per call (the process's user + system time over
# the loop: on a shared machine the wall time is mostly waiting for a
# core), medians and ranges, what sealing adds (the medians' difference)
# and the ratio of the medians, and the median wall times.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RUNS=${RUNS:-5}
out=$($GO test -run '^$' -bench 'BenchmarkSeal' -benchtime 1s -count "$RUNS" ./pkg/seal)
echo "$out" | awk -v runs="$RUNS" '
/^BenchmarkSeal\// {
	split($1, a, "/"); c = a[2]; w = a[3]; sub(/-[0-9]+$/, "", w)
	wall[c "/" w] = wall[c "/" w] " " $3
	for (i = 4; i < NF; i++) {
		if ($(i + 1) == "B-added") added[c] = $i
		if ($(i + 1) == "B-plain") plain[c] = $i
		if ($(i + 1) == "cpu-ns/op") v[c "/" w] = v[c "/" w] " " $i
	}
}
function stats(list,   n, x, i, j, t) {
	n = split(list, x, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
	med = x[int((n + 1) / 2)]; lo = x[1]; hi = x[n]
}
END {
	printf "sealed bodies, CPU per message (median of %d runs; range; + = what sealing adds, x = the median over its floor'"'"'s; wall: medians)\n", runs
	split("512B 64KiB bcast10 bcast100", cs, " ")
	split("512 B body, 1 host|64 KiB body, 1 host|512 B broadcast, 10 hosts|512 B broadcast, 100 hosts", names, "|")
	for (k = 1; k <= 4; k++) {
		c = cs[k]
		stats(v[c "/send-plain"]); g = med; gl = lo; gh = hi
		stats(v[c "/send-sealed"]); s = med; sl = lo; sh = hi
		stats(v[c "/recv-plain"]); f = med; fl = lo; fh = hi
		stats(v[c "/recv-sealed"]); o = med; ol = lo; oh = hi
		stats(wall[c "/send-sealed"]); ws = med; stats(wall[c "/send-plain"]); wg = med
		stats(wall[c "/recv-sealed"]); wo = med; stats(wall[c "/recv-plain"]); wf = med
		printf "  %s\n", names[k]
		printf "    sender   (encode+sign):   sealed %8.1f us (%.1f-%.1f) beside plain %6.1f us (%.1f-%.1f): +%.1f us = %.1fx; wall %.1f / %.1f us\n", s / 1000, sl / 1000, sh / 1000, g / 1000, gl / 1000, gh / 1000, (s - g) / 1000, s / g, ws / 1000, wg / 1000
		printf "    receiver (verify+decode): sealed %8.1f us (%.1f-%.1f) beside plain %6.1f us (%.1f-%.1f): +%.1f us = %.1fx; wall %.1f / %.1f us\n", o / 1000, ol / 1000, oh / 1000, f / 1000, fl / 1000, fh / 1000, (o - f) / 1000, o / f, wo / 1000, wf / 1000
		printf "    bytes: envelope %d plain, %d sealed: +%d = %.2fx\n", plain[c], plain[c] + added[c], added[c], (plain[c] + added[c]) / plain[c]
	}
}'
