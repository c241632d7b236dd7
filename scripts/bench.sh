#!/usr/bin/env bash
# Producer and consumer throughput: starts a throw-away single-node Apache Kafka, runs benches/throughput.rs
# against it, then (unless BENCH_BASELINE=0) the same workload with librdkafka via
# confluent-kafka, and prints both JSON lines and the kafkapipe/librdkafka msgs/s ratio;
# then benches/consume.rs (Reader vs librdkafka consumer on the same topic, same run).
#
#   scripts/bench.sh                       # 1M x 100 B
#   KAFKAPIPE_BENCH_MSGS=200000 KAFKAPIPE_BENCH_SIZE=1000 scripts/bench.sh
#
# Other knobs: see benches/throughput.rs (KAFKAPIPE_BENCH_PARTITIONS, _BATCH, _COMPRESSION,
# _ACKS).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/kafka.sh
source scripts/lib/kafka.sh

msgs="${KAFKAPIPE_BENCH_MSGS:-1000000}"
size="${KAFKAPIPE_BENCH_SIZE:-100}"
partitions="${KAFKAPIPE_BENCH_PARTITIONS:-8}"
batch="${KAFKAPIPE_BENCH_BATCH:-1000}"
compression="${KAFKAPIPE_BENCH_COMPRESSION:-none}"
acks="${KAFKAPIPE_BENCH_ACKS:-all}"
export KAFKAPIPE_BENCH_MSGS="$msgs" KAFKAPIPE_BENCH_SIZE="$size" \
    KAFKAPIPE_BENCH_PARTITIONS="$partitions" KAFKAPIPE_BENCH_BATCH="$batch" \
    KAFKAPIPE_BENCH_COMPRESSION="$compression" KAFKAPIPE_BENCH_ACKS="$acks"

cargo build --release --bench throughput --bench consume >&2
kafka_start
trap kafka_stop EXIT
export KAFKAPIPE_BENCH_BROKER="$KAFKA_ADDR"

ours=$(cargo bench --bench throughput 2>/dev/null | grep '^{')
echo "$ours"

if [[ "${BENCH_BASELINE:-1}" != 0 ]]; then
    confluent_ensure
    topic="bench-librdkafka-$$"
    "${JAVA_HOME:+${JAVA_HOME}/bin/}java" -cp "${KAFKAPIPE_KAFKA_LIBS}/*" org.apache.kafka.tools.TopicCommand \
        --bootstrap-server "$KAFKA_ADDR" --create --topic "$topic" --partitions "$partitions" >/dev/null
    theirs=$(python3 scripts/bench_librdkafka.py --broker "$KAFKA_ADDR" --topic "$topic" \
        --msgs "$msgs" --size "$size" --compression "$compression" --acks "$acks" --batch "$batch")
    echo "$theirs"
    python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({
    "ratio_msgs_per_sec": round(a["msgs_per_sec"] / b["msgs_per_sec"], 2),
    "ratio_cpu_secs": (round(a["cpu_secs"] / b["cpu_secs"], 2)
                       if a.get("cpu_secs") and b.get("cpu_secs") else None),
}))
PY
fi

echo "# consumer" >&2
if [[ "${BENCH_BASELINE:-1}" == 0 ]]; then
    export KAFKAPIPE_BENCH_BASELINE=0
fi
KAFKAPIPE_BENCH_MESSAGES="$msgs" KAFKAPIPE_BENCH_VALUE_LEN="$size" \
    cargo bench --bench consume 2>/dev/null | grep '^{'
