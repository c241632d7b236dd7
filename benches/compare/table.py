#!/usr/bin/env python3
"""Medians of benches/compare/run.sh's results.tsv as one Markdown table.

Columns of results.tsv: op count size codec acks partitions client rep wall user sys
max_rss_kb status [minor_faults]. CPU = user + sys of the client process; minor faults = ru_minflt of the client (wait4). Ratio = the peer's median CPU
divided by kafkapipe's on the same workload (above 1: kafkapipe is cheaper).
"""
import statistics
import sys
from collections import OrderedDict

ORDER = ["kafkapipe", "kafkapipe-nocrc", "kafkapipe-metrics", "librdkafka", "kafka-go", "franz-go", "java"]


def main(path):
    groups = OrderedDict()
    failed = {}
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 13:
                continue
            op, count, size, codec, acks, parts, client, _rep = cols[:8]
            key = (op, int(count), int(size), codec, acks, int(parts))
            if cols[12] != "ok":
                failed[key + (client,)] = failed.get(key + (client,), 0) + 1
                groups.setdefault(key, {}).setdefault(client, [])
                continue
            wall, user, sys_, rss = float(cols[8]), float(cols[9]), float(cols[10]), int(cols[11])
            faults = int(cols[13]) if len(cols) > 13 and cols[13] else -1
            groups.setdefault(key, {}).setdefault(client, []).append((wall, user + sys_, rss, faults))

    print("| workload | op | client | CPU-s / M msgs (min–max) | msgs/s | MB/s | peak RSS MB | "
          "minor faults / M msgs | CPU ratio (peer ÷ kafkapipe) | runs |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, clients in groups.items():
        op, count, size, codec, acks, parts = key
        workload = f"{count // 1000}k × {size} B, {codec}, " + (
            f"acks {acks}, " if op == "produce" else "") + f"{parts} part."
        ours = clients.get("kafkapipe") or []
        ours_cpu = statistics.median(r[1] for r in ours) if ours else None
        for client in sorted(clients, key=lambda c: ORDER.index(c) if c in ORDER else 99):
            runs = clients[client]
            bad = failed.get(key + (client,), 0)
            if not runs:
                print(f"| {workload} | {op} | {client} | failed | | | | | | 0/{bad} |")
                continue
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            lo, hi = min(r[1] for r in runs), max(r[1] for r in runs)
            spread = f" ({lo / count * 1e6:.2f}–{hi / count * 1e6:.2f})" if len(runs) > 1 else ""
            rss = statistics.median(r[2] for r in runs) / 1024
            known = [r[3] for r in runs if r[3] >= 0]
            faults = f"{statistics.median(known) / count * 1e6:,.0f}" if known else "?"
            ratio = "—" if client == "kafkapipe" or not ours_cpu else f"{cpu / ours_cpu:.2f}"
            rate = count / wall if wall > 0 else float("inf")
            mb = count * size / wall / 1e6 if wall > 0 else float("inf")
            name = f"**{client}**" if client == "kafkapipe" else client
            n = f"{len(runs)}" + (f" ({bad} failed)" if bad else "")
            print(f"| {workload} | {op} | {name} | {cpu / count * 1e6:.2f}{spread} | {rate:,.0f} | "
                  f"{mb:.1f} | {rss:.0f} | {faults} | {ratio} | {n} |")


if __name__ == "__main__":
    main(sys.argv[1])
