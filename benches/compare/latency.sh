#!/usr/bin/env bash
# Latency part of benches/compare/run.sh (called by it with the broker running):
#   latency.sh OUT_DIR BROKER COMPARE_PEER RDKAFKA_PERFORMANCE RATE COUNT SIZE LINGER_MS
# Prints a Markdown table of produce (send -> acknowledgement) and end-to-end
# (send -> consumed) latency percentiles, 1 partition, acks 1. Exits 1 when kafkapipe's run
# failed (after printing the table).
#
# kafkapipe (compare_peer latency): messages are offered on a fixed schedule (message i is
# due at t0 + i/RATE) and every latency is measured from the due time, so a stall counts
# for every message it delays (no coordinated omission); its own Reader in the same
# process measures end-to-end latency.
# librdkafka (rdkafka_performance -l -A FILE, a producer and a consumer process): the tool
# stamps each payload with the wall clock when it *actually* produces it and paces by
# sleeping 1/RATE after each send, so time it spends behind schedule is not counted
# (coordinated omission) and its achieved rate is below RATE; compare with that in mind.
set -euo pipefail
out="$1" broker="$2" kp="$3" rdk="$4" rate="$5" count="$6" size="$7" linger="$8"
dir="$out/latency"
mkdir -p "$dir"

kp_failed=0
"$kp" latency --brokers "$broker" --topic "lat-kp-$$" --count "$count" --size "$size" \
    --rate "$rate" --acks 1 --linger-ms "$linger" --partitions 1 >"$dir/kafkapipe.json" \
    2>"$dir/kafkapipe.err" || {
    kp_failed=1
    echo "kafkapipe latency run failed:" >&2
    tail -n5 "$dir/kafkapipe.err" >&2
}

if [[ -n "$rdk" ]]; then
    topic="lat-rdk-$$"
    "$kp" create-topic --brokers "$broker" --topic "$topic" --partitions 1
    timeout 300 "$rdk" -C -b "$broker" -t "$topic" -p 0 -o beginning -c "$count" -l \
        -A "$dir/rdk-e2e.us" -i 60000 >"$dir/rdk-consumer.out" 2>&1 &
    consumer=$!
    sleep 3
    start=$(date +%s.%N)
    timeout 300 "$rdk" -P -b "$broker" -t "$topic" -p 0 -c "$count" -s "$size" -r "$rate" -l \
        -A "$dir/rdk-produce.us" -a 1 -X "linger.ms=$linger" -X batch.size=1048576 \
        -X batch.num.messages=10000 -i 60000 >"$dir/rdk-producer.out" 2>&1 ||
        echo "rdkafka_performance producer failed (see $dir/rdk-producer.out)" >&2
    end=$(date +%s.%N)
    wait "$consumer" || echo "rdkafka_performance consumer failed (see $dir/rdk-consumer.out)" >&2
    python3 - "$dir" "$start" "$end" "$count" "$rate" "$size" >"$dir/librdkafka.json" <<'PY' || true
import json, math, sys
d = sys.argv[1]
start, end, count, rate, size = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
def pct(path):
    try:
        v = sorted(int(x) for x in open(path) if x.strip())
    except OSError:
        return None
    if not v:
        return None
    at = lambda q: v[min(len(v), max(1, math.ceil(len(v) * q))) - 1] / 1000.0
    return {"n": len(v), "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999), "max_ms": v[-1] / 1000.0}
print(json.dumps({"client": "librdkafka", "msgs": count, "size": size, "rate": rate,
                  "achieved_rate": round(count / (end - start)),
                  "produce": pct(f"{d}/rdk-produce.us"), "e2e": pct(f"{d}/rdk-e2e.us")}))
PY
fi

python3 - "$dir" "${rdk:+librdkafka}" <<'PY'
import json, os, sys
d = sys.argv[1]
peers = ["kafkapipe"] + [p for p in sys.argv[2:] if p]
print("| client | offered msgs/s | achieved msgs/s | produce p50 / p99 / p99.9 / max (ms) | "
      "end-to-end p50 / p99 / p99.9 / max (ms) | send times |")
print("| --- | ---: | ---: | --- | --- | --- |")
for name, how in (("kafkapipe", "scheduled (no coordinated omission)"),
                  ("librdkafka", "actual, paced by sleeps (coordinated omission possible)")):
    if name not in peers:
        continue
    try:
        r = json.load(open(os.path.join(d, f"{name}.json")))
    except (OSError, ValueError):
        print(f"| {name} | | | not run or failed | | |")
        continue
    f = lambda p: "—" if not p else f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} / {p['p999_ms']:.2f} / {p['max_ms']:.2f}"
    print(f"| {name} | {r['rate']:,.0f} | {r['achieved_rate']:,.0f} | {f(r['produce'])} | {f(r['e2e'])} | {how} |")
PY
exit "$kp_failed"
