"""Shared helpers of the benchmarks: machine description, a cluster with a spread collection,
backlog inserts and timed change-stream reads. Figures only; nothing here asserts timings."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import Any

from pymongo import InsertOne, MongoClient

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardsim.tools.load.cluster import list_shards, prepare  # noqa: E402
from shardsim.tools.load.plan import KEY_SPACE, PlanSpec  # noqa: E402

DB = "bench"


def machine() -> str:
    """One line: cores, memory, Python and pymongo versions."""
    import pymongo

    try:
        mem = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.splitlines()[1].split()[1]
    except Exception:  # noqa: BLE001 - informational only
        mem = "?"
    return (f"nproc={os.cpu_count()} mem={mem} python={platform.python_version()} "
            f"pymongo={pymongo.version} {platform.machine()}")


def spread_collection(client: MongoClient, coll: str = "c0", db: str = DB) -> list[str]:
    """Shard ``db.coll`` on {_id: 1} with one chunk per shard (equal ranges of [0, 2**31));
    returns the shard names in range order."""
    spec = PlanSpec(ops=0, db=db, collections=int(coll[1:]) + 1)
    prepare(client, spec)
    return sorted(list_shards(client))


def spread_ids(n: int) -> list[int]:
    """``n`` ids spread evenly over [0, 2**31) (so over the chunks of spread_collection)."""
    step = KEY_SPACE // max(n, 1)
    return [i * step for i in range(n)]


def insert_backlog(coll: Any, ids: list[int], pad: int = 64, batch: int = 1000) -> float:
    """Insert one small document per id (bulk, unordered); returns seconds taken."""
    t = time.perf_counter()
    pad_s = "x" * pad
    for i in range(0, len(ids), batch):
        coll.bulk_write([InsertOne({"_id": k, "pad": pad_s}) for k in ids[i:i + batch]], ordered=False)
    return time.perf_counter() - t


def read_events(stream_target: Any, n: int, timeout: float = 120.0, **watch_kw: Any) -> tuple[int, float]:
    """Open ``stream_target.watch(**watch_kw)`` and read until ``n`` events (or timeout);
    returns (events read, seconds from open to the n-th event)."""
    got = 0
    t = time.perf_counter()
    with stream_target.watch(batch_size=watch_kw.pop("batch_size", 10000), max_await_time_ms=200,
                             **watch_kw) as stream:
        deadline = time.monotonic() + timeout
        while got < n and time.monotonic() < deadline:
            if stream.try_next() is not None:
                got += 1
    return got, time.perf_counter() - t


def cluster_time(client: MongoClient):
    """The router's current operationTime (a Timestamp) — a start point for a backlog read."""
    return client.admin.command("ping")["operationTime"]


def direct_client(host: str) -> MongoClient:
    return MongoClient(f"mongodb://{host}/?directConnection=true")


def ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}x" if base else "n/a"


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds ``pids`` have run so far, all threads (``/proc/PID/task/*/schedstat``:
    nanosecond run time, unlike the tick-sampled ``stat``; 0 where unreadable)."""
    total = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def insert_then_event(coll: Any, stream: Any, i: int,
                      clock: Any = time.perf_counter) -> tuple[Any, Any, Any]:
    """One latency sample: insert ``{_id: i, k: 0}`` into ``coll`` (the latency benches' shard
    key ``k``: always the same chunk, so the same shard) and read ``stream`` until its event.
    Returns ``clock()`` before the insert, after it, and when the event arrived."""
    t0 = clock()
    coll.insert_one({"_id": i, "k": 0})
    t1 = clock()
    change = None
    while change is None:
        change = stream.try_next()
    t2 = clock()
    assert change["documentKey"]["_id"] == i
    return t0, t1, t2
