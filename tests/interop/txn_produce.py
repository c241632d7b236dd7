#!/usr/bin/env python3
"""Produce transactions with confluent-kafka (librdkafka), for read_committed tests.

    txn_produce.py --broker 127.0.0.1:PORT --topic T --partition P --txns commit:5,abort:5,commit:5

Each transaction writes its count of messages to partition P with values "<txn index>-<i>"
(txn index from 0) and then commits or aborts. Exits non-zero on any failure.
"""
import argparse
import os
import sys

from confluent_kafka import Producer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partition", type=int, default=0)
    ap.add_argument("--txns", required=True)
    args = ap.parse_args()

    producer = Producer({
        "bootstrap.servers": args.broker,
        "transactional.id": f"kafkapipe-test-{os.getpid()}",
        "linger.ms": 5,
    })
    producer.init_transactions(30)
    for t, spec in enumerate(args.txns.split(",")):
        end, count = spec.split(":")
        producer.begin_transaction()
        for i in range(int(count)):
            producer.produce(args.topic, value=f"{t}-{i}".encode(), partition=args.partition)
        producer.flush(30)
        if end == "commit":
            producer.commit_transaction(30)
        elif end == "abort":
            producer.abort_transaction(30)
        else:
            print(f"unknown transaction end {end!r}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
