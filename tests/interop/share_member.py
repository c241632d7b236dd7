#!/usr/bin/env python3
"""A share-group member on librdkafka (confluent-kafka's ShareConsumer), a peer for
tests/share_broker.rs.

    share_member.py BOOTSTRAP GROUP TOPIC STOP_FILE SLEEP_MS [REJECT_EVERY]

Subscribes to TOPIC in share group GROUP (explicit acknowledgement); for every record
sleeps SLEEP_MS, prints "value<TAB>delivery_count" and acknowledges it (ACCEPT), then
commits after each poll. With REJECT_EVERY = N > 0, a record whose value is "r<i>" with
i % N == N - 3 is rejected instead and printed "rejected<TAB>value". Stops (closing the consumer: leaves the group) once STOP_FILE
exists.
"""
import os
import sys
import time

from confluent_kafka import AcknowledgeType, ShareConsumer


def main():
    bootstrap, group, topic, stop, sleep_ms = sys.argv[1:6]
    every = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    c = ShareConsumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "librdkafka-share-member",
        "share.acknowledgement.mode": "explicit",
    })
    c.subscribe([topic])
    print("librdkafka share member subscribed", file=sys.stderr, flush=True)
    while not os.path.exists(stop):
        msgs = c.poll(0.2)
        got = False
        for m in msgs if msgs is not None else []:
            if m is None or m.error():
                continue
            if int(sleep_ms) > 0:
                time.sleep(int(sleep_ms) / 1000)
            value = (m.value() or b"").decode()
            count = m.delivery_count() if hasattr(m, "delivery_count") else 0
            if rejects(value, every):
                c.acknowledge(m, AcknowledgeType.REJECT)
                print(f"rejected\t{value}", flush=True)
            else:
                print(f"{value}\t{count}", flush=True)
                c.acknowledge(m)
            got = True
        if got:
            c.commit_sync()
    c.close()


def rejects(value, every):
    """The test's rejection rule: "r<i>" with i % every == every - 3."""
    if every <= 0 or not value.startswith("r") or not value[1:].isdigit():
        return False
    return int(value[1:]) % every == every - 3


if __name__ == "__main__":
    main()
