#!/usr/bin/env python3
"""Produce transactions with confluent-kafka (librdkafka), for read_committed tests.

    txn_produce.py --broker 127.0.0.1:PORT --topic T --partition P --txns commit:5,abort:5,commit:5
    txn_produce.py ... --producers 3 --rounds 20 --partitions 2

The first form: each transaction writes its count of messages to partition P with values
"<txn index>-<i>" (txn index from 0) and then commits or aborts.

The second form interleaves transactions: N producers (their own transactional ids) each
open a transaction per round, write to every partition in turn, one message at a time
round robin across the producers (so their records interleave in each partition's log),
then end them — producer k's transaction of round r aborts when (k + r) % 3 == 0, commits
otherwise. Values are "p<k>-r<r>-q<partition>-<i>". Prints the committed values, one per line, on
stdout. Exits non-zero on any failure.
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
    ap.add_argument("--txns")
    ap.add_argument("--producers", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--per-partition", type=int, default=5)
    args = ap.parse_args()
    if args.producers:
        return interleaved(args)

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


def interleaved(args) -> int:
    producers = []
    for k in range(args.producers):
        p = Producer({
            "bootstrap.servers": args.broker,
            "transactional.id": f"kafkapipe-test-{os.getpid()}-{k}",
            "linger.ms": 0,
        })
        p.init_transactions(30)
        producers.append(p)
    committed = []
    for r in range(args.rounds):
        for p in producers:
            p.begin_transaction()
        for part in range(args.partitions):
            for i in range(args.per_partition):
                for k, p in enumerate(producers):
                    p.produce(args.topic, value=f"p{k}-r{r}-q{part}-{i}".encode(), partition=part)
                    p.flush(30)  # one at a time: the producers' records interleave
        for k, p in enumerate(producers):
            if (k + r) % 3 == 0:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
                for part in range(args.partitions):
                    committed.extend(f"p{k}-r{r}-q{part}-{i}" for i in range(args.per_partition))
    for v in committed:
        print(v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
