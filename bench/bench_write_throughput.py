"""Write throughput through the router vs directly to a shard.

Same single pymongo client, same documents: (a) bulk inserts of 1,000 through the router into a
collection spread over 3 shards, (b) the same to one shard's own port (baseline, its own
unsharded collection), then (c)/(d) one-at-a-time ``insert_one`` (round-trip bound) both ways.
Prints ops/s and the router/direct ratio. ``--durable`` gives every process a ``--dbpath``
(each command then commits to SQLite before its reply: the durable write path).
"""

from __future__ import annotations

import argparse
import time

from pymongo import MongoClient

from _common import DB, direct_client, insert_backlog, machine, ratio, spread_collection, spread_ids
from shardsim.tools.launcher import Cluster


def singles(coll, ids) -> float:
    t = time.perf_counter()
    for k in ids:
        coll.insert_one({"_id": k, "pad": "x" * 64})
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=60_000)
    ap.add_argument("--singles", type=int, default=3_000)
    ap.add_argument("--durable", action="store_true", help="every process with --dbpath")
    args = ap.parse_args()
    print(f"# bench_write_throughput{' --durable' if args.durable else ''}  {machine()}")
    with Cluster(shards=3, durable=args.durable) as cluster:
        client = MongoClient(cluster.router_uri)
        spread_collection(client)
        direct = direct_client(cluster.shards[0].address)
        ids = spread_ids(args.docs)
        t_r = insert_backlog(client[DB].c0, ids)
        t_d = insert_backlog(direct["bench_direct"].c0, ids)
        one = spread_ids(args.singles)
        client[DB].c0.delete_many({})
        direct["bench_direct"].c0.delete_many({})
        s_r = singles(client[DB].c0, one)
        s_d = singles(direct["bench_direct"].c0, one)
        b_r, b_d = len(ids) / t_r, len(ids) / t_d
        print(f"bulk   direct to a shard (base): {b_d:>9,.0f} ops/s (1.00x)")
        print(f"bulk   through the router      : {b_r:>9,.0f} ops/s ({ratio(b_r, b_d)})")
        o_r, o_d = len(one) / s_r, len(one) / s_d
        print(f"single direct to a shard (base): {o_d:>9,.0f} ops/s (1.00x)")
        print(f"single through the router      : {o_r:>9,.0f} ops/s ({ratio(o_r, o_d)})")


if __name__ == "__main__":
    main()
