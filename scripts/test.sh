#!/usr/bin/env bash
# The project's test command: README and CI both run exactly this.
# Integration tests start their own Apache Kafka brokers (tests/common/kafka.rs): one
# single-node broker per test binary that needs one, and 3-node clusters for the failover
# tests. The broker's jars come from Maven Central through testing/kafka/pom.xml and are
# cached in ~/.cache/kafkapipe (collected here if missing); Java 17+ and Maven are needed.
# The interop tests need confluent-kafka (librdkafka), the OIDC tests the `cryptography`
# wheel, the SOCKS5 tests Debian's microsocks, the GSSAPI tests MIT Kerberos (a KDC and
# libgssapi_krb5, from Debian); all are installed here if missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/kafka.sh
source scripts/lib/kafka.sh
# shellcheck source=lib/socks.sh
source scripts/lib/socks.sh
# shellcheck source=lib/krb5.sh
source scripts/lib/krb5.sh
kafka_ensure
confluent_ensure
oidc_ensure
socks_ensure
krb5_ensure

# `cli`: the kafkapipe binary and its subprocess tests (tests/cli_bin.rs).
# `mock`: MockCluster and the tests that run against it (tests/mock_cluster.rs and the fault tests).
# `gssapi`: Kerberos (tests/gssapi_broker.rs), when krb5_ensure found or installed MIT Kerberos.
features="cli,mock${KAFKAPIPE_GSSAPI_FEATURES}"
cargo test --no-fail-fast --all-targets --features "$features" "$@"
cargo test --no-fail-fast --doc --features "$features" "$@"
# The tests of the optional observability features (their targets need them: without,
# `--all-targets` leaves them out): metrics scraped during a run, and W3C trace context
# from producer to consumer. One more build of the library, with both features.
cargo test --no-fail-fast --features "$features,metrics,trace-context" \
    --test metrics_broker --test trace_context_broker "$@"

# Benchmark smoke (benches/compare): kafkapipe's compare_peer, built in the dev profile, produces
# and consumes 10k messages and runs a short fixed-rate latency test against its own broker; it
# fails on any failed run. The full comparison with the peers is benches/compare/run.sh
# (BENCHMARKS.md), not part of the test suite.
benches/compare/run.sh --smoke --peers kafkapipe --profile dev --latency --latency-count 5000 --rate 5000 --latency-reps 1
