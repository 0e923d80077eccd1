"""Delivered events/s vs number of shards (1, 2, 4, 8).

For each shard count a fresh cluster; a collection spread over all shards; N inserts written
through the router while one watcher reads the merged stream live. Prints write ops/s and
delivered events/s (first event to last) with ratios against 1 shard. On a 2-core machine more
shard processes share the same cores, so this shows the merge's overhead, not scale-out.

The delivered rate cannot exceed the write rate, so it also prints the same N inserts written
first with no watcher open (another collection, same cluster) and delivered / unwatched writes:
when the stream keeps up, a lower delivered rate with more shards is the writes' fan-out to
more processes on the same cores, not the stream.
"""

from __future__ import annotations

import argparse
import threading
import time

from pymongo import MongoClient

from _common import DB, insert_backlog, machine, spread_collection, spread_ids
from shardsim.tools.launcher import Cluster


def run(nshards: int, docs: int) -> tuple[float, float, int, float]:
    """(write ops/s with the watcher, delivered ev/s, events, write ops/s with no watcher)."""
    with Cluster(shards=nshards) as cluster:
        client = MongoClient(cluster.router_uri)
        spread_collection(client, "c1")  # c0 and c1, each spread over every shard
        unwatched = docs / insert_backlog(client[DB].c1, spread_ids(docs))
        got = [0]
        times: list[float] = []
        errors: list[str] = []
        opened = threading.Event()

        def watch() -> None:
            try:
                with client[DB].watch(batch_size=10000, max_await_time_ms=200) as s:
                    opened.set()
                    deadline = time.monotonic() + 120
                    while got[0] < docs and time.monotonic() < deadline:
                        if s.try_next() is not None:
                            got[0] += 1
                            if got[0] == 1 or got[0] == docs:
                                times.append(time.perf_counter())
            except Exception as exc:  # noqa: BLE001 - printed as the figure
                errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                opened.set()

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        opened.wait(30)
        t0 = time.perf_counter()
        secs = insert_backlog(client[DB].c0, spread_ids(docs))
        th.join(150)
        if errors or len(times) < 2:
            raise RuntimeError(f"stream stopped after {got[0]:,} of {docs:,} events: "
                               f"{errors[0] if errors else 'timeout'}")
        return docs / secs, got[0] / (times[-1] - t0), got[0], unwatched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=40_000)
    ap.add_argument("--shards", default="1,2,4,8")
    args = ap.parse_args()
    print(f"# bench_shards  {machine()}")
    base = None
    for n in [int(x) for x in args.shards.split(",")]:
        try:
            w, d, got, u = run(n, args.docs)
        except Exception as exc:  # noqa: BLE001 - a failed point is reported, the rest still run
            print(f"{n} shard(s): FAILED: {exc}")
            continue
        if base is None:
            base, base_u = d, u
        print(f"{n} shard(s): writes {w:>9,.0f} ops/s, delivered {got:,} events at {d:>9,.0f} ev/s "
              f"({d / base:.2f}x of the first shard count); unwatched writes {u:>9,.0f} ops/s "
              f"({u / base_u:.2f}x), delivered / unwatched writes {d / u:.2f}x")


if __name__ == "__main__":
    main()
