#!/usr/bin/env python3
"""librdkafka (confluent-kafka) consumer baseline for benches/consume.rs.

    consume_rdkafka.py --broker 127.0.0.1:PORT --topic T --expect N

Assigns every partition of T at OFFSET_BEGINNING (no group, no commits), consumes N messages
in batches with Consumer.consume(), and prints one JSON line like the Rust bench:
{"client": "librdkafka", "msgs", "bytes", "secs", "msgs_per_sec", "mb_per_sec"}; bytes are
keys plus values, MB is 10^6 bytes. The clock starts at the assignment, as the Rust bench's
starts when its Reader is created. Exits 1 if fewer than N messages arrive within 120 s.
"""
import argparse
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--expect", type=int, required=True)
    args = ap.parse_args()
    consumer = Consumer({
        "bootstrap.servers": args.broker,
        "group.id": f"bench-{time.time_ns()}",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    })
    md = consumer.list_topics(args.topic, timeout=10)
    parts = sorted(md.topics[args.topic].partitions)
    started = time.perf_counter()
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in parts])
    got = 0
    nbytes = 0
    deadline = time.monotonic() + 120
    while got < args.expect and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=10000, timeout=1.0):
            if m.error():
                continue
            got += 1
            k, v = m.key(), m.value()
            nbytes += (len(k) if k else 0) + (len(v) if v else 0)
    secs = time.perf_counter() - started
    consumer.close()
    print(json.dumps({
        "client": "librdkafka",
        "msgs": got,
        "bytes": nbytes,
        "secs": round(secs, 3),
        "msgs_per_sec": round(got / secs),
        "mb_per_sec": round(nbytes / secs / 1e6, 1),
    }))
    return 0 if got >= args.expect else 1


if __name__ == "__main__":
    sys.exit(main())
