"""Shared by the interop readers: assign every partition of a topic at its beginning."""
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition


def assign_all_from_beginning(consumer, topic, deadline):
    """Wait (until `deadline`, a time.monotonic() value) for `topic`'s metadata, then assign
    every partition at OFFSET_BEGINNING (no group join, no commit). Returns False, after
    saying why on stderr, if the topic did not appear."""
    md = None
    while time.monotonic() < deadline:
        md = consumer.list_topics(topic, timeout=5)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions:
            break
        time.sleep(0.1)
    t = md.topics.get(topic) if md else None
    if t is None or t.error is not None or not t.partitions:
        print(f"topic {topic} not found: {t.error if t else None}", file=sys.stderr)
        return False
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(t.partitions)])
    return True
