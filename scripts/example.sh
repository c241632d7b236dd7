#!/usr/bin/env bash
# Runs an example against a fresh tansu broker on a free loopback port:
#   scripts/example.sh [EXAMPLE] [EXTRA ARGS...]     (EXAMPLE defaults to pipeline)
# The example gets the broker address (127.0.0.1:PORT) as its first argument.
# The broker is stopped when this script exits.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/tansu.sh
source scripts/lib/tansu.sh

example="${1:-pipeline}"
shift || true

trap 'rc=$?; tansu_stop; if ((rc == 0)); then rm -f "${TANSU_LOG:-}"; fi' EXIT
tansu_start
echo "tansu ${TANSU_ADDR} (pid ${TANSU_PID}, log ${TANSU_LOG})" >&2
cargo run --quiet --example "$example" -- "$TANSU_ADDR" "$@"
