"""Statistics through the router, aggregated across the shards as mongos does.

* ``collStats`` (``src/mongo/s/commands/cluster_coll_stats_cmd.cpp``, ``CollectionStats::run``):
  sent without ``scale`` to every shard owning chunks of a sharded collection, to the primary
  shard otherwise. Reply: ``{sharded[, primary], capped, indexDetails, ..., ns, count, size,
  storageSize, totalIndexSize, totalSize, indexSizes, avgObjSize (double: sum over shards of
  avgObjSize x count / count), maxSize, nindexes (the largest), scaleFactor, nchunks,
  shards: {shardName: that shard's reply, scaled}}``; ``capped``/``max``/``indexDetails`` come
  from the first shard; sizes summed, then divided by ``scale``. ``primary`` only when
  unsharded; ``nchunks`` is 1 for an unsharded collection. Errors: 4390200 "scale has to be
  >= 1", 4390201 "scale has to be a number >= 1"; the shards' errors (NamespaceNotFound 26).
* ``dbStats`` (``cluster_db_stats_cmd.cpp``): every shard; ``{raw: {"rs/host:port": reply},
  db, collections, views, objects, avgObjSize, dataSize, storageSize, indexes, indexSize,
  totalSize, scaleFactor}`` summed (avgObjSize from unscaled sizes).
* ``dataSize`` (``cluster_data_size_cmd.cpp``): the shards owning chunks in ``[min, max)``
  (every owner without a range; the primary shard when unsharded); ``{size, numObjects,
  millis}`` summed.

The ``config`` and ``admin`` databases are the config server's: all three go there as they are.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bson.int64 import Int64

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.router.commands.admin import CONFIG_DATABASES, config_read
from shardsim.router.forwarding import forwardable, reply_body
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.router.node import RouterNode

commands = CommandFamily("stats")

_SUMMED = ("count", "size", "storageSize", "totalIndexSize", "totalSize")
_SCALED = ("size", "storageSize", "totalIndexSize", "totalSize", "maxSize", "freeStorageSize")
_FIRST_SHARD = ("userFlags", "capped", "max", "paddingFactorNote", "indexDetails", "wiredTiger")
_GOSSIP = ("$clusterTime", "operationTime", "$configTime", "$topologyTime", "lastCommittedOpTime")


def _scale(req: Request) -> int:
    scale = req.body.get("scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if int(scale) < 1:
            raise MongoError(4390200, "scale has to be >= 1")
        return int(scale)
    if scale:
        raise MongoError(4390201, "scale has to be a number >= 1")
    return 1


async def _collection(node: "RouterNode", ns: str) -> Any:
    info = node.catalog.collection(ns)
    if info is None:
        await node.refresh_on_database_miss(ns.split(".", 1)[0])
        info = node.catalog.collection(ns)
    return info


async def _gather(node: "RouterNode", shards: list[str], db: str, body: dict[str, Any]
                  ) -> list[tuple[str, dict[str, Any]]]:
    replies = await asyncio.gather(*(node.shard_command(s, db, body) for s in shards))
    return [(s, {k: v for k, v in reply_body(r).items() if k not in _GOSSIP})
            for s, r in zip(shards, replies)]


def scale_shard_stats(stats: dict[str, Any], scale: int) -> dict[str, Any]:
    """One shard's unscaled ``collStats`` reply with its sizes divided by ``scale``
    (``scaleIndividualShardStatistics``)."""
    out: dict[str, Any] = {}
    for k, v in stats.items():
        if k in _SCALED and isinstance(v, (int, float)):
            out[k] = Int64(int(v) // scale)
        elif k == "indexSizes" and isinstance(v, dict):
            out[k] = {n: Int64(int(s) // scale) for n, s in v.items()}
        elif k == "scaleFactor":
            out[k] = scale
        else:
            out[k] = v
    return out


def merge_coll_stats(results: list[tuple[str, dict[str, Any]]], scale: int) -> dict[str, Any]:
    """The summed part of mongos' ``collStats`` reply from ``[(shard, unscaled reply)]``."""
    head: dict[str, Any] = {}
    counts: dict[str, int] = {}
    index_sizes: dict[str, int] = {}
    shards: dict[str, Any] = {}
    max_size = unscaled_size = nindexes = 0
    for shard, res in results:
        n = int(res.get("count") or 0)
        for k, v in res.items():
            if k in ("ns", "ok", "lastExtentSize", "paddingFactor"):
                continue
            if k in _FIRST_SHARD:
                head.setdefault(k, v)
            elif k in _SUMMED:
                counts[k] = counts.get(k, 0) + int(v)
            elif k == "avgObjSize":
                unscaled_size += int(v) * n
            elif k == "maxSize":
                max_size = max(max_size, int(v))
            elif k == "indexSizes":
                for name, size in v.items():
                    index_sizes[name] = index_sizes.get(name, 0) + int(size)
            elif k == "nindexes":
                if nindexes and int(v) != nindexes and "warning" not in head:
                    head["warning"] = "indexes don't all match - ok if ensureIndex is running"
                nindexes = max(nindexes, int(v))
        shards[shard] = scale_shard_stats(res, scale)
    out = dict(head)
    for k in sorted(counts):  # a std::map in the server: alphabetical
        out[k] = Int64(counts[k] // scale if k != "count" else counts[k])
    out["indexSizes"] = {k: Int64(v // scale) for k, v in sorted(index_sizes.items())}
    total = counts.get("count", 0)
    out["avgObjSize"] = unscaled_size / total if total > 0 else 0.0
    out["maxSize"] = Int64(max_size // scale)
    out["nindexes"] = nindexes
    out["scaleFactor"] = scale
    out["_shards"] = shards
    return out


@commands.handler("collStats", privileges=priv.on_coll("collStats"))
async def coll_stats(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{collStats: <coll>, scale?}`` through the router (see the module docstring)."""
    coll = req.arg
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, f"Invalid namespace specified '{req.db}.{coll}'")
    ns = f"{req.db}.{coll}"
    scale = _scale(req)
    body = forwardable(req.body)
    body.pop("scale", None)
    if req.db in CONFIG_DATABASES:  # the config server's own collections (primary "config")
        res = reply_body(await node.config_command(body, db=req.db))
        results = [("config", {k: v for k, v in res.items() if k not in _GOSSIP})]
        return _coll_stats_reply(ns, {"sharded": False, "primary": "config"},
                                 merge_coll_stats(results, scale), 1)
    info = await _collection(node, ns)
    out: dict[str, Any] = {"sharded": info is not None}
    if info is None:
        primary = node.read_primary(req.db)
        if primary is None:
            raise MongoError(70, "No shards found")
        out["primary"] = primary
        targets = [primary]
    else:
        targets = info.chunks.shards()
    merged = merge_coll_stats(await _gather(node, targets, req.db, body), scale)
    return _coll_stats_reply(ns, out, merged, len(info.chunks.chunks) if info else 1)


def _coll_stats_reply(ns: str, out: dict[str, Any], merged: dict[str, Any], nchunks: int
                      ) -> dict[str, Any]:
    """mongos' field order: sharded[, primary], first-shard fields, ns, sums, ..., nchunks,
    shards."""
    shards = merged.pop("_shards")
    out.update({k: merged.pop(k) for k in list(merged) if k in _FIRST_SHARD or k == "warning"})
    out["ns"] = ns
    out.update(merged)
    out["nchunks"] = nchunks
    out["shards"] = shards
    return out


@commands.handler("dbStats", privileges=priv.on_db("dbStats"))
async def db_stats(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{dbStats: 1, scale?}`` through the router: every shard's reply under ``raw`` (keyed by
    its connection string), the sums beside it."""
    if req.db in CONFIG_DATABASES:
        return await config_read(node, req, None)
    shards = [name for name, _, _ in node.catalog.shards()]
    if not shards:
        raise MongoError(70, "No shards found")
    results = await _gather(node, shards, req.db, forwardable(req.body))
    hosts = {d["_id"]: d.get("host", d["_id"]) for d in node.catalog.shard_docs()}
    raw = {hosts.get(s, s): r for s, r in results}
    out: dict[str, Any] = {"raw": raw, "db": req.db}
    sums = {k: sum(int(r.get(k) or 0) for _, r in results)
            for k in ("collections", "views", "objects", "dataSize", "storageSize", "indexes",
                      "indexSize", "totalSize")}
    unscaled = sum(float(r.get("avgObjSize") or 0) * int(r.get("objects") or 0)
                   for _, r in results)
    for k, v in sums.items():
        if k == "dataSize":
            out["avgObjSize"] = unscaled / sums["objects"] if sums["objects"] else 0.0
        out[k] = Int64(v) if k not in ("collections", "views", "indexes") else v
    out["scaleFactor"] = _scale(req)
    return out


@commands.handler("dataSize", privileges=priv.on_full_ns("find"))
async def data_size(node: "RouterNode", req: Request) -> dict[str, Any]:
    """``{dataSize: "db.coll", keyPattern?, min?, max?}`` through the router: ``{size,
    numObjects, millis}`` summed over the shards owning the range."""
    ns = req.arg
    if not isinstance(ns, str) or "." not in ns:
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    db = ns.split(".", 1)[0]
    if db in CONFIG_DATABASES:
        return await config_read(node, req, None)
    info = await _collection(node, ns)
    if info is None:
        primary = node.read_primary(db)
        targets = [primary] if primary else []
    else:
        lo, hi = req.body.get("min"), req.body.get("max")
        targets = _owners_of_range(info, lo, hi) if lo or hi else info.chunks.shards()
    results = await _gather(node, targets, db, forwardable(req.body))
    return {"size": Int64(sum(int(r.get("size") or 0) for _, r in results)),
            "numObjects": Int64(sum(int(r.get("numObjects") or 0) for _, r in results)),
            "millis": sum(int(r.get("millis") or 0) for _, r in results)}


def _owners_of_range(info: Any, lo: Any, hi: Any) -> list[str]:
    """Shards owning a chunk that overlaps ``[lo, hi)`` (bounds as key documents)."""
    from shardsim.core.shard_key import compare_keys
    pattern = info.pattern
    lo_key = pattern.bound_to_key(lo) if isinstance(lo, dict) and lo else None
    hi_key = pattern.bound_to_key(hi) if isinstance(hi, dict) and hi else None
    out: list[str] = []
    for c in info.chunks.chunks:
        if hi_key is not None and compare_keys(c.min, hi_key) >= 0:
            continue
        if lo_key is not None and compare_keys(c.max, lo_key) <= 0:
            continue
        if c.shard not in out:
            out.append(c.shard)
    return out


__all__ = ["commands", "merge_coll_stats", "scale_shard_stats"]
