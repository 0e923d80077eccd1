"""Merged catch-up read of a 3-shard backlog through the router vs reading one shard directly.

Inserts N documents spread over 3 shards, then reads the whole backlog as a change stream
started at the cluster time before the inserts: (a) through the router (merged, N events),
(b) directly from one shard (its N/3 events), and (c) the pymongo client's own ceiling
(decoding the same events from raw BSON). Prints events/s and ratios against (b).
Target (issue 7): (a) >= 100,000 events/s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import bson
from pymongo import MongoClient

from _common import (DB, cluster_time, cpu_seconds, direct_client, insert_backlog, machine, ratio,
                     read_events, spread_collection, spread_ids)
from shardsim.tools.launcher import Cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--reads", type=int, default=3, help="router reads of the same backlog")
    args = ap.parse_args()
    print(f"# bench_catchup  {machine()}")
    with Cluster(shards=3) as cluster:
        client = MongoClient(cluster.router_uri)
        shards = spread_collection(client)
        hosts = {s.name: s.address for s in cluster.shards}
        start = cluster_time(client)
        ids = spread_ids(args.events)
        secs = insert_backlog(client[DB].c0, ids)
        print(f"backlog: {len(ids):,} inserts in {secs:.1f} s")
        pids = {"router": cluster.router.proc.pid,
                **{s.name: s.proc.pid for s in cluster.shards}}
        rates = []
        for i in range(args.reads):
            before = {k: cpu_seconds([p]) for k, p in pids.items()}
            c0 = time.process_time()
            got_r, t_r = read_events(client[DB], len(ids), start_at_operation_time=start)
            client_cpu = time.process_time() - c0
            cpu = {k: cpu_seconds([p]) - before[k] for k, p in pids.items()}
            rates.append(got_r / t_r)
            per_ev = 1e6 / max(got_r, 1)
            print(f"router read {i + 1}: {got_r:,} events in {t_r:.2f} s = {got_r / t_r:,.0f} ev/s; "
                  f"CPU us/event: client {client_cpu * per_ev:.1f}, router {cpu['router'] * per_ev:.1f}, "
                  f"shards {sum(v for k, v in cpu.items() if k != 'router') * per_ev:.1f}")
        t_r = got_r / statistics.median(rates)
        per_shard = len(ids) // len(shards)
        sh = direct_client(hosts[shards[0]])
        got_d, t_d = read_events(sh[DB], per_shard, start_at_operation_time=start)
        # client ceiling: decode the same number of raw change events
        sample = []
        with client[DB].watch(start_at_operation_time=start, batch_size=10000) as s:
            for _ in range(min(10000, len(ids))):
                sample.append(bson.encode(s.next()))
        raw = b"".join(sample)
        reps = max(1, len(ids) // len(sample))
        t = time.perf_counter()
        for _ in range(reps):
            bson.decode_all(raw)
        t_c = time.perf_counter() - t
        rate_r, rate_d, rate_c = got_r / t_r, got_d / t_d, reps * len(sample) / t_c
        print(f"router merged catch-up : {got_r:>8,} events in {t_r:6.2f} s = {rate_r:>10,.0f} ev/s "
              f"({ratio(rate_r, rate_d)} of direct; median of {args.reads} reads)")
        print(f"one shard direct (base): {got_d:>8,} events in {t_d:6.2f} s = {rate_d:>10,.0f} ev/s (1.00x)")
        print(f"pymongo decode ceiling : {reps * len(sample):>8,} events in {t_c:6.2f} s = {rate_c:>10,.0f} ev/s "
              f"({ratio(rate_c, rate_d)} of direct)")


if __name__ == "__main__":
    main()
