#!/usr/bin/env python3
"""Catch-up reads through the router timed from the client's side (issue 30), with pymongo's
command monitoring: usage ``bench_catchup_first.py EVENTS READS``. Inserts EVENTS documents
spread over 3 shards (as ``bench_catchup.py``), then reads the backlog READS times; prints,
over all reads but the first (it warms the streams), the median events/s, the median time from
opening the stream to the first getMore reply that carries events (how long the client waits
before it has anything to decode), and the median share of the read the client spends inside
its getMores (sending, waiting and decoding: the rest is its own iteration)."""
import os
import statistics
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pymongo import MongoClient, monitoring

from _common import DB, cluster_time, insert_backlog, spread_collection, spread_ids
from shardsim.tools.launcher import Cluster

LOG: list[tuple[str, float, int]] = []  # ("s" sent | "r" replied, perf_counter, events)


class GetMores(monitoring.CommandListener):
    """Records when each getMore was sent and answered, and how many events it brought."""

    def started(self, e):
        if e.command_name == "getMore":
            LOG.append(("s", time.perf_counter(), 0))

    def succeeded(self, e):
        if e.command_name == "getMore":
            LOG.append(("r", time.perf_counter(), len(e.reply["cursor"].get("nextBatch", []))))

    def failed(self, e):
        pass


def main() -> None:
    n, reads = int(sys.argv[1]), int(sys.argv[2])
    with Cluster(shards=3) as cluster:
        client = MongoClient(cluster.router_uri)
        spread_collection(client)
        start = cluster_time(client)
        insert_backlog(client[DB].c0, spread_ids(n))
        mc = MongoClient(cluster.router_uri, event_listeners=[GetMores()])
        rows = []
        for _ in range(reads):
            LOG.clear()
            t = time.perf_counter()
            got = 0
            with mc[DB].watch(batch_size=10000, max_await_time_ms=200,
                              start_at_operation_time=start) as s:
                while got < n:
                    if s.try_next() is not None:
                        got += 1
            el = time.perf_counter() - t
            first = next(ts for k, ts, m in LOG if k == "r" and m) - t
            inside = sum(b[1] - a[1] for a, b in zip(LOG[::2], LOG[1::2]))
            rows.append((n / el, first * 1000, inside / el))
        rows = rows[1:] or rows  # the first read warms the streams
        print(f"ev/s median {statistics.median(r[0] for r in rows):,.0f} (reads: "
              f"{', '.join(f'{r[0] / 1000:.0f}k' for r in rows)}); first events at median "
              f"{statistics.median(r[1] for r in rows):.1f} ms; client inside getMores "
              f"{statistics.median(r[2] for r in rows):.0%} of the read; "
              f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
