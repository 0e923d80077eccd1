"""The ``$collStats`` aggregation stage on a shard (``document_source_coll_stats.cpp``,
``stats/storage_stats.cpp``) and the storage statistics ``collStats`` shares.

``{$collStats: {latencyStats?: {histograms?}, storageStats?: {scale?}, count?: {},
queryExecStats?: {}}}`` as the first stage of an aggregate on a collection gives one document:
``{ns, shard, host, localTime[, latencyStats][, storageStats][, count][, queryExecStats]}``
(``shard`` because this node is a shard server). ``storageStats``: ``{size, count,
avgObjSize, numOrphanDocs, storageSize, freeStorageSize, capped[, max, maxSize], nindexes,
indexDetails, indexBuilds, totalIndexSize, totalSize, indexSizes, scaleFactor}`` — sizes are
the documents' BSON sizes (shardsim has no storage engine; ``storageSize`` = ``size``, index
sizes are estimates), divided by ``scale``.

Errors as mongod's: 40166 for a non-object spec, 40415 for an unknown option, 40602 when not
first, NamespaceNotFound (26) for ``storageStats``/``count`` of a missing collection,
BadValue (2) for a scale below 1.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64

from shardsim.core.errors import MongoError

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode
    from shardsim.shard.storage import Collection

STAGE = "$collStats"
_OPTIONS = ("latencyStats", "storageStats", "count", "queryExecStats")


def is_coll_stats(pipeline: Any) -> bool:
    """True when ``pipeline`` starts with ``$collStats``."""
    return bool(pipeline) and isinstance(pipeline[0], dict) and STAGE in pipeline[0]


def check_position(pipeline: list[Any]) -> None:
    """40602 when ``$collStats`` appears after the first stage."""
    for st in pipeline[1:]:
        if isinstance(st, dict) and STAGE in st:
            raise MongoError(40602, f"{STAGE} is only valid as the first stage in a pipeline.")


def storage_stats(coll: "Collection", scale: int = 1) -> dict[str, Any]:
    """``storageStats`` of ``coll`` (``appendCollectionStorageStats``), sizes / ``scale``."""
    size = sum(len(bson.encode(d)) for d in coll.docs.values())
    count = len(coll.docs)
    index_sizes = {name: Int64(4096 + 16 * count) // scale for name in coll.indexes}
    total_index = sum(int(v) for v in index_sizes.values())
    out: dict[str, Any] = {
        "size": Int64(size // scale), "count": Int64(count),
        "avgObjSize": Int64(size // count) if count else Int64(0),
        "numOrphanDocs": Int64(0), "storageSize": Int64(size // scale),
        "freeStorageSize": Int64(0), "capped": bool(coll.options.get("capped"))}
    if out["capped"]:
        out["max"] = Int64(coll.options.get("max") or 0)
        out["maxSize"] = Int64(int(coll.options.get("size") or 0) // scale)
    out.update({"nindexes": len(coll.indexes), "indexDetails": {}, "indexBuilds": [],
                "totalIndexSize": Int64(total_index),
                "totalSize": Int64(size // scale + total_index),
                "indexSizes": index_sizes, "scaleFactor": scale})
    return out


def coll_stats_docs(node: "ShardNode", db: str, name: str, spec: Any) -> list[dict[str, Any]]:
    """The one document ``$collStats: spec`` on ``db.name`` produces on this shard."""
    if not isinstance(spec, dict):
        raise MongoError(40166, f"{STAGE} must take a nested object but found: {spec!r}")
    for k in spec:
        if k not in _OPTIONS:
            raise MongoError(40415, f"BSON field '{STAGE}.{k}' is an unknown field.")
    coll = node.storage.get(db, name)
    ns = f"{db}.{name}"
    now = datetime.datetime.now(datetime.timezone.utc)
    doc: dict[str, Any] = {"ns": ns, "shard": node.shard_name, "host": node.address,
                           "localTime": now.replace(microsecond=now.microsecond // 1000 * 1000)}
    if "latencyStats" in spec:
        zero = {"latency": Int64(0), "ops": Int64(0)}
        doc["latencyStats"] = {"reads": dict(zero), "writes": dict(zero),
                               "commands": dict(zero), "transactions": dict(zero)}
    if "storageStats" in spec:
        opt = spec["storageStats"] if isinstance(spec["storageStats"], dict) else {}
        scale = opt.get("scale", 1)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale < 1:
            raise MongoError(2, "scale has to be >= 1")
        if coll is None:
            raise MongoError(26, f"Unable to retrieve storageStats in {STAGE} stage :: caused "
                                 f"by :: Collection [{ns}] not found.")
        doc["storageStats"] = storage_stats(coll, int(scale))
    if "count" in spec:
        if coll is None:
            raise MongoError(26, f"Unable to retrieve count in {STAGE} stage :: caused by :: "
                                 f"Collection [{ns}] not found.")
        doc["count"] = Int64(len(coll.docs))
    if "queryExecStats" in spec:
        doc["queryExecStats"] = {"collectionScans": {"total": Int64(0),
                                                     "nonTailable": Int64(0)}}
    return [doc]
