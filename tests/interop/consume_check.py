#!/usr/bin/env python3
"""Consume a topic from the beginning with confluent-kafka (librdkafka), for interop tests.

    consume_check.py --broker 127.0.0.1:PORT --topic T --expect N [--timeout SECS]

Assigns every partition at OFFSET_BEGINNING (no group join, no offset commit) and prints one
JSON line per message: partition, offset, key, value, headers, timestamp, timestamp_type.
Bytes are decoded as UTF-8 where possible; otherwise given as {"hex": "..."}.
Exits 0 once N messages arrived, 1 if fewer arrived within the timeout, 2 on a broker error.
"""
import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, KafkaException

from assign_all import assign_all_from_beginning


def enc(b):
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--isolation", default="read_uncommitted",
                    choices=["read_uncommitted", "read_committed"])
    args = ap.parse_args()

    consumer = Consumer({
        "bootstrap.servers": args.broker,
        "group.id": f"consume-check-{time.time_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": args.isolation,
        "enable.partition.eof": False,
    })
    deadline = time.monotonic() + args.timeout
    try:
        if not assign_all_from_beginning(consumer, args.topic, deadline):
            return 2
        got = 0
        while got < args.expect and time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                print(f"consume error: {msg.error()}", file=sys.stderr)
                if msg.error().fatal() or not msg.error().retriable():
                    return 2
                continue
            ts_type, ts = msg.timestamp()
            print(json.dumps({
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": enc(msg.key()),
                "value": enc(msg.value()),
                "headers": [[k, enc(v)] for k, v in (msg.headers() or [])],
                "timestamp": ts,
                "timestamp_type": ts_type,
            }), flush=True)
            got += 1
        if got < args.expect:
            print(f"only {got} of {args.expect} messages within {args.timeout}s", file=sys.stderr)
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
