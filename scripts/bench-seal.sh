#!/usr/bin/env bash
# What sealing a body costs per message (issue 27, point 7), each side
# beside its floor measured in the same run: the sender's Seal (a
# broadcast is sealed once, one age X25519 stanza per host) beside the
# Ed25519 signature of the same body, which the sender already makes once
# per message; one receiving host's Open beside the signature's
# verification, which each receiving host already makes. Bytes added: the
# sealed bytes in base64 (as the envelope will carry them) less the body.
# Go benchmarks in pkg/seal (BenchmarkSeal), run 5 times; CPU time per
# call (the process's user + system time over the loop: on a shared
# machine the wall time is mostly waiting for a core), medians and
# ranges, the ratio of the medians, and the median wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$($GO test -run '^$' -bench 'BenchmarkSeal' -benchtime 1s -count 5 ./pkg/seal)
echo "$out" | awk '
/^BenchmarkSeal\// {
	split($1, a, "/"); c = a[2]; w = a[3]; sub(/-[0-9]+$/, "", w)
	wall[c "/" w] = wall[c "/" w] " " $3
	for (i = 4; i < NF; i++) {
		if ($(i + 1) == "B-added") added[c] = $i
		if ($(i + 1) == "cpu-ns/op") v[c "/" w] = v[c "/" w] " " $i
	}
}
function stats(list,   n, x, i, j, t) {
	n = split(list, x, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
	med = x[int((n + 1) / 2)]; lo = x[1]; hi = x[n]
}
END {
	printf "sealed bodies, CPU per message (median of 5 runs; range; x = the median over its floor'"'"'s; wall: median)\n"
	split("512B 64KiB bcast10 bcast100", cs, " ")
	split("512 B body, 1 host|64 KiB body, 1 host|512 B broadcast, 10 hosts|512 B broadcast, 100 hosts", names, "|")
	split("512 65536 512 512", size, " ")
	for (k = 1; k <= 4; k++) {
		c = cs[k]
		stats(v[c "/sign"]); g = med; gl = lo; gh = hi
		stats(v[c "/seal"]); s = med; sl = lo; sh = hi
		stats(v[c "/verify"]); f = med; fl = lo; fh = hi
		stats(v[c "/open"]); o = med; ol = lo; oh = hi
		stats(wall[c "/seal"]); ws = med; stats(wall[c "/sign"]); wg = med
		stats(wall[c "/open"]); wo = med; stats(wall[c "/verify"]); wf = med
		printf "  %s\n", names[k]
		printf "    sender:   seal %8.1f us (%.1f-%.1f) beside sign   %6.1f us (%.1f-%.1f) = %.1fx; wall %.1f / %.1f us\n", s / 1000, sl / 1000, sh / 1000, g / 1000, gl / 1000, gh / 1000, s / g, ws / 1000, wg / 1000
		printf "    receiver: open %8.1f us (%.1f-%.1f) beside verify %6.1f us (%.1f-%.1f) = %.1fx; wall %.1f / %.1f us\n", o / 1000, ol / 1000, oh / 1000, f / 1000, fl / 1000, fh / 1000, o / f, wo / 1000, wf / 1000
		printf "    bytes added: %d (%.2fx the body)\n", added[c], added[c] / size[k]
	}
}'
