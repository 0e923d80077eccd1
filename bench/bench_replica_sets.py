"""Replica-set shards in the test kit (issue 24): what a 3-member shard costs against a
1-member one, measured in the same run.

* start: ``AsyncShardedCluster(shards=3, members=M).start()`` for M = 1 and 3 (best of
  ``--starts``; 3 x 3 includes the first elections and every member knowing its primary; with
  M = 3 the config server is a 3-member set too), and the same with the processes of
  ``shardsim up --shards 3 --members M`` (:class:`shardsim.tools.launcher.Cluster`, started
  until its router answers ``ping``; best of ``--process-starts``);
* insert-to-event: a ``w: "majority"`` insert through the router and the change event it makes
  on an open stream, p50 and p99 over ``--samples`` inserts, for M = 1 and 3 (the 3-member
  event waits for the commit point: a secondary fetches the entry, reports its position, and
  the primary's commit point passes it).

Prints the figures and the ratios 3-member / 1-member; no target is asserted here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import pymongo

from _common import machine
from shardsim.testing import AsyncShardedCluster, ShardedCluster
from shardsim.tools.launcher import Cluster


async def _start_time(members: int) -> float:
    c = AsyncShardedCluster(shards=3, members=members, seed=1)
    t0 = time.perf_counter()
    await c.start()
    took = time.perf_counter() - t0
    await c.stop()
    return took


def _process_start_time(members: int) -> float:
    t0 = time.perf_counter()
    c = Cluster(shards=3, members=members).start()
    try:
        with pymongo.MongoClient(c.router_uri, serverSelectionTimeoutMS=30000) as client:
            client.admin.command("ping")
        return time.perf_counter() - t0
    finally:
        c.stop()


def _latencies(members: int, samples: int) -> list[float]:
    with ShardedCluster(shards=2, members=members, seed=2) as cluster:
        client = cluster.client()
        coll = client.get_database("bench", write_concern=pymongo.WriteConcern("majority")).c
        coll.insert_one({"_id": "warm"})
        out: list[float] = []
        with coll.watch(max_await_time_ms=50) as stream:
            for i in range(samples):
                t0 = time.perf_counter()
                coll.insert_one({"_id": i})
                while True:
                    ev = stream.try_next()
                    if ev is not None:
                        break
                out.append((time.perf_counter() - t0) * 1000)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--process-starts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args()
    print(f"# bench_replica_sets  {machine()}")
    starts = {m: min(asyncio.run(_start_time(m)) for _ in range(args.starts)) for m in (1, 3)}
    print(f"kit start, 3 shards x 1 member: {starts[1]:.2f} s   x 3 members: {starts[3]:.2f} s"
          f"   ratio {starts[3] / starts[1]:.2f}")
    procs = {m: min(_process_start_time(m) for _ in range(args.process_starts)) for m in (1, 3)}
    print(f"shardsim up start, 3 shards x 1 member: {procs[1]:.2f} s   x 3 members: "
          f"{procs[3]:.2f} s   ratio {procs[3] / procs[1]:.2f}")
    lat = {m: _latencies(m, args.samples) for m in (1, 3)}
    for m in (1, 3):
        q = statistics.quantiles(lat[m], n=100)
        print(f"insert(w:majority)-to-event, {m} member(s): p50 {statistics.median(lat[m]):.2f} ms"
              f"  p99 {q[98]:.2f} ms")
    print(f"ratio 3/1: p50 {statistics.median(lat[3]) / statistics.median(lat[1]):.2f}")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
