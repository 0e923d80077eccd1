"""Collection metadata DDL on the config server: ``refineCollectionShardKey``, ``mergeChunks``,
``setAllowMigrations`` and ``checkMetadataConsistency``
(``refine_collection_shard_key_coordinator.cpp``, ``merge_chunks_command.cpp`` /
``ShardingCatalogManager::commitChunksMerge``, ``configsvr_set_allow_migrations_command.cpp``,
``check_metadata_consistency.cpp`` / ``metadata_consistency_util.cpp``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bson import MaxKey, MinKey, ObjectId
from bson.timestamp import Timestamp

from shardsim.configsvr import migration
from shardsim.configsvr.catalog import split_ns
from shardsim.core.commands import CommandFamily, Request, check_type
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern, SortKey, compare_keys
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

commands = CommandFamily("metadata")


def _sharded(found: list[dict[str, Any]], ns: str) -> dict[str, Any]:
    if not found or found[0].get("unsplittable"):
        raise MongoError(118, f"Collection {ns} is not sharded.")
    return found[0]


def _has_index_prefix(indexes: list[dict[str, Any]], key: dict[str, Any]) -> bool:
    """True when an index (not sparse, not partial) starts with ``key``'s fields."""
    fields = list(key)
    for i in indexes:
        if i.get("sparse") or i.get("partialFilterExpression"):
            continue
        if list(i.get("key", {}))[:len(fields)] == fields:
            return True
    return False


@commands.handler(csrq.RefineCollectionShardKey.NAME, privileges=priv.INTERNAL)
async def refine_shard_key(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrRefineCollectionShardKey: ns, key}`` -> ``{}``: the key gets suffix fields;
    chunk bounds get MinKey (MaxKey for the global max) for them; the epoch and timestamp
    change, the UUID does not; every owning shard records the new key; the primary shard
    writes ``o2: {refineCollectionShardKey: ns, shardKey, oldShardKey}``. Errors: 73, 40414,
    NamespaceNotSharded (118), InvalidOptions (72) when the current key is not a prefix of
    the new one or no index supports it."""
    ns = req.arg
    db, coll = split_ns(ns)
    key = check_type(req, "key", dict, "object", required=True)
    pattern = KeyPattern.parse(key)
    async with node.ddl_lock:
        entry = _sharded(await node.find_all("collections", {"_id": ns}), ns)
        old = dict(entry["key"])
        if list(pattern.pattern.items())[:len(old)] != list(old.items()):
            raise MongoError(72, f"refineCollectionShardKey: new shard key {pattern.pattern} "
                                 f"must have the current shard key {old} as a prefix")
        if pattern.pattern == old:
            return {}
        chunks = await node.find_all("chunks", {"uuid": entry["uuid"]})
        owners = sorted({c["shard"] for c in chunks})
        idx = await node.on_shard(owners[0], db, {"listIndexes": coll})
        if not pattern.is_hashed and not _has_index_prefix(idx["cursor"]["firstBatch"],
                                                          pattern.pattern):
            raise MongoError(72, "Please create an index that starts with the proposed shard "
                                 "key before sharding the collection")
        extra = [f for f in pattern.pattern if f not in old]
        now = node.clock.now()
        for c in chunks:
            mn, mx = dict(c["min"]), dict(c["max"])
            for f in extra:
                mn[f] = MinKey()
                mx[f] = MaxKey() if all(isinstance(v, MaxKey) for v in c["max"].values()) \
                    else MinKey()
            await node.update("chunks", {"_id": c["_id"]}, {"$set": {"min": mn, "max": mx}})
        await node.update("collections", {"_id": ns}, {"$set": {
            "key": pattern.pattern, "lastmodEpoch": ObjectId(), "timestamp": now}})
        await migration.push_metadata(node, ns)  # a new epoch: every shard must know it
        for shard in owners:
            await node.on_shard(shard, db, shrq.EnsureCollection(
                coll, uuid=entry["uuid"], shardKey=pattern.pattern).to_command())
        primary = (await node.find_all("databases", {"_id": db}))[0]["primary"]
        await node.on_shard(primary, db, shrq.Noop(
            {"msg": {"refineCollectionShardKey": ns}},
            o2={"refineCollectionShardKey": ns, "shardKey": pattern.pattern, "oldShardKey": old},
            ns=ns, ui=entry["uuid"]).to_command())
    return {}


@commands.handler(csrq.CommitChunksMerge.NAME, privileges=priv.INTERNAL)
async def merge_chunks(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """mergeChunks: ``{_configsvrCommitChunksMerge: ns, bounds: [min, max]}`` -> ``{}``. The
    chunks in ``[min, max)`` must be contiguous, at least one, start and end at chunk
    boundaries and be on one shard. Errors: 73, 40414, 118, BadValue (2) for bad bounds,
    IllegalOperation (20) when the range is not exactly chunks of one shard."""
    ns = req.arg
    split_ns(ns)
    bounds = check_type(req, "bounds", list, "array", required=True)
    if len(bounds) != 2 or not all(isinstance(b, dict) for b in bounds):
        raise MongoError(2, "Expected bounds to be of the form [minKey, maxKey]")
    async with node.ddl_lock:
        entry = _sharded(await node.find_all("collections", {"_id": ns}), ns)
        pattern = KeyPattern(entry["key"])
        if set(bounds[0]) != set(pattern.fields) or set(bounds[1]) != set(pattern.fields):
            raise MongoError(2, f"bounds {bounds} are not valid for shard key {pattern.pattern}")
        lo, hi = pattern.bound_to_key(bounds[0]), pattern.bound_to_key(bounds[1])
        chunks = sorted(await node.find_all("chunks", {"uuid": entry["uuid"]}),
                        key=lambda c: SortKey(pattern.bound_to_key(c["min"])))
        inside = [c for c in chunks if compare_keys(lo, pattern.bound_to_key(c["min"])) <= 0
                  and compare_keys(pattern.bound_to_key(c["max"]), hi) <= 0]
        if not inside or compare_keys(pattern.bound_to_key(inside[0]["min"]), lo) != 0 or \
                compare_keys(pattern.bound_to_key(inside[-1]["max"]), hi) != 0:
            raise MongoError(20, f"could not merge chunks, collection {ns} range starting at "
                                 f"{bounds[0]} and ending at {bounds[1]} does not match chunk "
                                 f"boundaries")
        if len({c["shard"] for c in inside}) != 1:
            raise MongoError(20, f"could not merge chunks, collection {ns} range starting at "
                                 f"{bounds[0]} and ending at {bounds[1]} does not belong to "
                                 f"a single shard")
        if len(inside) == 1:
            return {}
        major = max(c["lastmod"].time for c in chunks)
        minor = max(c["lastmod"].inc for c in chunks if c["lastmod"].time == major)
        now = node.clock.now()
        first = inside[0]
        await node.delete("chunks", {"_id": {"$in": [c["_id"] for c in inside[1:]]}})
        await node.update("chunks", {"_id": first["_id"]}, {"$set": {
            "max": inside[-1]["max"], "lastmod": Timestamp(major, minor + 1),
            "onCurrentShardSince": now, "history": [{"validAfter": now, "shard": first["shard"]}]}})
        await migration.push_metadata(node, ns, [first["shard"]])
    return {}


@commands.handler(csrq.SetAllowMigrations.NAME, privileges=priv.INTERNAL)
async def set_allow_migrations(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrSetAllowMigrations: ns, allowMigrations: bool}`` -> ``{}``: sets (or, for
    true, removes) ``permitMigrations: false`` on the collection; the balancer and
    moveChunk then refuse it (ConflictingOperationInProgress 117). Errors: 73, 40414, 14,
    NamespaceNotSharded (118)."""
    ns = req.arg
    split_ns(ns)
    allow = check_type(req, "allowMigrations", bool, "bool", required=True)
    async with node.ddl_lock:
        _sharded(await node.find_all("collections", {"_id": ns}), ns)
        change = {"$unset": {"permitMigrations": 1}} if allow else \
            {"$set": {"permitMigrations": False}}
        await node.update("collections", {"_id": ns}, change)
    return {}


def check_migrations_allowed(entry: dict[str, Any]) -> None:
    """ConflictingOperationInProgress (117) when ``setAllowMigrations`` turned migrations off
    for the collection ``entry`` (``MigrationSourceManager``'s check)."""
    if entry.get("permitMigrations") is False:
        raise MongoError(117, "Collection is undergoing changes so moveChunk is not allowed.")


def _range_issues(ns: str, pattern: KeyPattern, chunks: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """RoutingTableRangeGap / RoutingTableRangeOverlap / RoutingTableMissingMinKey /
    RoutingTableMissingMaxKey of one collection's chunks."""
    out: list[dict[str, Any]] = []
    cs = sorted(chunks, key=lambda c: SortKey(pattern.bound_to_key(c["min"])))
    if not cs:
        return out
    gmin, gmax = tuple(pattern.global_min().values()), tuple(pattern.global_max().values())
    if compare_keys(pattern.bound_to_key(cs[0]["min"]), gmin) != 0:
        out.append({"type": "RoutingTableMissingMinKey", "description": "Routing table has a "
                    "gap because first chunk does not start from MinKey",
                    "details": {"collectionUUID": cs[0]["uuid"], "minKeyObj": cs[0]["min"]}})
    for a, b in zip(cs, cs[1:]):
        c = compare_keys(pattern.bound_to_key(a["max"]), pattern.bound_to_key(b["min"]))
        if c:
            kind = "RoutingTableRangeGap" if c < 0 else "RoutingTableRangeOverlap"
            out.append({"type": kind, "description": f"Found {'gap' if c < 0 else 'overlap'} "
                        f"between chunks of {ns}",
                        "details": {"collectionUUID": a["uuid"], "chunkA": a, "chunkB": b}})
    if compare_keys(pattern.bound_to_key(cs[-1]["max"]), gmax) != 0:
        out.append({"type": "RoutingTableMissingMaxKey", "description": "Routing table has a "
                    "gap because last chunk does not end with MaxKey",
                    "details": {"collectionUUID": cs[-1]["uuid"], "maxKeyObj": cs[-1]["max"]}})
    return out


async def _collection_issues(node: ConfigServerNode, entry: dict[str, Any]
                             ) -> list[dict[str, Any]]:
    ns = entry["_id"]
    db, coll = ns.split(".", 1)
    pattern = KeyPattern(entry["key"])
    chunks = await node.find_all("chunks", {"uuid": entry["uuid"]})
    out = _range_issues(ns, pattern, chunks)
    for shard in sorted({c["shard"] for c in chunks}):
        listed = await node.on_shard(shard, db, {"listCollections": 1, "filter": {"name": coll}})
        infos = listed["cursor"]["firstBatch"]
        if not infos:
            out.append({"type": "MissingLocalCollection", "description": "Collection registered "
                        "on the sharding catalog not found on the given shards",
                        "details": {"namespace": ns, "collectionUUID": entry["uuid"],
                                    "shard": shard}})
            continue
        uuid = infos[0].get("info", {}).get("uuid")
        if uuid != entry["uuid"]:
            out.append({"type": "CollectionUUIDMismatch", "description": "Found collection on "
                        "non primary shard with different UUID than on the sharding catalog",
                        "details": {"namespace": ns, "shard": shard, "localUUID": uuid,
                                    "uuid": entry["uuid"]}})
        idx = await node.on_shard(shard, db, {"listIndexes": coll})
        if not _has_index_prefix(idx["cursor"]["firstBatch"], entry["key"]) and \
                not pattern.is_hashed:
            out.append({"type": "MissingShardKeyIndex", "description": "Found sharded "
                        "collection without a shard key index",
                        "details": {"namespace": ns, "shard": shard, "shardKey": entry["key"]}})
    return out


@commands.handler(csrq.CheckMetadataConsistency.NAME, privileges=priv.INTERNAL)
async def check_metadata_consistency(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``{_configsvrCheckMetadataConsistency: 1 | <coll>, db}`` -> ``{inconsistencies: [...]}``
    for the cluster (db ``admin``), a database or one collection: routing-table gaps and
    overlaps, collections missing on or with another UUID on an owning shard, a missing shard
    key index, unsharded collections on a shard other than the database's primary
    (``MisplacedCollection``). Each is ``{type, description, details}``."""
    db = req.get("db", "admin")
    target = req.arg if isinstance(req.arg, str) else None
    colls = await node.find_all("collections")
    out: list[dict[str, Any]] = []
    for entry in colls:
        edb, ecoll = entry["_id"].split(".", 1)
        if db != "admin" and edb != db or target is not None and ecoll != target:
            continue
        out.extend(await _collection_issues(node, entry))
    tracked = {c["_id"] for c in colls}
    dbs = await node.find_all("databases", {} if db == "admin" else {"_id": db})
    for d in dbs:
        for shard in [s["_id"] for s in await node.shards()]:
            if shard == d["primary"]:
                continue
            listed = await node.on_shard(shard, d["_id"], {"listCollections": 1,
                                                           "nameOnly": True})
            for info in listed["cursor"]["firstBatch"]:
                ns = f"{d['_id']}.{info['name']}"
                if ns in tracked or info["name"].startswith("system.") or \
                        target is not None and info["name"] != target:
                    continue
                out.append({"type": "MisplacedCollection", "description": "Unsharded "
                            "collection found on shard different from database primary shard",
                            "details": {"namespace": ns, "shard": shard,
                                        "localUUID": info.get("info", {}).get("uuid")}})
    return {"inconsistencies": out}


__all__ = ["check_migrations_allowed", "commands"]
