"""Preparing a cluster for a load run, with the router's own admin commands.

Each plan collection is sharded on ``{_id: 1}`` (``shardCollection``), split into one range per
shard at :func:`~shardsim.tools.load.plan.split_points` (``split``) and the ranges moved one per shard
(``moveChunk``), as a user would on a real ``mongos``. The chunk→shard map is then read back
from ``config.collections`` / ``config.chunks`` through the router (5.0+ chunks are keyed by the
collection ``uuid``; older ones by ``ns``; both are accepted).
"""

from __future__ import annotations

from typing import Any

from bson.max_key import MaxKey
from bson.min_key import MinKey
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from shardsim.tools.load.plan import KEY_SPACE, Chunk, ChunkMap, PlanSpec, split_points

_LOW, _HIGH = -(1 << 63), 1 << 63


def list_shards(client: MongoClient) -> dict[str, str]:
    """Shard name → ``host:port`` (``listShards``; a ``rs/host,...`` host keeps its first
    member)."""
    shards = client.admin.command("listShards")["shards"]
    return {s["_id"]: s["host"].split("/", 1)[-1].split(",")[0] for s in shards}


def prepare(client: MongoClient, spec: PlanSpec, shards: list[str] | None = None) -> ChunkMap:
    """Shard, split and spread every plan collection over ``shards`` (default: all), drop
    leftovers of an earlier run first, and return the resulting chunk map.

    Raises :class:`pymongo.errors.OperationFailure` when the router refuses a command.
    """
    shards = sorted(shards or list_shards(client))
    client.drop_database(spec.db)
    try:
        client.admin.command("enableSharding", spec.db)
    except OperationFailure as exc:  # implicit since 6.0; some routers reject an existing db
        if exc.code not in (23, 59):  # AlreadyInitialized / CommandNotFound
            raise
    for name in spec.collection_names:
        ns = f"{spec.db}.{name}"
        client.admin.command("shardCollection", ns, key={"_id": 1})
        for point in split_points(len(shards)):
            client.admin.command("split", ns, middle={"_id": point})
    cmap = read_chunk_map(client, spec)
    bounds = [0] + split_points(len(shards))
    for c, name in enumerate(spec.collection_names):
        for i, lo in enumerate(bounds):
            if cmap.shard_of(c, lo) != shards[i]:
                client.admin.command("moveChunk", f"{spec.db}.{name}", find={"_id": lo}, to=shards[i])
    return read_chunk_map(client, spec)


def _bound(value: Any, default: int) -> int:
    if isinstance(value, MinKey):
        return _LOW
    if isinstance(value, MaxKey):
        return _HIGH
    if isinstance(value, (int, float)):
        return int(value)
    return default


def config_server_uri(client: MongoClient) -> str | None:
    """The config server of the router behind ``client``, from ``getCmdLineOpts``'
    ``parsed.sharding.configDB`` (as mongos reports it; ``rs/host,...`` keeps the first host)."""
    try:
        opts = client.admin.command("getCmdLineOpts")
    except OperationFailure:
        return None
    cfg = (opts.get("parsed", {}).get("sharding", {}) or {}).get("configDB")
    if not cfg:
        return None
    return f"mongodb://{cfg.split('/', 1)[-1].split(',')[0]}/?directConnection=true"


def read_chunk_map(client: MongoClient, spec: PlanSpec) -> ChunkMap:
    """The chunk map of the plan's collections from ``config.collections``/``config.chunks``,
    read through the router, or from the config server itself when the router shows no
    ``config`` entries (its address from :func:`config_server_uri`).

    Raises RuntimeError when a collection is not sharded on ``{_id: 1}``.
    """
    first = f"{spec.db}.{spec.collection_names[0]}"
    if client.config.collections.find_one({"_id": first}) is None:
        uri = config_server_uri(client)
        if uri:
            with MongoClient(uri) as cfg:
                return _read_chunk_map(cfg, spec)
    return _read_chunk_map(client, spec)


def _read_chunk_map(client: MongoClient, spec: PlanSpec) -> ChunkMap:
    config = client.config
    chunks: list[Chunk] = []
    for c, name in enumerate(spec.collection_names):
        ns = f"{spec.db}.{name}"
        entry = config.collections.find_one({"_id": ns})
        if entry is None:
            raise RuntimeError(f"{ns} is not sharded (no config.collections entry)")
        if dict(entry.get("key", {})) != {"_id": 1}:
            raise RuntimeError(f"{ns} is sharded on {entry.get('key')}, the load needs {{_id: 1}}")
        query: dict[str, Any] = {"uuid": entry["uuid"]} if "uuid" in entry else {"ns": ns}
        docs = list(config.chunks.find(query))
        if not docs and "uuid" in entry:
            docs = list(config.chunks.find({"ns": ns}))
        if not docs:
            raise RuntimeError(f"{ns} has no chunks in config.chunks")
        for d in docs:
            chunks.append(Chunk(c, _bound(d["min"].get("_id"), _LOW),
                                _bound(d["max"].get("_id"), KEY_SPACE), d["shard"]))
    return ChunkMap(chunks)
