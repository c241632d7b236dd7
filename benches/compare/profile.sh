#!/usr/bin/env bash
# Where kafkapipe's client CPU goes: perf profiles of compare_peer produce and consume on one
# workload, against a throw-away broker; prints the top symbols (self time) of each.
#
#   benches/compare/profile.sh [COUNT [SIZE [CODEC [PARTITIONS]]]]   # default 1000000 100 none 1
#
# Needs perf (apt-get install linux-perf) and permission to use it (root, or
# kernel.perf_event_paranoid <= 1). Profiles and reports are kept in the printed directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."
# shellcheck source=../../scripts/lib/kafka.sh
source scripts/lib/kafka.sh
count="${1:-1000000}" size="${2:-100}" codec="${3:-none}" parts="${4:-1}"
out="$(mktemp -d -t kafkapipe-profile-XXXXXX)"
echo "profiles in $out" >&2
kp="$(cargo build --release --bench compare_peer --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "compare_peer" and m.get("executable"):
        print(m["executable"])')"
kafka_start
trap kafka_stop EXIT
b="$KAFKA_ADDR"
"$kp" create-topic --brokers "$b" --topic prof-produce --partitions "$parts"
"$kp" create-topic --brokers "$b" --topic prof-consume --partitions "$parts"
common=(--count "$count" --size "$size" --compression "$codec" --acks 1 --linger-ms 5)
"$kp" produce --brokers "$b" --topic prof-consume "${common[@]}" >/dev/null
for op in produce consume; do
    perf record -q -F 1999 -o "$out/$op.data" -- \
        "$kp" "$op" --brokers "$b" --topic "prof-$op" "${common[@]}" >"$out/$op.json" 2>/dev/null
    perf report -i "$out/$op.data" --sort dso,symbol --stdio 2>/dev/null >"$out/$op.report" || true
    grep -E "^ +[0-9.]+%" "$out/$op.report" | sed -E "s/( +-)+ *$//; s/ +$//" | head -n 30 >"$out/$op.top" || true
    echo "## $op ($count x $size B, $codec, $parts partition(s)): $(cat "$out/$op.json")"
    echo "by object: $(perf report -i "$out/$op.data" --sort dso --stdio 2>/dev/null |
        grep -E "^ +[0-9.]+%" | head -n 5 | awk '{printf "%s %s; ", $2, $1}')"
    cat "$out/$op.top"
done
