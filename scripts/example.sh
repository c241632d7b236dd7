#!/usr/bin/env bash
# Runs an example against a fresh single-node Apache Kafka broker (KRaft) on a free loopback port:
#   scripts/example.sh [EXAMPLE] [EXTRA ARGS...]     (EXAMPLE defaults to pipeline)
# The example gets the broker address (127.0.0.1:PORT) as its first argument.
# The broker is stopped when this script exits.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/kafka.sh
source scripts/lib/kafka.sh

example="${1:-pipeline}"
shift || true

# Build first, so the broker is not kept waiting (and its start is not slowed) by the build.
cargo build --quiet --example "$example"
trap 'kafka_stop' EXIT
kafka_start
cargo run --quiet --example "$example" -- "$KAFKA_ADDR" "$@"
