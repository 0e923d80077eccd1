"""``splitVector`` and ``dataSize`` on a shard: the range statistics CDC snapshot splitters ask
a mongod for (Flink CDC's ``SplitVectorSplitStrategy``, Debezium's incremental snapshot).

* ``src/mongo/db/s/split_vector.cpp`` (``splitVector``) and
  ``src/mongo/db/s/split_vector_command.cpp``: ``{splitVector: "db.coll", keyPattern,
  min?, max?, maxChunkSizeBytes? | maxChunkSize? (MB), maxSplitPoints?, maxChunkObjects?,
  force?}`` -> ``{splitKeys: [key docs]}``. Walks the index over ``keyPattern`` from ``min``
  (inclusive) to ``max`` (exclusive; absent = MaxKey) and keeps every ``keyCount``-th key,
  ``keyCount = maxChunkSizeBytes / (2 * avgObjSize)`` (lowered to ``maxChunkObjects``,
  default 250,000), never the same key twice; nothing when the collection's data size is
  below ``maxChunkSizeBytes`` or the range holds one key value only. ``force`` splits the
  range in half. Errors: InvalidNamespace (73) for a namespace without a collection part,
  NamespaceNotFound (26) "ns not found", IndexNotFound (27) "couldn't find index over
  splitting key ...", InvalidOptions (72) "need to specify the desired max chunk size",
  BadValue (2) without ``keyPattern`` (mongod: errmsg "no key pattern found in splitVector").
* ``dbcommands.cpp`` ``CmdDatasize``: ``{dataSize: "db.coll", keyPattern?, min?, max?,
  estimate?}`` -> ``{size, numObjects, millis}`` (``estimate: true`` adds ``estimate: true``);
  without ``min``/``max`` the whole collection; a missing collection answers zeros.
  OperationFailed (96) "couldn't find valid index containing key pattern" when no index has
  ``keyPattern`` (inferred from ``min``'s fields when absent) as its prefix.

Sizes are the documents' BSON sizes (shardsim has no storage engine).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import SortKey, compare_keys, get_path
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection

commands = CommandFamily("split_vector")

# split_vector.cpp: the default of maxChunkObjects (kMaxObjectPerChunk).
MAX_OBJECTS_PER_CHUNK = 250000


def _full_ns(req: Request) -> tuple[str, str]:
    """``"db.coll"`` of ``req``'s first argument (CommandHelpers::parseNsFullyQualified)."""
    ns = req.arg
    if not isinstance(ns, str) or "." not in ns or ns.startswith(".") or ns.endswith("."):
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db, _, coll = ns.partition(".")
    return db, coll


def _index_over(coll: "Collection", key: dict[str, Any]) -> bool:
    """Whether an index of ``coll`` has ``key``'s fields as its prefix
    (``findShardKeyPrefixedIndex``)."""
    fields = list(key)
    for idx in coll.indexes.values():
        spec_key = list((idx.spec.get("key") or {}).keys())
        if spec_key[:len(fields)] == fields:
            return True
    return False


def _key(fields: list[str], doc: dict[str, Any]) -> tuple[Any, ...]:
    out = []
    for f in fields:
        found, v = get_path(doc, f)
        out.append(v if found else None)
    return tuple(out)


def _bound(fields: list[str], bound: Any, upper: bool) -> tuple[Any, ...]:
    """``KeyPattern::extendRangeBound``: missing trailing fields become MinKey (MaxKey for an
    absent upper bound)."""
    if not isinstance(bound, dict) or not bound:
        return tuple((MaxKey() if upper else MinKey()) for _ in fields)
    vals = list(bound.values())
    return tuple(vals[i] if i < len(vals) else MinKey() for i in range(len(fields)))


def range_docs(coll: "Collection", fields: list[str], lo: tuple[Any, ...], hi: tuple[Any, ...]
               ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(key, document)`` of the documents of ``coll`` with ``lo <= key < hi``, in key order
    (an index scan with ``kIncludeStartKeyOnly``)."""
    out = []
    for d in coll.docs.values():
        k = _key(fields, d)
        if compare_keys(lo, k) <= 0 and compare_keys(k, hi) < 0:
            out.append((k, d))
    out.sort(key=lambda kd: SortKey(kd[0]))
    return out


def _max_chunk_bytes(body: dict[str, Any]) -> int | None:
    if body.get("maxChunkSizeBytes") is not None:
        return int(body["maxChunkSizeBytes"])
    if body.get("maxChunkSize") is not None:
        return int(body["maxChunkSize"]) * (1 << 20)
    return None


def split_keys(keyed: list[tuple[Any, ...]], data_size: int, count: int, max_bytes: int,
               max_objects: int, max_points: int | None, force: bool) -> list[tuple[Any, ...]]:
    """The split points of ``keyed`` (the range's keys in order) as ``splitVector`` picks
    them; ``data_size``/``count`` are the whole collection's (the server's size estimate)."""
    if not keyed or compare_keys(keyed[0], keyed[-1]) == 0:
        return []  # one key value only: a low-cardinality range cannot split
    key_count = max_bytes // (2 * max(1, data_size // count))
    if max_objects and max_objects < key_count:
        key_count = max_objects
    if force:
        key_count = len(keyed) // 2
    out: list[tuple[Any, ...]] = [keyed[0]]  # the sentinel, dropped at the end
    cur = 0
    for k in keyed:
        cur += 1
        if cur > key_count:
            if compare_keys(k, out[-1]) != 0:
                out.append(k)
                cur = 0
        if max_points and len(out) - 1 >= max_points:
            break
    return out[1:]


@commands.handler("splitVector", privileges=priv.on_full_ns("splitVector"))
async def split_vector(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``splitVector`` (see the module docstring): ``{splitKeys: [{field: value}]}``."""
    db, name = _full_ns(req)
    body = req.body
    key = body.get("keyPattern")
    if not isinstance(key, dict) or not key:
        raise MongoError(2, "no key pattern found in splitVector")
    coll = node.storage.get(db, name)
    if coll is None:
        raise MongoError(26, "ns not found")
    if not _index_over(coll, key):
        raise MongoError(27, f"couldn't find index over splitting key {key}")
    force = bool(body.get("force"))
    data_size = sum(len(bson.encode(d)) for d in coll.docs.values())
    count = len(coll.docs)
    max_bytes = data_size if force else _max_chunk_bytes(body)
    if not max_bytes or max_bytes <= 0:
        raise MongoError(72, "need to specify the desired max chunk size")
    if data_size < max_bytes or count == 0:
        return {"splitKeys": []}
    fields = list(key)
    keyed = [k for k, _ in range_docs(coll, fields, _bound(fields, body.get("min"), False),
                                      _bound(fields, body.get("max"), True))]
    if not keyed:
        raise MongoError(96, "can't open a cursor to scan the range (desired range is "
                             "possibly empty)")
    max_objects = int(body.get("maxChunkObjects") or MAX_OBJECTS_PER_CHUNK)
    max_points = int(body["maxSplitPoints"]) if body.get("maxSplitPoints") else None
    keys = split_keys(keyed, data_size, count, max_bytes, max_objects, max_points, force)
    return {"splitKeys": [dict(zip(fields, k)) for k in keys]}


@commands.handler("dataSize", privileges=priv.on_full_ns("find"))
async def data_size(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``dataSize`` (see the module docstring): ``{size, numObjects, millis}``."""
    start = time.monotonic()
    db, name = _full_ns(req)
    body = req.body
    lo, hi = body.get("min"), body.get("max")
    key = body.get("keyPattern")
    coll = node.storage.get(db, name)
    out: dict[str, Any] = {}
    if body.get("estimate"):
        out["estimate"] = True
    if coll is None:
        return {**out, "size": Int64(0), "numObjects": Int64(0), "millis": 0}
    if not lo and not hi:
        docs = list(coll.docs.values())
    else:
        if not isinstance(key, dict) or not key:  # Helpers::inferKeyPattern(min)
            key = {f: 1 for f in (lo or hi or {})}
        if not key or not _index_over(coll, key):
            raise MongoError(96, "couldn't find valid index containing key pattern")
        fields = list(key)
        docs = [d for _, d in range_docs(coll, fields, _bound(fields, lo, False),
                                         _bound(fields, hi, True))]
    size = sum(len(bson.encode(d)) for d in docs)
    return {**out, "size": Int64(size), "numObjects": Int64(len(docs)),
            "millis": int((time.monotonic() - start) * 1000)}


__all__ = ["commands", "range_docs", "split_keys"]
