"""Start-up time of a 3-shard cluster: in process (shardsim.testing.ShardedCluster) vs as
processes (shardsim.tools.launcher.Cluster, what ``shardsim up`` runs), in the same run.

"Ready" is the moment a fresh pymongo client's ``ping`` through the router returns, measured
from just before ``start()``; stopping is timed too. Each variant runs ``--repeat`` times
(the in-process one first once more, reported as cold: it imports the role modules); prints the median
and the ratio. Usage: ``python bench/bench_testkit_start.py [--shards 3] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from pymongo import MongoClient

from _common import machine
from shardsim.tools.launcher import Cluster
from shardsim.testing import ShardedCluster


def ready(uri: str) -> None:
    with MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        client.admin.command("ping")


def in_process(shards: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    c = ShardedCluster(shards=shards).start()
    ready(c.uri)
    t1 = time.perf_counter()
    c.stop()
    return t1 - t0, time.perf_counter() - t1


def processes(shards: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    c = Cluster(shards=shards).start()
    ready(c.router_uri)
    t1 = time.perf_counter()
    c.stop()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(machine())
    cold = in_process(args.shards)[0]  # the first start also imports the role modules
    print(f"{'in-process, first (cold)':28s} ready {cold * 1000:7.0f} ms")
    rows = {}
    for name, fn in (("in-process ShardedCluster", in_process), ("processes (shardsim up)", processes)):
        runs = [fn(args.shards) for _ in range(args.repeat)]
        rows[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        print(f"{name:28s} ready {rows[name][0] * 1000:7.0f} ms   stop {rows[name][1] * 1000:6.0f} ms"
              f"   (median of {args.repeat}, {args.shards} shards)")
    a, b = rows["in-process ShardedCluster"][0], rows["processes (shardsim up)"][0]
    print(f"ratio processes / in-process start: {b / a:.1f}x")


if __name__ == "__main__":
    main()
