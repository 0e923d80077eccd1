"""RSS of a durable shard whose oplog holds 1 GiB of entries (``shard/oplog_disk.py``).

Starts one shard process with ``--dbpath`` (loopback only), fills its oplog with ``--gib`` GiB
of large entries (``replace_one`` of a ``--doc-kb`` KB document on a few ``_id``s, so the
collection itself stays small and the run is quick), and prints the shard's RSS (VmRSS of
``/proc/<pid>/status``) at start, after the fill, after a change stream read every event from
the oldest entry, after a ``kill -9`` and restart, and after the same read once more; plus the
fill, restart and read times. ``--cache-mb`` is the oplog cache (``--oplog-cache-mb``).
Usage: ``python bench/bench_oplog_memory.py [--gib 1] [--doc-kb 200] [--cache-mb 64]``.
Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from pymongo import MongoClient

from _common import machine
from shardsim.tools.procs import RoleProcess


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start(dbpath: str, cache_mb: float, size_mb: float) -> tuple[RoleProcess, MongoClient]:
    proc = RoleProcess("shard", ["--port", "0", "--shard-name", "bench0", "--dbpath", dbpath,
                                 "--oplog-cache-mb", str(cache_mb),
                                 "--oplog-size-mb", str(size_mb)], name="bench0").start()
    client = MongoClient(f"mongodb://{proc.address}/?directConnection=true",
                         serverSelectionTimeoutMS=10000)
    client.admin.command("ping")
    return proc, client


def read_all(client: MongoClient) -> tuple[int, float]:
    """Read every event of bench.items from the oldest oplog entry; (events, seconds)."""
    first = client.local["oplog.rs"].find().sort("$natural", 1).limit(1).next()["ts"]
    t = time.perf_counter()
    n = 0
    with client.bench.items.watch(start_at_operation_time=first, max_await_time_ms=300) as cs:
        while cs.try_next() is not None:
            n += 1
    return n, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=1.0, help="oplog bytes to write (GiB)")
    ap.add_argument("--doc-kb", type=int, default=200, help="document size (KB)")
    ap.add_argument("--cache-mb", type=float, default=64.0, help="--oplog-cache-mb")
    args = ap.parse_args()
    print(machine())
    target = int(args.gib * 2**30)
    size_mb = max(990.0, args.gib * 1024 * 1.1)  # no truncation during the run
    with tempfile.TemporaryDirectory(prefix="bench-oplog-") as dbpath:
        proc, client = start(dbpath, args.cache_mb, size_mb)
        try:
            print(f"start: RSS {rss_mb(proc.pid):.0f} MB")
            pad = "x" * (args.doc_kb * 1000)
            t = time.perf_counter()
            writes = 0
            while True:
                for _ in range(50):
                    client.bench.items.replace_one({"_id": writes % 4},
                                                   {"_id": writes % 4, "v": writes, "pad": pad},
                                                   upsert=True)
                    writes += 1
                st = client.admin.command("serverStatus")["oplog"]
                if st["sizeBytes"] >= target:
                    break
            fill_s = time.perf_counter() - t
            print(f"filled: {writes} writes, oplog {st['sizeBytes'] / 2**20:.0f} MiB in "
                  f"{st['entries']} entries ({st['cachedEntries']} cached, "
                  f"{st['cachedBytes'] / 2**20:.1f} MiB) in {fill_s:.1f} s; "
                  f"RSS {rss_mb(proc.pid):.0f} MB")
            n, read_s = read_all(client)
            print(f"read from the oldest entry: {n} events in {read_s:.1f} s "
                  f"({n * args.doc_kb / 1000 / read_s:.0f} MB/s); RSS {rss_mb(proc.pid):.0f} MB")
            client.close()
            proc.kill()
            t = time.perf_counter()
            proc, client = start(dbpath, args.cache_mb, size_mb)
            restart_s = time.perf_counter() - t
            st = client.admin.command("serverStatus")["oplog"]
            print(f"restart (kill -9): ready in {restart_s:.1f} s, {st['entries']} entries, "
                  f"{st['cachedEntries']} cached; RSS {rss_mb(proc.pid):.0f} MB")
            n, read_s = read_all(client)
            print(f"read again after the restart: {n} events in {read_s:.1f} s; "
                  f"RSS {rss_mb(proc.pid):.0f} MB")
        finally:
            client.close()
            proc.stop()


if __name__ == "__main__":
    main()
