"""Queries at the speed of an index (issue 29): find/sort/count/$group costs on one shard.

One cluster with one shard; every query goes to the shard's own port (an unsharded collection,
so the figures are the shard's planner and executor, not the router's). The floor is
``find_one({_id: k})`` measured in the same run (a round trip plus the ``_id`` look-up); every
other figure is printed in ms and as a ratio to that floor. Figures only: nothing here asserts
a timing.

* find_one on an indexed field ``a`` at 1k and at 100k documents (an index: about the floor at
  both sizes; a scan: grows with the collection);
* ``find({a: {$gte: x}}).sort({a: 1}).limit(10)`` at 100k (sort from the index, stops at 10);
* the scan cost per document of a simple equality on an unindexed field (no match: every
  document is read), µs per document;
* ``$group`` by a field of 10 values over 20k documents, µs per document;
* ``count_documents({})`` at 1k and at 100k.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any, Callable

from pymongo import InsertOne

from _common import direct_client, machine, ratio
from shardsim.tools.launcher import Cluster

DB = "bench_ix"


def fill(coll: Any, n: int, batch: int = 2000) -> None:
    coll.drop()
    coll.create_index("a")
    for at in range(0, n, batch):
        coll.bulk_write([InsertOne({"_id": i, "a": i * 7 % n, "b": i, "g": i % 10,
                                    "pad": "x" * 32}) for i in range(at, min(n, at + batch))],
                        ordered=False)


def timed(fn: Callable[[int], Any], budget: float = 1.5, least: int = 3) -> float:
    """Median seconds of one call of ``fn(i)`` over at least ``least`` calls / ``budget`` s."""
    times = []
    start = time.perf_counter()
    i = 0
    while i < least or (time.perf_counter() - start < budget and i < 2000):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
        i += 1
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--large", type=int, default=100_000)
    ap.add_argument("--group", type=int, default=20_000)
    args = ap.parse_args()
    print(f"# bench_indexes  {machine()}")
    with Cluster(shards=1) as cluster:
        client = direct_client(cluster.shards[0].address)
        small, large, grp = client[DB].small, client[DB].large, client[DB].grp
        fill(small, args.small)
        fill(large, args.large)
        fill(grp, args.group)
        rnd = random.Random(1)
        floor = timed(lambda i: large.find_one({"_id": rnd.randrange(args.large)}))
        rows: list[tuple[str, float]] = [
            ("find_one {a: k} indexed, small", timed(
                lambda i: small.find_one({"a": rnd.randrange(args.small)}))),
            ("find_one {a: k} indexed, large", timed(
                lambda i: large.find_one({"a": rnd.randrange(args.large)}))),
            ("find {a: {$gte: x}} sort a limit 10, large", timed(
                lambda i: list(large.find({"a": {"$gte": rnd.randrange(args.large)}})
                               .sort("a", 1).limit(10)))),
            ("count_documents({}), small", timed(lambda i: small.count_documents({}))),
            ("count_documents({}), large", timed(lambda i: large.count_documents({}))),
        ]
        print(f"{'find_one {_id: k} (floor)':<46}: {floor * 1e3:9.3f} ms (1.00x)")
        for name, secs in rows:
            print(f"{name:<46}: {secs * 1e3:9.3f} ms ({ratio(secs, floor)})")
        scan = timed(lambda i: grp.find_one({"b": -1}))
        group = timed(lambda i: list(grp.aggregate([{"$group": {"_id": "$g",
                                                                "n": {"$sum": 1}}}])))
        print(f"{'scan, equality on an unindexed field':<46}: "
              f"{(scan - floor) / args.group * 1e6:9.3f} us/doc ({args.group:,} docs, "
              f"{scan * 1e3:.1f} ms)")
        print(f"{'$group by g (10 groups)':<46}: "
              f"{(group - floor) / args.group * 1e6:9.3f} us/doc ({args.group:,} docs, "
              f"{group * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
