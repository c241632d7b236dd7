#!/usr/bin/env python3
"""A confluent-kafka (librdkafka) consumer group member, for group interop tests.

    group_member.py --broker 127.0.0.1:PORT --topic T --group G --duration SECS
                    [--strategy range|roundrobin] [--protocol classic|consumer]

Subscribes to T in group G with the given assignment strategy (classic protocol) or as
a KIP-848 member (`group.protocol=consumer`: the broker assigns, and the rebalance
callbacks are incremental: "assigned"/"revoked" list only the partitions added/taken
away), commits every message
synchronously after "processing" it, and prints JSON lines: {"assigned": [partitions]},
{"revoked": [partitions]}, {"partition": p, "offset": o}. Leaves the group (close) after
SECS seconds. Exits 2 on a broker error.
"""
import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--strategy", default="range")
    ap.add_argument("--protocol", default="classic", choices=["classic", "consumer"])
    args = ap.parse_args()

    def out(obj):
        print(json.dumps(obj), flush=True)

    config = {
        "bootstrap.servers": args.broker,
        "group.id": args.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 1000,
    }
    if args.protocol == "consumer":
        # the session timeout, heartbeat interval and assignor are the broker's
        config["group.protocol"] = "consumer"
    else:
        config.update({
            "partition.assignment.strategy": args.strategy,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
        })
    consumer = Consumer(config)
    consumer.subscribe(
        [args.topic],
        on_assign=lambda c, ps: out({"assigned": sorted(p.partition for p in ps)}),
        on_revoke=lambda c, ps: out({"revoked": sorted(p.partition for p in ps)}),
    )
    deadline = time.time() + args.duration
    code = 0
    while time.time() < deadline:
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            print(f"error: {msg.error()}", file=sys.stderr)
            if msg.error().fatal():
                code = 2
                break
            continue
        out({"partition": msg.partition(), "offset": msg.offset()})
        consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
