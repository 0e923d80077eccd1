"""Insert-to-event latency through the router with idle shards: ``clock`` vs ``mongod`` promise
modes.

A 3-shard cluster per mode (``python -m shardsim.shard --promise-mode MODE --noop-interval-ms 1000``);
one watcher on a collection whose writes all land on one shard, so the two other shards (and the
config server) stay idle. Each sample inserts one document at a random moment and measures the
time from just before ``insert_one`` until the watcher's ``try_next()`` returns its event.

When the router holds the event only because the idle shards have not promised past it, it asks
them (``_shardsimAdvanceClusterTime``) for a promise past the event's cluster time. With
``clock`` an idle shard answers its waiting getMore at once with HWM(cluster time + 1); with
``mongod`` it can only promise its newest oplog time, so the event waits for the idle shards'
next periodic no-op (bounded by the no-op interval, as on a real cluster).

Usage: ``python bench/bench_promise_modes.py [--clock-samples N] [--mongod-samples N]
[--noop-ms MS]``. Prints p50/p95/p99/max latency per mode (and, for ``clock``, each process's CPU
per sample) and the ratio mongod/clock of the
medians. No assertion: figures only.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import pymongo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_seconds, insert_then_event, machine  # noqa: E402  (also puts the project root on sys.path)
from shardsim.tools.launcher import Cluster  # noqa: E402


def measure(mode: str, samples: int, noop_ms: int, max_gap_ms: float, seed: int = 7,
            cpu: dict[str, float] | None = None) -> list[float]:
    """Latencies in seconds for ``samples`` single inserts with two idle shards; before each
    insert the bench sleeps a random 0..``max_gap_ms`` so inserts hit every phase of the idle
    shards' await and no-op cycles. ``cpu``, when given, receives each role process's CPU
    seconds over the samples (``client``: this process), idle time between samples included."""
    rng = random.Random(seed)
    args = ["--promise-mode", mode, "--noop-interval-ms", str(noop_ms)]
    with Cluster(shards=3, shard_args=args) as cluster:
        client = pymongo.MongoClient(cluster.router_uri, serverSelectionTimeoutMS=10000)
        try:
            client.admin.command({"shardCollection": "bench.lat", "key": {"k": 1}})
            coll = client.bench.lat
            coll.insert_one({"_id": -1, "k": 0})
            out: list[float] = []
            pids = {p.name: p.proc.pid for p in cluster.processes}
            with coll.watch(max_await_time_ms=1000) as stream:
                stream.try_next()
                before = {k: cpu_seconds([p]) for k, p in pids.items()}
                c0 = time.process_time()
                for i in range(samples):
                    time.sleep(rng.random() * max_gap_ms / 1000)
                    t0, _, t2 = insert_then_event(coll, stream, i)
                    out.append(t2 - t0)
                if cpu is not None:
                    cpu.update({k: cpu_seconds([p]) - before[k] for k, p in pids.items()})
                    cpu["client"] = time.process_time() - c0
            return out
        finally:
            client.close()


def pct(s: list[float], p: float) -> float:
    """The ``p`` percentile (nearest rank) of sorted ``s``."""
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def summary(xs: list[float]) -> str:
    s = sorted(xs)
    return (f"p50 {pct(s, 50) * 1000:7.1f} ms   p95 {pct(s, 95) * 1000:7.1f} ms   "
            f"p99 {pct(s, 99) * 1000:7.1f} ms   max {s[-1] * 1000:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clock-samples", type=int, default=300)
    ap.add_argument("--mongod-samples", type=int, default=30)
    ap.add_argument("--noop-ms", type=int, default=1000)
    a = ap.parse_args()
    print(f"machine: {machine()}", flush=True)
    results = {}
    plan = {"clock": (a.clock_samples, a.noop_ms / 4), "mongod": (a.mongod_samples, a.noop_ms)}
    for mode, (n, gap) in plan.items():
        t0 = time.perf_counter()
        cpu: dict[str, float] = {}
        results[mode] = measure(mode, n, a.noop_ms, gap, cpu=cpu)
        print(f"{mode:7s} insert-to-event latency, 2 idle shards, noop {a.noop_ms} ms, {n} samples "
              f"({time.perf_counter() - t0:.0f} s): {summary(results[mode])}", flush=True)
        if mode == "clock":
            print("        CPU ms per sample (idle gaps included): " + ", ".join(
                f"{k} {v / n * 1000:.2f}" for k, v in sorted(cpu.items())), flush=True)
    ratio = statistics.median(results["mongod"]) / max(1e-9, statistics.median(results["clock"]))
    print(f"p50 latency ratio mongod/clock: {ratio:.1f}x")


if __name__ == "__main__":
    main()
