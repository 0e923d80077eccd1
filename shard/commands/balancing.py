"""What a shard tells the balancer: ``_shardsvrGetStatsForBalancing`` (the data size of
collections on this shard) and ``autoSplitVector`` (split points of a key range by data size).

* ``src/mongo/db/s/shardsvr_get_stats_for_balancing_command.cpp``:
  ``{_shardsvrGetStatsForBalancing: 1, collections: [{ns, UUID}], scaleFactor}`` ->
  ``{stats: [{namespace, UUID, collSize}]}``, ``collSize`` in units of ``scaleFactor`` bytes.
  A collection this shard does not have (or with another UUID) counts 0.
* ``src/mongo/db/s/auto_split_vector.cpp`` / ``auto_split_vector_command.cpp``:
  ``{autoSplitVector: coll, keyPattern, min, max, maxChunkSizeBytes, limit?}`` ->
  ``{splitKeys: [key docs], continuation: bool}``: walks the documents of ``[min, max)`` in
  shard-key order and cuts every ``maxChunkSizeBytes`` of data; no split when the range holds
  less than that. Like the server, the last piece is not left much smaller than the others
  (when it would be under 80% of ``maxChunkSizeBytes``, the last split key is dropped).

Sizes are BSON sizes of the documents; for a collection of more than 1,000 documents the
collection size is estimated from a sample of 200 (count x mean size), so an idle balancer
round costs the same whatever the data size.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64

from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern, SortKey, compare_keys
from shardsim.shard.commands.helpers import ddl_name
from shardsim.core.protocol import shard as shrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.shard.node import ShardNode

commands = CommandFamily("balancing")

_EXACT_LIMIT = 1000
_SAMPLE = 200


def collection_size(docs: dict[Any, dict[str, Any]]) -> int:
    """Data size in bytes of a collection's documents (``docs``: id key -> document), exact up
    to 1,000 documents, else estimated from the first 200."""
    n = len(docs)
    if n <= _EXACT_LIMIT:
        return sum(len(bson.encode(d)) for d in docs.values())
    sample = list(itertools.islice(docs.values(), _SAMPLE))
    return int(n * sum(len(bson.encode(d)) for d in sample) / len(sample))


@commands.handler(shrq.GetStatsForBalancing.NAME, privileges=priv.INTERNAL)
async def get_stats_for_balancing(node: ShardNode, req: Request) -> dict[str, Any]:
    """``{_shardsvrGetStatsForBalancing: 1, collections: [{ns, UUID}], scaleFactor: 1}`` ->
    ``{stats: [{namespace, UUID, collSize: Long}]}``. TypeMismatch (14) for a bad field."""
    colls = check_type(req, "collections", list, "array", required=True)
    scale = req.body.get("scaleFactor", 1)
    if not isinstance(scale, int) or scale <= 0:
        raise MongoError(2, "scaleFactor must be a positive integer")
    stats = []
    for item in colls:
        if not isinstance(item, dict) or not isinstance(item.get("ns"), str):
            raise MongoError(14, "BSON field 'collections' entries must be {ns, UUID}")
        db, _, name = item["ns"].partition(".")
        coll = node.storage.get(db, name)
        uuid = item.get("UUID")
        size = 0
        if coll is not None and (uuid is None or bytes(uuid) == coll.uuid):
            size = collection_size(coll.docs)
        stats.append({"namespace": item["ns"], "UUID": uuid, "collSize": Int64(size // scale)})
    return {"stats": stats}


def _range_keys(pattern: KeyPattern, docs: Any, lo: tuple[Any, ...], hi: tuple[Any, ...]
                ) -> list[tuple[tuple[Any, ...], int]]:
    """(shard key, BSON size) of the documents in ``[lo, hi)``, in shard-key order."""
    out = []
    for d in docs:
        k = pattern.key_of_doc(d)
        if compare_keys(lo, k) <= 0 and compare_keys(k, hi) < 0:
            out.append((k, len(bson.encode(d))))
    out.sort(key=lambda kv: SortKey(kv[0]))
    return out


def split_points(keyed: list[tuple[tuple[Any, ...], int]], max_bytes: int,
                 limit: int | None = None) -> tuple[list[tuple[Any, ...]], bool]:
    """Split keys that cut ``keyed`` ((key, size) in key order) into pieces of about
    ``max_bytes``; never between two documents with the same key. Returns (keys,
    continuation: more split points exist beyond ``limit``)."""
    total = sum(s for _, s in keyed)
    if total < max_bytes:
        return [], False
    keys: list[tuple[Any, ...]] = []
    acc = 0
    for i, (k, size) in enumerate(keyed):
        if acc >= max_bytes and i > 0 and compare_keys(keyed[i - 1][0], k) != 0:
            if limit is not None and len(keys) == limit:
                return keys, True
            keys.append(k)
            acc = 0
        acc += size
    if keys and acc < 0.8 * max_bytes and (limit is None or len(keys) < limit):
        keys.pop()  # the server merges a small last piece into the one before
    return keys, False


@commands.handler("autoSplitVector", privileges=priv.on_coll("splitVector"))
async def auto_split_vector(node: ShardNode, req: Request) -> dict[str, Any]:
    """``{autoSplitVector: coll, keyPattern, min, max, maxChunkSizeBytes, limit?}`` ->
    ``{splitKeys: [{field: value}], continuation}``. Errors: IDLFailedToParse (40414) for a
    missing field, TypeMismatch (14), NamespaceNotFound (26) without the collection,
    BadValue (2) for a non-positive ``maxChunkSizeBytes``."""
    name = ddl_name(req)
    key = check_type(req, "keyPattern", dict, "object", required=True)
    lo_doc = check_type(req, "min", dict, "object", required=True)
    hi_doc = check_type(req, "max", dict, "object", required=True)
    max_bytes = req.body.get("maxChunkSizeBytes")
    if max_bytes is None:
        raise MongoError(40414, "BSON field 'autoSplitVector.maxChunkSizeBytes' is missing "
                                "but a required field")
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise MongoError(2, "maxChunkSizeBytes must be a positive number")
    limit = req.body.get("limit")
    coll = node.storage.get(req.db, name)
    if coll is None:
        raise MongoError(26, f"ns not found {req.db}.{name}")
    pattern = KeyPattern.parse(key)
    keyed = _range_keys(pattern, coll.docs.values(), pattern.bound_to_key(lo_doc),
                        pattern.bound_to_key(hi_doc))
    keys, more = split_points(keyed, int(max_bytes), int(limit) if limit else None)
    return {"splitKeys": [pattern.key_to_bound(k) for k in keys], "continuation": more}


__all__ = ["collection_size", "commands", "split_points"]
