#!/usr/bin/env python3
"""Read a topic back with confluent-kafka (librdkafka) and check per-key order, for interop tests.

    order_check.py --broker 127.0.0.1:PORT --topic T --expect N [--timeout SECS]

Every message's value is its key's counter (a decimal number, counting from 0 for each key).
Assigns every partition at OFFSET_BEGINNING (no group, no commit), reads N messages and prints
one JSON line: {"count", "violations", "duplicates", "missing", "examples"}, where a violation
is a message of a partition whose counter is not above the last one of its key in that
partition ("p0@200 key k0: 17 after 2994"), a duplicate a (key, counter) read twice, and
missing the (key, counter) pairs below a key's highest counter that never came.
Exits 0 after printing (the caller judges the numbers), 1 if fewer than N messages arrived
within the timeout, 2 on a broker error.
"""
import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException

from assign_all import assign_all_from_beginning


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    consumer = Consumer({
        "bootstrap.servers": args.broker,
        "group.id": f"order-check-{time.time_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    })
    deadline = time.monotonic() + args.timeout
    try:
        if not assign_all_from_beginning(consumer, args.topic, deadline):
            return 2
        last = {}  # (partition, key) -> last counter
        seen = set()
        highest = {}  # key -> highest counter
        count = violations = duplicates = 0
        examples = []
        while count < args.expect and time.monotonic() < deadline:
            msgs = consumer.consume(10000, min(0.5, max(0.0, deadline - time.monotonic())))
            for msg in msgs:
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    print(f"consume error: {msg.error()}", file=sys.stderr)
                    if msg.error().fatal() or not msg.error().retriable():
                        return 2
                    continue
                count += 1
                key = (msg.key() or b"").decode("utf-8", "replace")
                counter = int(msg.value())
                p = msg.partition()
                before = last.get((p, key))
                if before is not None and counter <= before:
                    violations += 1
                    if len(examples) < 10:
                        examples.append(f"p{p}@{msg.offset()} key {key}: {counter} after {before}")
                last[(p, key)] = counter
                if (key, counter) in seen:
                    duplicates += 1
                seen.add((key, counter))
                highest[key] = max(highest.get(key, -1), counter)
        missing = sum(h + 1 for h in highest.values()) - len(seen)
        print(json.dumps({
            "count": count,
            "violations": violations,
            "duplicates": duplicates,
            "missing": missing,
            "examples": examples,
        }), flush=True)
        if count < args.expect:
            print(f"only {count} of {args.expect} messages within {args.timeout}s", file=sys.stderr)
            return 1
        return 0
    finally:
        consumer.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as e:
        print(f"consume failed: {e}", file=sys.stderr)
        sys.exit(2)
