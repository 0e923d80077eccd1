"""Cost of 0 (baseline), 1, 10 and 100 concurrent idle watchers on write throughput.

The watchers run as threads in a separate process (so their client CPU is not charged to the
writer) and watch a collection that receives no writes: every write still goes through the
shards' oplog scans and the router's merge for each open stream, but no event is delivered.
The writer bulk-inserts through the router. Prints ops/s and ratio against 0 watchers.
Target (issue 7): 100 idle watchers cost <= 2x on write throughput.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time

from pymongo import MongoClient

from _common import DB, insert_backlog, machine, spread_collection, spread_ids
from shardsim.tools.launcher import Cluster


def _watchers(uri: str, n: int, ready, stop) -> None:
    client = MongoClient(uri, maxPoolSize=n + 10)
    opened = []
    lock = threading.Lock()

    def one() -> None:
        with client[DB]["idle"].watch(max_await_time_ms=1000) as s:
            with lock:
                opened.append(1)
            while not stop.is_set():
                s.try_next()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    while len(opened) < n:
        time.sleep(0.05)
    ready.set()
    stop.wait()
    for t in threads:
        t.join(5)
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=30_000)
    ap.add_argument("--counts", default="0,1,10,100")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point; the median is shown")
    args = ap.parse_args()
    print(f"# bench_watchers  {machine()}")
    ctx = mp.get_context("spawn")
    with Cluster(shards=3) as cluster:
        client = MongoClient(cluster.router_uri)
        spread_collection(client)
        base = None
        for n in [int(x) for x in args.counts.split(",")]:
            proc = None
            stop = ctx.Event()
            if n:
                ready = ctx.Event()
                proc = ctx.Process(target=_watchers, args=(cluster.router_uri, n, ready, stop), daemon=True)
                proc.start()
                if not ready.wait(120):
                    print(f"{n:>3} watchers: could not open them in time")
                    stop.set()
                    proc.kill()
                    continue
                time.sleep(1.0)
            rates = []
            for _ in range(args.repeat):
                client[DB].c0.delete_many({})
                rates.append(args.docs / insert_backlog(client[DB].c0, spread_ids(args.docs)))
            rate = sorted(rates)[len(rates) // 2]
            base = base or rate
            print(f"{n:>3} idle watchers: {rate:>9,.0f} ops/s ({rate / base:.2f}x of 0 watchers; "
                  f"cost {base / rate:.2f}x)")
            stop.set()
            if proc:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()


if __name__ == "__main__":
    main()
