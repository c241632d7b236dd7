#!/usr/bin/env bash
# Side-by-side client benchmark: kafkapipe vs librdkafka (rdkafka_performance), kafka-go,
# franz-go and the Java client (ProducerPerformance / ConsumerPerformance), on one local
# Apache Kafka broker (scripts/lib/kafka.sh), alternating clients within every repetition.
# Every client run is its own process, measured with getrusage of the child (rusage.py, wait4):
# CPU = user + sys of the client process (startup, connect, metadata and flush/close
# included), wall = the process's wall time, peak RSS = its maximum resident set, minor faults = its ru_minflt. Prints one
# Markdown table of medians.
#
#   benches/compare/run.sh                      # quick: a few 200k-message rows, 3 reps
#   benches/compare/run.sh --set report --reps 5  # the rows of BENCHMARKS.md
#   benches/compare/run.sh --full --reps 5      # every row (sizes x codecs x acks x partitions)
#   benches/compare/run.sh --smoke              # each peer once on 10k messages
#   benches/compare/run.sh --rows 1000000:100:none:1:16 --peers kafkapipe,librdkafka
#   benches/compare/run.sh --latency            # produce and end-to-end latency at a fixed rate
#
# Options:
#   --set quick|report|full|smoke  row set (default quick); --full = --set full,
#                                  --smoke = --set smoke --reps 1
#   --rows COUNT:SIZE:CODEC:ACKS:PARTITIONS[,...]   explicit rows instead of a set
#   --reps N                       repetitions per client and row (default 3)
#   --peers LIST                   comma-separated subset of
#                                  kafkapipe,librdkafka,kafka-go,franz-go,java (default all),
#                                  and kafkapipe-metrics: compare_peer built with feature
#                                  `metrics`, publishing into a Prometheus recorder (the
#                                  metrics cost row of BENCHMARKS.md; not in the default),
#                                  and kafkapipe-nocrc: compare_peer reading with
#                                  `check_crcs(false)` (as librdkafka's default
#                                  check.crcs=false; not in the default)
#   --ops LIST                     produce,consume,group (default produce,consume); group =
#                                  consume as a member of a new consumer group (offset
#                                  tracking and commits included), for the clients that
#                                  have one here: kafkapipe, librdkafka (its high-level
#                                  consumer, -G) and java (ConsumerPerformance, which
#                                  always joins a group)
#   --latency                      run the latency comparison (and no throughput rows
#                                  unless --set/--rows is also given)
#   --rates N[,N...]               latency: offered msgs/s, one table per rate (default
#                                  1000,10000,100000); --rate N = --rates N
#   --latency-count N              latency: messages per run (default: 10 s worth at the
#                                  rate, at least 20000, at most 200000); --latency-size B
#                                  (default 100)
#   --latency-acks 0|1|all         latency: acks of both clients (default all)
#   --latency-reps N               latency: runs per client and rate, alternating (default 2)
#   --latency-baseline BIN         latency: also run this compare_peer (another commit's,
#                                  say main's: cargo build --release --bench compare_peer
#                                  there) in every repetition, rows "kafkapipe-base"
#   --out DIR                      keep raw results and logs here (default a temp dir)
#   --linger-ms MS                 linger of every client (default 5)
#   --profile release|dev          cargo profile of compare_peer (default release; dev is for
#                                  smoke runs that must not rebuild the dependencies in release)
#
# Exits non-zero when any client run (or the kafkapipe latency run) failed, so a smoke run
# is a test: scripts/test.sh runs `--smoke --peers kafkapipe --profile dev --latency`.
#
# Consume rows read a topic that kafkapipe's producer filled once per row (same codec and
# partitions); the acks column does not apply to them, so each consume workload runs once
# per (count, size, codec, partitions). Needs: Java 17+, Maven (the broker's jars), Go, a C
# toolchain with libzstd-dev liblz4-dev zlib1g-dev libssl-dev (librdkafka), Python 3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
# shellcheck source=../../scripts/lib/kafka.sh
source scripts/lib/kafka.sh

set_name=quick
rows=""
reps=""
peers="kafkapipe,librdkafka,kafka-go,franz-go,java"
ops="produce,consume"
latency=0
rates=1000,10000,100000
latency_count=""
latency_acks=all
latency_reps=2
latency_size=100
latency_base=""
out=""
linger=5
profile=release
explicit_rows=0
while (($#)); do
    case "$1" in
    --set) set_name="$2"; explicit_rows=1; shift ;;
    --full) set_name=full; explicit_rows=1 ;;
    --smoke) set_name=smoke; explicit_rows=1; reps="${reps:-1}" ;;
    --rows) rows="$2"; explicit_rows=1; shift ;;
    --reps) reps="$2"; shift ;;
    --peers) peers="$2"; shift ;;
    --ops) ops="$2"; shift ;;
    --latency) latency=1 ;;
    --rate | --rates) rates="$2"; shift ;;
    --latency-acks) latency_acks="$2"; shift ;;
    --latency-reps) latency_reps="$2"; shift ;;
    --latency-count) latency_count="$2"; shift ;;
    --latency-size) latency_size="$2"; shift ;;
    --latency-baseline) latency_base="$2"; shift ;;
    --out) out="$2"; shift ;;
    --linger-ms) linger="$2"; shift ;;
    --profile) profile="$2"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
reps="${reps:-3}"

if [[ -z "$rows" ]]; then
    case "$set_name" in
    smoke) rows="10000:100:none:1:1" ;;
    quick) rows="200000:100:none:1:1,200000:100:lz4:1:1,200000:100:none:1:16,50000:1000:zstd:all:1" ;;
    report) rows="1000000:100:none:1:1,1000000:100:none:1:16,1000000:100:lz4:1:1,1000000:100:zstd:1:1,200000:1000:none:1:1" ;;
    full)
        rows=""
        for spec in 1000000:100 200000:1000 20000:10000; do
            for codec in none lz4 zstd; do
                for acks in 1 all; do
                    for parts in 1 16; do
                        rows+="${rows:+,}${spec}:${codec}:${acks}:${parts}"
                    done
                done
            done
        done
        ;;
    *) echo "unknown row set $set_name" >&2; exit 2 ;;
    esac
fi
if ((latency)) && ((!explicit_rows)); then
    rows=""
fi

out="${out:-$(mktemp -d -t kafkapipe-compare-XXXXXX)}"
mkdir -p "$out/logs"
results="$out/results.tsv"
: >"$results"
echo "raw results and logs: $out" >&2

has_peer() { [[ ",$peers," == *",$1,"* ]]; }

# --- build the clients --------------------------------------------------------------------
case "$profile" in
release) cargo_profile=(--release) ;;
dev) cargo_profile=() ;;
*) echo "--profile: release or dev, not $profile" >&2; exit 2 ;;
esac
echo "building kafkapipe's compare_peer ($profile)" >&2
kp="$(cargo build "${cargo_profile[@]}" --bench compare_peer --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "compare_peer" and m.get("executable"):
        print(m["executable"])')"
[[ -x "$kp" ]] || { echo "could not build compare_peer (cargo build ${cargo_profile[*]} --bench compare_peer)" >&2; exit 1; }
kpm=""
if has_peer kafkapipe-metrics; then
    echo "building kafkapipe's compare_peer with feature metrics ($profile)" >&2
    kpm="$(cargo build "${cargo_profile[@]}" --features metrics --bench compare_peer --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "compare_peer" and m.get("executable"):
        print(m["executable"])')"
    [[ -x "$kpm" ]] || { echo "could not build compare_peer --features metrics" >&2; exit 1; }
fi
[[ -z "$latency_base" || -x "$latency_base" ]] || { echo "--latency-baseline: $latency_base is not an executable" >&2; exit 2; }
rdk=""
if has_peer librdkafka; then
    rdk="$("$here/build_rdkafka.sh")"
fi
gobin="$out/go-bin"
if has_peer kafka-go || has_peer franz-go; then
    echo "building the Go peers" >&2
    (cd "$here/go" && go build -o "$gobin/" ./kafkago ./franz)
fi
kafka_ensure
java="${JAVA_HOME:+${JAVA_HOME}/bin/}java"
java_log4j="$out/java-log4j2.properties"
cat >"$java_log4j" <<'PROPS'
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = STDERR
PROPS

kafka_start
trap kafka_stop EXIT
broker="$KAFKA_ADDR"

# --- one timed client run -----------------------------------------------------------------
# client_cmd OP CLIENT TOPIC COUNT SIZE CODEC ACKS PARTITIONS GROUP -> the command, one word a line
client_cmd() {
    local op="$1" client="$2" topic="$3" count="$4" size="$5" codec="$6" acks="$7" parts="$8" group="$9"
    local jacks="$acks" racks="$acks" p
    [[ "$acks" == all ]] && racks=-1
    local bin="$kp" extra=()
    [[ "$client" == kafkapipe-metrics ]] && { bin="$kpm"; client=kafkapipe; }
    [[ "$client" == kafkapipe-nocrc ]] && { extra=(--check-crcs false); client=kafkapipe; }
    case "$client/$op" in
    kafkapipe/produce)
        printf '%s\n' "$bin" produce --brokers "$broker" --topic "$topic" --count "$count" \
            --size "$size" --compression "$codec" --acks "$acks" --linger-ms "$linger" \
            --batch-bytes 1048576 --batch-msgs 10000 ;;
    kafkapipe/consume)
        printf '%s\n' "$bin" consume --brokers "$broker" --topic "$topic" --count "$count" \
            "${extra[@]}" ;;
    kafkapipe/group)
        printf '%s\n' "$bin" consume --brokers "$broker" --topic "$topic" --count "$count" \
            --group "$group" "${extra[@]}" ;;
    librdkafka/produce)
        printf '%s\n' "$rdk" -P -b "$broker" -t "$topic" -c "$count" -s "$size" -z "$codec" \
            -a "$racks" -X "linger.ms=$linger" -X batch.size=1048576 -X batch.num.messages=10000 \
            -X enable.idempotence=false -i 60000 ;;
    librdkafka/consume)
        printf '%s\n' "$rdk" -C -b "$broker" -t "$topic" -c "$count" -o beginning -i 60000
        for ((p = 0; p < parts; p++)); do printf '%s\n' -p "$p"; done ;;
    librdkafka/group)
        printf '%s\n' "$rdk" -C -G "$group" -b "$broker" -t "$topic" -c "$count" \
            -X auto.offset.reset=earliest -i 60000 ;;
    kafka-go/*)
        printf '%s\n' "$gobin/kafkago" "$op" --brokers "$broker" --topic "$topic" --count "$count" \
            --size "$size" --compression "$codec" --acks "$acks" --linger-ms "$linger" \
            --batch-bytes 1048576 --batch-msgs 10000 --partitions "$parts" ;;
    franz-go/*)
        printf '%s\n' "$gobin/franz" "$op" --brokers "$broker" --topic "$topic" --count "$count" \
            --size "$size" --compression "$codec" --acks "$acks" --linger-ms "$linger" \
            --batch-bytes 1048576 --batch-msgs 10000 --partitions "$parts" ;;
    java/produce)
        printf '%s\n' "$java" -Xmx512m "-Dlog4j2.configurationFile=$java_log4j" \
            -cp "${KAFKAPIPE_KAFKA_LIBS}/*" org.apache.kafka.tools.ProducerPerformance \
            --topic "$topic" --num-records "$count" --record-size "$size" --throughput -1 \
            --producer-props "bootstrap.servers=$broker" "acks=$jacks" "linger.ms=$linger" \
            batch.size=1048576 "compression.type=$codec" enable.idempotence=false ;;
    java/consume | java/group)
        printf '%s\n' "$java" -Xmx512m "-Dlog4j2.configurationFile=$java_log4j" \
            -cp "${KAFKAPIPE_KAFKA_LIBS}/*" org.apache.kafka.tools.ConsumerPerformance \
            --bootstrap-server "$broker" --topic "$topic" --messages "$count" --group "$group" \
            --timeout 60000 ;;
    *) echo "no command for $client/$op" >&2; return 1 ;;
    esac
}

# timed_run LABEL OP CLIENT TOPIC COUNT SIZE CODEC ACKS PARTITIONS REP -> appends a result line
timed_run() {
    local label="$1" op="$2" client="$3" topic="$4" count="$5" size="$6" codec="$7" acks="$8" parts="$9" rep="${10}"
    local log="$out/logs/${label}.${op}.${client}.${rep}" cmd=() tm
    mapfile -t cmd < <(client_cmd "$op" "$client" "$topic" "$count" "$size" "$codec" "$acks" "$parts" "g-${label}-${op}-${client}-${rep}-$$")
    tm="$log.time"
    if "$here/rusage.py" "$tm" 300 "${cmd[@]}" >"$log.out" 2>"$log.err"; then
        read -r wall user sys rss_kb minflt <"$tm"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
            "$op" "$count" "$size" "$codec" "$acks" "$parts" "$client" "$rep" \
            "$wall" "$user" "$sys" "$rss_kb" ok "${minflt:-}" >>"$results"
        printf '  %-8s %-10s rep %s: wall %7.3fs cpu %7.3fs rss %7d KB minflt %s\n' "$op" "$client" "$rep" \
            "$wall" "$(awk "BEGIN{print $user + $sys}")" "$rss_kb" "${minflt:-?}" >&2
    else
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\t\t\t\tFAILED\n' \
            "$op" "$count" "$size" "$codec" "$acks" "$parts" "$client" "$rep" >>"$results"
        echo "  $op $client rep $rep FAILED; last lines of $log.err:" >&2
        tail -n 5 "$log.err" >&2 || true
    fi
}

kp_admin() { "$kp" "$@" --brokers "$broker" >/dev/null; }

IFS=, read -r -a peer_list <<<"$peers"
IFS=, read -r -a row_list <<<"$rows"
started=$SECONDS
declare -A consumed=()
for row in "${row_list[@]}"; do
    IFS=: read -r count size codec acks parts <<<"$row"
    label="${count}x${size}-${codec}-acks${acks}-p${parts}"
    echo "# $label" >&2
    if [[ ",$ops," == *",produce,"* ]]; then
        for ((rep = 1; rep <= reps; rep++)); do
            # Rotate the order every repetition so no client always runs first.
            for ((i = 0; i < ${#peer_list[@]}; i++)); do
                client="${peer_list[$(((i + rep - 1) % ${#peer_list[@]}))]}"
                topic="cmp-${label//[^a-zA-Z0-9-]/-}-${client}-${rep}-$$"
                kp_admin create-topic --topic "$topic" --partitions "$parts"
                timed_run "$label" produce "$client" "$topic" "$count" "$size" "$codec" "$acks" "$parts" "$rep"
                kp_admin delete-topic --topic "$topic" || true
            done
        done
    fi
    ckey="${count}:${size}:${codec}:${parts}"
    read_ops=()
    [[ ",$ops," == *",consume,"* ]] && read_ops+=(consume)
    [[ ",$ops," == *",group,"* ]] && read_ops+=(group)
    if ((${#read_ops[@]})) && [[ -z "${consumed[$ckey]:-}" ]]; then
        consumed[$ckey]=1
        topic="cmp-fill-${count}x${size}-${codec}-p${parts}-$$"
        kp_admin create-topic --topic "$topic" --partitions "$parts"
        "$kp" produce --brokers "$broker" --topic "$topic" --count "$count" --size "$size" \
            --compression "$codec" --acks 1 --linger-ms "$linger" >/dev/null
        for op in "${read_ops[@]}"; do
            for ((rep = 1; rep <= reps; rep++)); do
                for ((i = 0; i < ${#peer_list[@]}; i++)); do
                    client="${peer_list[$(((i + rep - 1) % ${#peer_list[@]}))]}"
                    # the Go peers read without a group here
                    if [[ "$op" == group && ",kafkapipe,kafkapipe-metrics,kafkapipe-nocrc,librdkafka,java," != *",$client,"* ]]; then
                        continue
                    fi
                    timed_run "$label" "$op" "$client" "$topic" "$count" "$size" "$codec" - "$parts" "$rep"
                done
            done
        done
        kp_admin delete-topic --topic "$topic" || true
    fi
done

latency_failed=0
if ((latency)); then
    : >"$out/latency.md"
    # Warm the broker up first (its JIT, the topic creation path, acks=all with a
    # follower-less ISR): the first run after the start was the slowest of a set, and
    # kafkapipe goes first in odd repetitions.
    echo "# latency: warm-up (5000 messages, not measured)" >&2
    "$kp" latency --brokers "$broker" --topic "lat-warmup-$$" --count 5000 --size "$latency_size" \
        --rate 5000 --acks "$latency_acks" --linger-ms "$linger" --partitions 1 >/dev/null 2>&1 ||
        echo "latency warm-up failed (ignored)" >&2
    kp_admin delete-topic --topic "lat-warmup-$$" >/dev/null 2>&1 || true
    IFS=, read -r -a rate_list <<<"$rates"
    for rate in "${rate_list[@]}"; do
        n="$latency_count"
        if [[ -z "$n" ]]; then
            n=$((rate * 10))
            ((n >= 20000)) || n=20000
            ((n <= 200000)) || n=200000
        fi
        echo "# latency: $n x ${latency_size} B at ${rate} msgs/s, 1 partition, acks ${latency_acks}" >&2
        "$here/latency.sh" "$out" "$broker" "$kp" "$rdk" "$rate" "$n" "$latency_size" "$linger" \
            "$latency_acks" "$latency_reps" "$latency_base" >>"$out/latency.md" || latency_failed=1
        echo >>"$out/latency.md"
    done
fi
elapsed=$((SECONDS - started))

# --- the table ----------------------------------------------------------------------------
{
    echo "Broker: Apache Kafka $(kafka_version), single node on loopback, same machine."
    echo "Machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)."
    echo "Clients: kafkapipe $(git -C "$repo" describe --always --dirty 2>/dev/null) ($profile profile)," \
        "librdkafka ${rdk:+$("$rdk" -h 2>&1 | sed -n 's/^librdkafka version \([^ ]*\).*/\1/p')}," \
        "kafka-go $(sed -n 's:.*segmentio/kafka-go \(v[^ ]*\).*:\1:p' "$here/go/go.mod")," \
        "franz-go $(sed -n 's:.*twmb/franz-go \(v[^ ]*\)$:\1:p' "$here/go/go.mod")," \
        "Java kafka-tools $(kafka_version) on $("$java" -version 2>&1 | head -n1)."
    echo "Reps: $reps per client and row, alternating; medians. Linger ${linger} ms everywhere."
    echo
    if [[ -s "$results" ]]; then
        python3 "$here/table.py" "$results"
    fi
    if ((latency)); then
        echo
        cat "$out/latency.md"
    fi
    echo
    echo "Run time: ${elapsed}s (excluding builds and broker start)."
} | tee "$out/table.md"

failed="$(awk -F'\t' '$13 == "FAILED"' "$results" | wc -l)"
if ((failed > 0 || latency_failed)); then
    echo "FAILED: $failed client run(s) failed; latency run failed: $((latency_failed)) (logs in $out)" >&2
    exit 1
fi
