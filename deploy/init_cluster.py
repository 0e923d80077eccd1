"""One-shot cluster initialisation for the compose cluster: add every shard through the router.

Usage: init_cluster.py --router HOST:PORT [--key-file PATH] NAME=HOST:PORT [NAME=HOST:PORT ...]
       init_cluster.py --make-key-file PATH

With --key-file (the compose cluster with authentication, deploy/docker-compose.auth.yml) it logs
in as the internal user ``__system`` (authSource ``local``, the key file's content as password,
as mongod's members do), creates the root user from $MONGO_INITDB_ROOT_USERNAME /
$MONGO_INITDB_ROOT_PASSWORD (default root / root) when it does not exist yet, then adds the
shards. --make-key-file writes a random 756-character base64 key (mode 0400) unless the file
exists, and exits.

Waits (up to --timeout-s seconds) until the router answers `ping`, reads `listShards`, and runs
`addShard: "HOST:PORT", name: NAME` for each shard not yet in the cluster (HOST:PORT may be a
replica set, `SET/H1:P1,H2:P2,...`: that one is retried until the deadline while the set has no
primary yet), so running it again
(`docker compose up` on an existing cluster) changes nothing. Exits 0 on success, 1 with the
server's error otherwise. The command shapes are mongos' (router-command-surface.md: addShard,
listShards).
"""
import argparse
import base64
import os
import secrets
import sys
import time

from pymongo import MongoClient
from pymongo.errors import PyMongoError


def parse_shard(spec: str) -> tuple[str, str]:
    name, sep, host = spec.partition("=")
    if not sep or not name or ":" not in host:
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {spec!r}")
    return name, host


def make_key_file(path: str) -> int:
    """Write a random base64 key (as `openssl rand -base64 756` would) unless ``path`` exists."""
    if os.path.exists(path):
        print(f"init: key file {path} exists", flush=True)
        return 0
    key = base64.b64encode(secrets.token_bytes(567)).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    print(f"init: wrote key file {path}", flush=True)
    return 0


def ensure_root_user(client: MongoClient) -> None:
    """Create the root user from the MONGO_INITDB_ROOT_* variables unless it exists."""
    user = os.environ.get("MONGO_INITDB_ROOT_USERNAME") or "root"
    pwd = os.environ.get("MONGO_INITDB_ROOT_PASSWORD") or "root"
    if client.admin.command("usersInfo", user).get("users"):
        print(f"init: user {user} exists", flush=True)
        return
    client.admin.command("createUser", user, pwd=pwd, roles=[{"role": "root", "db": "admin"}])
    print(f"init: created root user {user}", flush=True)


def add_shard(client: MongoClient, name: str, shard_host: str, deadline: float) -> dict:
    """``addShard: shard_host, name: name``; a replica-set shard (``set/h1,h2,h3``) may have no
    primary yet right after its members start, so a failure is retried every second until
    ``deadline`` (time.monotonic()), then re-raised with the server's error."""
    while True:
        try:
            return client.admin.command("addShard", shard_host, name=name)
        except PyMongoError as exc:
            if "/" not in shard_host or time.monotonic() > deadline:
                raise
            print(f"init: addShard {name} not yet: {exc}", flush=True)
            time.sleep(1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--router", default="router:27017")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--key-file", help="log in as __system with this key file")
    p.add_argument("--make-key-file", help="write a random key file here and exit")
    p.add_argument("shards", nargs="*", type=parse_shard)
    a = p.parse_args()
    if a.make_key_file:
        return make_key_file(a.make_key_file)
    host, _, port = a.router.rpartition(":")
    auth = {}
    if a.key_file:
        with open(a.key_file) as f:
            auth = {"username": "__system", "password": "".join(f.read().split()),
                    "authSource": "local"}
    client = MongoClient(host, int(port), directConnection=True, serverSelectionTimeoutMS=2000,
                         **auth)
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
        if a.key_file:
            ensure_root_user(client)
        existing = {s["_id"] for s in client.admin.command("listShards").get("shards", [])}
        for name, shard_host in a.shards:
            if name in existing:
                print(f"init: {name} already added", flush=True)
                continue
            reply = add_shard(client, name, shard_host, deadline)
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
