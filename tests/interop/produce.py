#!/usr/bin/env python3
"""Produce N messages to a topic with confluent-kafka (librdkafka), for interop tests.

    produce.py --broker 127.0.0.1:PORT --topic T --count N [--compression none|gzip|snappy|lz4|zstd]
               [--partition P] [--prefix STR] [--partitioner NAME] [--header KEY=VALUE ...]

Message i has key "<prefix>key-i", value "<prefix>value-i" and headers
[("h-index", b"i"), ("h-bin", bytes([i % 256, 0, 255]))], then each --header. Exits non-zero if any delivery fails.
Prints one JSON line per delivered message: partition, offset, key, value, timestamp.
"""
import argparse
import json
import sys

from confluent_kafka import KafkaException, Producer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--count", "-n", type=int, required=True)
    ap.add_argument("--compression", default="none",
                    choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--partition", type=int, default=None)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--partitioner", default=None,
                    help="librdkafka partitioner (consistent, consistent_random, murmur2, ...)")
    ap.add_argument("--header", action="append", default=[],
                    help="KEY=VALUE: one more header on every message (e.g. traceparent)")
    args = ap.parse_args()
    extra_headers = [(k, v.encode()) for k, v in (h.split("=", 1) for h in args.header)]

    extra = {"partitioner": args.partitioner} if args.partitioner else {}
    producer = Producer({
        **extra,
        "bootstrap.servers": args.broker,
        "compression.type": args.compression,
        "linger.ms": 5,
        "enable.idempotence": False,
        "acks": "all",
        "message.timeout.ms": int(args.timeout * 1000),
    })
    failures = []
    delivered = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(str(err))
        else:
            delivered.append({
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": msg.key().decode(),
                "value": msg.value().decode(),
                "timestamp": msg.timestamp()[1],
            })

    for i in range(args.count):
        kw = {}
        if args.partition is not None:
            kw["partition"] = args.partition
        producer.produce(
            args.topic,
            key=f"{args.prefix}key-{i}".encode(),
            value=f"{args.prefix}value-{i}".encode(),
            headers=[("h-index", str(i).encode()), ("h-bin", bytes([i % 256, 0, 255]))]
            + extra_headers,
            on_delivery=on_delivery,
            **kw,
        )
        producer.poll(0)
    remaining = producer.flush(args.timeout)
    for d in delivered:
        print(json.dumps(d))
    if remaining or failures or len(delivered) != args.count:
        print(f"produce failed: {remaining} undelivered, errors: {failures[:5]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as e:
        print(f"produce failed: {e}", file=sys.stderr)
        sys.exit(1)
