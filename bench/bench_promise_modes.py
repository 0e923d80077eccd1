"""Insert-to-event latency through the router with idle shards: ``clock`` vs ``mongod`` promise
modes.

A 3-shard cluster per mode (``python -m shard --promise-mode MODE --noop-interval-ms 1000``);
one watcher on a collection whose writes all land on one shard, so the two other shards (and the
config server) stay idle. Each sample inserts one document at a random moment and measures the
time until the watcher's ``next()`` returns its event. With ``mongod`` an idle shard can only
promise its newest oplog time, which its periodic no-op moves once per interval; with ``clock``
it promises its current cluster time (which the router's getMore gossips to it), so the event
is released as soon as the idle shards have answered once.

Usage: ``python bench/bench_promise_modes.py [--samples N] [--noop-ms MS]``. Prints the median,
p90 and max latency per mode and the ratio mongod/clock. No assertion: figures only.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import pymongo

from shardsim.launcher import Cluster


def measure(mode: str, samples: int, noop_ms: int, seed: int = 7) -> list[float]:
    """Latencies in seconds for ``samples`` single inserts with two idle shards."""
    rng = random.Random(seed)
    args = ["--promise-mode", mode, "--noop-interval-ms", str(noop_ms)]
    with Cluster(shards=3, shard_args=args) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
        try:
            client.admin.command({"shardCollection": "bench.lat", "key": {"k": 1}})
            coll = client.bench.lat
            coll.insert_one({"_id": -1, "k": 0})
            out: list[float] = []
            with coll.watch(max_await_time_ms=1000) as stream:
                stream.try_next()
                for i in range(samples):
                    time.sleep(rng.random() * noop_ms / 1000)
                    t0 = time.perf_counter()
                    coll.insert_one({"_id": i, "k": 0})  # same chunk: the same shard every time
                    change = None
                    while change is None:
                        change = stream.try_next()
                    out.append(time.perf_counter() - t0)
            return out
        finally:
            client.close()


def summary(xs: list[float]) -> str:
    s = sorted(xs)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return (f"median {statistics.median(s) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   "
            f"max {s[-1] * 1000:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--noop-ms", type=int, default=1000)
    a = ap.parse_args()
    results = {}
    for mode in ("clock", "mongod"):
        results[mode] = measure(mode, a.samples, a.noop_ms)
        print(f"{mode:7s} insert-to-event latency, 2 idle shards, noop {a.noop_ms} ms, "
              f"{a.samples} samples: {summary(results[mode])}", flush=True)
    ratio = statistics.median(results["mongod"]) / max(1e-9, statistics.median(results["clock"]))
    print(f"median latency ratio mongod/clock: {ratio:.1f}x")


if __name__ == "__main__":
    main()
