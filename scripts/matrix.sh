#!/usr/bin/env bash
# The broker version matrix: a representative subset of the real-broker tests against
# each Apache Kafka release, every one installed from Maven Central (testing/kafka/pom.xml
# with -Dkafka.version) and started by the test harness exactly like the default broker.
#
#   bash scripts/matrix.sh                 # 3.9.2 4.1.1 and the pom's version (newest)
#   bash scripts/matrix.sh 3.9.2           # one release
#
# The subset: connect/ApiVersions (broker_smoke), what the client negotiates with each
# release (version_broker: KIP-848 joins or is refused with the reason, transactions v1/v2),
# produce and fetch with every codec and librdkafka interop (conn_broker), admin
# (admin_broker), transactions (txn_broker; the v2 scenarios skip with a message on a
# release without transaction.version=2) and classic groups (group_broker's scenarios named
# in MATRIX_GROUP_SCENARIOS; the KIP-848 ones skip with a message on 3.x), and the
# connection surface: TLS trust, mTLS, PKCS#12 and SASL (security_broker), OIDC client
# credentials against Kafka's JWKS validator (oidc_broker), Kerberos (gssapi_broker, when
# MIT Kerberos is installed), the dial hook and SOCKS5 (dial_broker), ACLs on a
# StandardAuthorizer broker (acl_broker) and client quotas pacing the Reader and the Writer
# (reader_broker's and writer_broker's quota tests; conn_broker has the throttle test).
#
#   MATRIX_TESTS="acl_broker dial_broker" bash scripts/matrix.sh 3.9.2   # part of the subset
#
# The version reaches the harness as KAFKAPIPE_KAFKA_VERSION (tests/common/kafka.rs and
# scripts/lib/kafka.sh honour it). Prints each release's wall time; exits non-zero if any
# test failed on any release. Not part of CI (.ci/run runs the whole suite on the newest
# release); CONTRIBUTING.md says when to run it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/kafka.sh
source scripts/lib/kafka.sh

if [[ $# -gt 0 ]]; then
    versions=("$@")
else
    versions=(3.9.2 4.1.1 "$(kafka_pom_version)")
fi
MATRIX_GROUP_SCENARIOS="${MATRIX_GROUP_SCENARIOS:-single_member_commits_on_close,members_join_and_leave,cooperative_sticky_revokes,shares_a_group_with_a_librdkafka_member,group_errors_surface,kip848_one_three_two_members}"
# shellcheck source=lib/krb5.sh
source scripts/lib/krb5.sh

confluent_ensure
oidc_ensure
krb5_ensure
features=(--features "cli,mock${KAFKAPIPE_GSSAPI_FEATURES}")
default_tests=(broker_smoke version_broker conn_broker admin_broker txn_broker group_broker
    security_broker oidc_broker dial_broker acl_broker reader_broker writer_broker)
[[ -n "${KAFKAPIPE_GSSAPI_FEATURES}" ]] && default_tests+=(gssapi_broker)
read -r -a tests <<<"${MATRIX_TESTS:-${default_tests[*]}}"
# The test binaries do not depend on the broker version (the harness reads it at run
# time): build them once.
build_args=()
for t in "${tests[@]}"; do build_args+=(--test "$t"); done
cargo test "${features[@]}" --no-run "${build_args[@]}"

# Runs one test binary against the current KAFKAPIPE_KAFKA_VERSION.
run_one() {
    local t=$1
    case "$t" in
    broker_smoke)
        # the 3-node cluster test is the failover suite's, not the matrix's
        cargo test "${features[@]}" --test broker_smoke -- --skip cluster_of_three
        ;;
    group_broker)
        KAFKAPIPE_SCENARIO="$MATRIX_GROUP_SCENARIOS" \
            cargo test "${features[@]}" --test group_broker -- group_scenarios --nocapture
        ;;
    reader_broker)
        cargo test "${features[@]}" --test reader_broker -- a_consumer_byte_rate_quota
        ;;
    writer_broker)
        cargo test "${features[@]}" --test writer_broker -- a_producer_byte_rate_quota
        ;;
    *)
        cargo test "${features[@]}" --test "$t"
        ;;
    esac
}

summary=()
failed=0
for v in "${versions[@]}"; do
    export KAFKAPIPE_KAFKA_VERSION="$v"
    unset KAFKAPIPE_KAFKA_LIBS
    kafka_ensure
    echo "::: Apache Kafka ${v} (${KAFKAPIPE_KAFKA_LIBS})"
    started=$SECONDS
    bad=()
    for t in "${tests[@]}"; do
        echo "::: ${v}: ${t}"
        if ! run_one "$t"; then
            bad+=("$t")
        fi
    done
    took=$((SECONDS - started))
    if [[ ${#bad[@]} -eq 0 ]]; then
        summary+=("$(printf '%-8s %5ds  ok' "$v" "$took")")
    else
        failed=1
        summary+=("$(printf '%-8s %5ds  FAILED: %s' "$v" "$took" "${bad[*]}")")
    fi
done

echo "::: matrix (wall time per release)"
printf '    %s\n' "${summary[@]}"
exit "$failed"
