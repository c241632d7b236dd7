#!/usr/bin/env python3
"""librdkafka baseline for benches/throughput.rs: produce N unkeyed messages of S bytes with
confluent-kafka to a fresh topic and print the same JSON line.

    bench_librdkafka.py --broker HOST:PORT --topic T --msgs N --size S
                        [--compression none] [--acks all] [--batch 1000]

The topic must exist. The produce loop runs in Python, so at small message sizes this
measures librdkafka *plus* the CPython call overhead per message (about 1 us); it is the
baseline a Python user gets, not librdkafka's C ceiling.
"""
import argparse
import json
import resource
import sys
import time

from confluent_kafka import Producer


def cpu_secs() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--msgs", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--acks", default="all")
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()

    failures = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    p = Producer({
        "bootstrap.servers": args.broker,
        "compression.type": args.compression,
        "acks": args.acks,
        "linger.ms": 5,
        "batch.num.messages": args.batch,
        "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000,
    })
    value = b"x" * args.size
    cpu0 = cpu_secs()
    start = time.perf_counter()
    for _ in range(args.msgs):
        while True:
            try:
                p.produce(args.topic, value, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.001)
    remaining = p.flush(120)
    secs = time.perf_counter() - start
    cpu = cpu_secs() - cpu0
    if remaining or failures:
        print(f"librdkafka baseline failed: {remaining} undelivered, {failures[:3]}", file=sys.stderr)
        return 1
    total = args.msgs * args.size
    print(json.dumps({
        "client": "librdkafka (confluent-kafka)",
        "msgs": args.msgs, "size": args.size, "bytes": total, "secs": round(secs, 3),
        "msgs_per_sec": round(args.msgs / secs), "mb_per_sec": round(total / secs / 1e6, 2),
        "cpu_secs": round(cpu, 3), "compression": args.compression, "acks": args.acks,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
