"""The config server's catalog helpers that need no node: shard addresses, namespaces, chunk
documents and initial chunks, and finding the chunk a ``split``/``moveChunk`` names.

The catalog documents' shapes are listed in :mod:`configsvr.node`; chunk bounds are shard-key
documents (``{field: value}``), compared as key tuples (``shardsim.core.shard_key``).
"""

from __future__ import annotations

import datetime
from typing import Any

from bson import Binary, ObjectId
from bson.timestamp import Timestamp

from shardsim.core.shard_key import Chunk, ChunkMap, KeyPattern, compare_keys, hashed_split_points
from shardsim.core.client import parse_address
from shardsim.core.commands import Request
from shardsim.core.errors import MongoError


def date_now() -> datetime.datetime:
    """Now as a BSON date holds it (UTC, naive, whole milliseconds): a catalog document's
    date is then the same on the primary (the stored object) and on the members that applied
    it from the oplog (decoded from BSON), as every mongod stores ``Date_t``."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def shard_host(entry: dict[str, Any]) -> tuple[str, int]:
    """``(host, port)`` of a ``config.shards`` entry (``"name/host:port"`` or ``"host:port"``)."""
    host = entry["host"].split("/", 1)[-1].split(",")[0]
    return parse_address(host)


def split_ns(ns: Any, cmd: str = "shardCollection") -> tuple[str, str]:
    """``"db.coll"`` -> ``("db", "coll")``; InvalidNamespace (73) otherwise."""
    if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db, coll = ns.split(".", 1)
    return db, coll


def initial_chunks(pattern: KeyPattern, primary: str, shards: list[str], count: int,
                   num_initial: Any) -> list[Chunk]:
    """One chunk on the primary for a ranged key; for a hashed key ``numInitialChunks``
    (default 2 per shard) evenly spaced chunks, round-robin over the shards when the
    collection is empty (``InitialSplitPolicy``), all on the primary otherwise."""
    gmin, gmax = tuple(pattern.global_min().values()), tuple(pattern.global_max().values())
    if not pattern.is_hashed or pattern.fields[0] not in pattern.hashed:
        return [Chunk(gmin, gmax, primary)]
    n = int(num_initial) if isinstance(num_initial, (int, float)) and num_initial else 2 * len(shards)
    points = hashed_split_points(max(1, n))
    rest_min, rest_max = gmin[1:], gmin[1:]
    bounds = [gmin] + [(p,) + rest_min for p in points] + [gmax]
    del rest_max
    order = [primary] + [s for s in shards if s != primary] if count else shards
    out = []
    for i in range(len(bounds) - 1):
        owner = primary if count else order[i % len(order)]
        out.append(Chunk(bounds[i], bounds[i + 1], owner))
    return out


def chunk_doc(uuid: Binary, pattern: KeyPattern, c: Chunk, lastmod: Timestamp,
              now: Timestamp) -> dict[str, Any]:
    """A ``config.chunks`` document for chunk ``c`` of the collection ``uuid`` at version
    ``lastmod`` (Timestamp(major, minor)), owned since ``now``."""
    return {"_id": ObjectId(), "uuid": uuid, "min": pattern.key_to_bound(c.min),
            "max": pattern.key_to_bound(c.max), "shard": c.shard, "lastmod": lastmod,
            "onCurrentShardSince": now, "history": [{"validAfter": now, "shard": c.shard}]}


def chunk_map(pattern: KeyPattern, chunk_docs: list[dict[str, Any]]) -> ChunkMap:
    """The :class:`ChunkMap` of ``config.chunks`` documents."""
    return ChunkMap(pattern, [Chunk(pattern.bound_to_key(d["min"]), pattern.bound_to_key(d["max"]),
                                    d["shard"]) for d in chunk_docs])


def locate_chunk(pattern: KeyPattern, chunk_docs: list[dict[str, Any]], req: Request,
                 cmd: str) -> dict[str, Any]:
    """The chunk doc named by ``find`` (a document with the shard key; hashed fields are
    hashed) or ``bounds`` ([min, max] exactly a chunk's bounds) of ``cmd``'s request ``req``.
    Raises BadValue (2) for bad or unknown bounds / neither given, ShardKeyNotFound (61) when
    ``find`` lacks the shard key."""
    if req.get("bounds") is not None:
        bounds = req.get("bounds")
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise MongoError(2, "bounds must be an array of two documents")
        lo, hi = pattern.bound_to_key(bounds[0]), pattern.bound_to_key(bounds[1])
        for d in chunk_docs:
            if compare_keys(pattern.bound_to_key(d["min"]), lo) == 0 and \
                    compare_keys(pattern.bound_to_key(d["max"]), hi) == 0:
                return d
        raise MongoError(2, f"no chunk found with the shard key bounds [{bounds[0]}, {bounds[1]})")
    find = req.get("find")
    if not isinstance(find, dict):
        raise MongoError(2, f"need to specify find or bounds for {cmd}")
    key = pattern.key_of_query(find)
    if key is None:
        raise MongoError(61, f"no shard key found in chunk query {find}")
    cmap = chunk_map(pattern, chunk_docs)
    chunk = cmap.find(key)
    for d in chunk_docs:
        if compare_keys(pattern.bound_to_key(d["min"]), chunk.min) == 0:
            return d
    raise MongoError(1, "chunk not found")
