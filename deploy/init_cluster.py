"""One-shot cluster initialisation for the compose cluster: add every shard through the router.

Usage: init_cluster.py --router HOST:PORT NAME=HOST:PORT [NAME=HOST:PORT ...]

Waits (up to --timeout-s seconds) until the router answers `ping`, reads `listShards`, and runs
`addShard: "HOST:PORT", name: NAME` for each shard not yet in the cluster, so running it again
(`docker compose up` on an existing cluster) changes nothing. Exits 0 on success, 1 with the
server's error otherwise. The command shapes are mongos' (router-command-surface.md: addShard,
listShards).
"""
import argparse
import sys
import time

from pymongo import MongoClient
from pymongo.errors import PyMongoError


def parse_shard(spec: str) -> tuple[str, str]:
    name, sep, host = spec.partition("=")
    if not sep or not name or ":" not in host:
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {spec!r}")
    return name, host


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--router", default="router:27017")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("shards", nargs="+", type=parse_shard)
    a = p.parse_args()
    host, _, port = a.router.rpartition(":")
    client = MongoClient(host, int(port), directConnection=True, serverSelectionTimeoutMS=2000)
    deadline = time.monotonic() + a.timeout_s
    while True:
        try:
            client.admin.command("ping")
            break
        except PyMongoError as exc:
            if time.monotonic() > deadline:
                print(f"init: router {a.router} not reachable: {exc}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    try:
        existing = {s["_id"] for s in client.admin.command("listShards").get("shards", [])}
        for name, shard_host in a.shards:
            if name in existing:
                print(f"init: {name} already added", flush=True)
                continue
            reply = client.admin.command("addShard", shard_host, name=name)
            print(f"init: added {reply.get('shardAdded', name)} at {shard_host}", flush=True)
        shards = client.admin.command("listShards").get("shards", [])
        print("init: cluster has shards " + ", ".join(s["_id"] for s in shards), flush=True)
    except PyMongoError as exc:
        print(f"init: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
