#!/usr/bin/env bash
# Latency part of benches/compare/run.sh (called by it with the broker running), one offered
# rate per call:
#   latency.sh OUT_DIR BROKER COMPARE_PEER RDKAFKA_PERFORMANCE RATE COUNT SIZE LINGER_MS ACKS REPS [BASELINE_PEER]
# Runs kafkapipe and librdkafka (if RDKAFKA_PERFORMANCE is not empty) REPS times each,
# alternating, 1 partition, and prints a Markdown table of produce (send -> acknowledgement)
# and end-to-end (send -> consumed) latency percentiles, one row per client, basis and
# repetition. Exits 1 when a kafkapipe run failed (after printing the table).
# BASELINE_PEER (optional): another compare_peer (say main's, to compare a change with)
# run the same way in every repetition, as client "kafkapipe-base".
#
# Both clients get the same settings: acks ACKS, linger LINGER_MS (the default of both is
# 5 ms), batches of at most 1 MiB and 10 000 messages, no idempotence (librdkafka's
# default; compare_peer's unless told), no compression.
#
# kafkapipe (compare_peer latency): messages are offered on a fixed schedule (message i is
# due at t0 + i/RATE) and latency is measured from the due time, so a stall counts for
# every message it delays (no coordinated omission); its own Reader in the same process
# measures end-to-end latency. It also measures from the time each message was actually
# handed to the writer: that is librdkafka's basis, the row to compare with it.
# librdkafka (rdkafka_performance -l -A FILE, a producer and a consumer process): the tool
# stamps each payload with the wall clock when it *actually* produces it and paces by
# sleeping 1/RATE after each send, so time it spends behind schedule is not counted
# (coordinated omission) and its achieved rate can be below RATE.
set -euo pipefail
out="$1" broker="$2" kp="$3" rdk="$4" rate="$5" count="$6" size="$7" linger="$8" acks="$9" reps="${10}"
base="${11:-}"
dir="$out/latency/r$rate"
mkdir -p "$dir"
racks="$acks"
[[ "$acks" == all ]] && racks=-1

kp_failed=0
run_kafkapipe() {
    local rep="$1" bin="${2:-$kp}" name="${3:-kafkapipe}"
    "$bin" latency --brokers "$broker" --topic "lat-$name-$rate-$rep-$$" --count "$count" \
        --size "$size" --rate "$rate" --acks "$acks" --linger-ms "$linger" --partitions 1 \
        --batch-bytes 1048576 --batch-msgs 10000 >"$dir/$name.$rep.json" \
        2>"$dir/$name.$rep.err" || {
        kp_failed=1
        echo "$name latency run failed:" >&2
        tail -n5 "$dir/$name.$rep.err" >&2
    }
}
run_base() {
    [[ -z "$base" ]] || run_kafkapipe "$1" "$base" kafkapipe-base
}

run_librdkafka() {
    local rep="$1" topic="lat-rdk-$rate-$rep-$$" consumer start end
    "$kp" create-topic --brokers "$broker" --topic "$topic" --partitions 1
    timeout 300 "$rdk" -C -b "$broker" -t "$topic" -p 0 -o beginning -c "$count" -l \
        -A "$dir/rdk-e2e.$rep.us" -i 60000 >"$dir/rdk-consumer.$rep.out" 2>&1 &
    consumer=$!
    sleep 3
    start=$(date +%s.%N)
    timeout 300 "$rdk" -P -b "$broker" -t "$topic" -p 0 -c "$count" -s "$size" -r "$rate" -l \
        -A "$dir/rdk-produce.$rep.us" -a "$racks" -X "linger.ms=$linger" \
        -X batch.size=1048576 -X batch.num.messages=10000 -X enable.idempotence=false \
        -i 60000 >"$dir/rdk-producer.$rep.out" 2>&1 ||
        echo "rdkafka_performance producer failed (see $dir/rdk-producer.$rep.out)" >&2
    end=$(date +%s.%N)
    wait "$consumer" || echo "rdkafka_performance consumer failed (see $dir/rdk-consumer.$rep.out)" >&2
    python3 - "$dir" "$rep" "$start" "$end" "$count" "$rate" "$size" >"$dir/librdkafka.$rep.json" <<'PY' || true
import json, math, sys
d, rep = sys.argv[1], sys.argv[2]
start, end, count, rate, size = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
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
                  "produce": pct(f"{d}/rdk-produce.{rep}.us"), "e2e": pct(f"{d}/rdk-e2e.{rep}.us")}))
PY
    "$kp" delete-topic --brokers "$broker" --topic "$topic" >/dev/null || true
}

for ((rep = 1; rep <= reps; rep++)); do
    # Alternate which client goes first.
    if ((rep % 2 == 0)); then
        [[ -z "$rdk" ]] || run_librdkafka "$rep"
        run_base "$rep"
        run_kafkapipe "$rep"
    else
        run_kafkapipe "$rep"
        run_base "$rep"
        [[ -z "$rdk" ]] || run_librdkafka "$rep"
    fi
done

python3 - "$dir" "$reps" "$rate" "$acks" "$linger" "$count" "$size" "${base:+kafkapipe-base}" "${rdk:+librdkafka}" <<'PY'
import json, os, sys
d, reps, rate, acks, linger, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
peers = ["kafkapipe"] + [p for p in sys.argv[8:] if p]
print(f"{count:,} × {size} B at {rate:,} msgs/s, 1 partition, acks {acks}, linger {linger} ms:")
print()
print("| client | rep | latency from | achieved msgs/s | produce p50 / p99 / p99.9 / max (ms) | "
      "end-to-end p50 / p99 / p99.9 / max (ms) |")
print("| --- | ---: | --- | ---: | --- | --- |")
f = lambda p: "—" if not p else f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} / {p['p999_ms']:.2f} / {p['max_ms']:.2f}"
for rep in range(1, reps + 1):
    for name in peers:
        try:
            r = json.load(open(os.path.join(d, f"{name}.{rep}.json")))
        except (OSError, ValueError):
            print(f"| {name} | {rep} | | | not run or failed | |")
            continue
        if name.startswith("kafkapipe"):
            rows = [("due time (no coordinated omission)", r["produce"], r["e2e"]),
                    ("actual send (librdkafka's basis)", r["produce_from_send"], r["e2e_from_send"])]
        else:
            rows = [("actual send (paced by sleeps)", r["produce"], r["e2e"])]
        for basis, prod, e2e in rows:
            print(f"| {name} | {rep} | {basis} | {r['achieved_rate']:,.0f} | {f(prod)} | {f(e2e)} |")
print()
for rep, name in ((rep, name) for rep in range(1, reps + 1) for name in peers):
    if not name.startswith("kafkapipe"):
        continue
    try:
        r = json.load(open(os.path.join(d, f"{name}.{rep}.json")))
        print(f"{name} rep {rep}: {r['batches']} batches, queue time (first message accepted → "
              f"batch sent) avg {r['queue_time_avg_ms']:.2f} / max {r['queue_time_max_ms']:.2f} ms, "
              f"produce request avg {r['write_time_avg_ms']:.2f} / max {r['write_time_max_ms']:.2f} ms.  ")
    except (OSError, ValueError, KeyError):
        pass
PY
exit "$kp_failed"
