#!/usr/bin/env bash
# Scale benchmark: one gateway with many entities on the private RabbitMQ
# node (started when needed). Builds the binaries, then runs
# scripts/benchscale; extra arguments go to it (-n 10000 -raw 1000 are the
# defaults). The gateway and the run's vhost are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RMQ=scripts/rabbitmq-node.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench-scale.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$RMQ" start
CGO_ENABLED=0 "$GO" build -trimpath -tags urfave_cli_no_docs -o "$work/bin/" ./cmd/... # as make build
"$GO" build -o "$work/benchscale" ./scripts/benchscale
"$work/benchscale" -bin "$work/bin" -rmq "$RMQ" -broker "$("$RMQ" url)" -dir "$work" "$@"
