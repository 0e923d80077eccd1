"""Chunks: ``_configsvrSplitChunk`` (``split``), ``_configsvrMoveChunk`` (``moveChunk``, a
migration without a balancer), ``_configsvrCommitChunkMigration`` (a migration's commit) and
``_configsvrEnsureChunkVersionIsGreaterThan`` (a new donor primary fencing off a commit in flight).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bson import MaxKey, MinKey
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.configsvr import migration
from shardsim.configsvr.catalog import chunk_doc, chunk_map, locate_chunk, split_ns
from shardsim.configsvr.commands.metadata import check_migrations_allowed
from shardsim.core.shard_key import Chunk, KeyPattern, SortKey, compare_keys
from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

commands = CommandFamily("chunks")


@commands.handler(csrq.SplitChunk.NAME, privileges=priv.INTERNAL)
async def split_chunk(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """split: at ``middle``, or at the median key of the chunk named by ``find``/``bounds``
    (the midpoint of the hash range for a hashed key). ``{_configsvrSplitChunk: ns, middle |
    find | bounds}`` -> ``{}``. Errors: InvalidNamespace (73), NamespaceNotSharded (118),
    BadValue (2) for a key that is not the shard key or a chunk boundary, or a chunk with
    fewer than 2 documents."""
    ns = req.arg
    split_ns(ns, "split")
    async with node.ddl_lock:
        entry, pattern, chunk_docs = await node.load_collection(ns)
        if req.get("middle") is not None:
            middle = req.get("middle")
            if not isinstance(middle, dict) or set(middle) != set(pattern.fields):
                raise MongoError(2, f"split key {middle} does not match the shard key "
                                    f"{pattern.pattern}")
            mid = pattern.bound_to_key(middle)
            cmap = chunk_map(pattern, chunk_docs)
            chunk = cmap.find(mid)
            doc = next(d for d in chunk_docs
                       if compare_keys(pattern.bound_to_key(d["min"]), chunk.min) == 0)
        else:
            doc = locate_chunk(pattern, chunk_docs, req, "split")
            lo, hi = pattern.bound_to_key(doc["min"]), pattern.bound_to_key(doc["max"])
            mid = await _median(node, entry, pattern, doc, lo, hi)
        lo, hi = pattern.bound_to_key(doc["min"]), pattern.bound_to_key(doc["max"])
        if compare_keys(mid, lo) <= 0 or compare_keys(mid, hi) >= 0:
            raise MongoError(2, f"new split key {pattern.key_to_bound(mid)} is a boundary key "
                                f"of existing chunk [{doc['min']},{doc['max']})")
        major = max(d["lastmod"].time for d in chunk_docs)
        minor = max(d["lastmod"].inc for d in chunk_docs if d["lastmod"].time == major)
        now = node.clock.now()
        await node.delete("chunks", {"_id": doc["_id"]})
        await node.insert("chunks", [
            chunk_doc(entry["uuid"], pattern, Chunk(lo, mid, doc["shard"]),
                      Timestamp(major, minor + 1), now),
            chunk_doc(entry["uuid"], pattern, Chunk(mid, hi, doc["shard"]),
                      Timestamp(major, minor + 2), now)])
        await migration.push_metadata(node, ns, [doc["shard"]])
        return {}


async def _median(node: ConfigServerNode, entry: dict[str, Any], pattern: KeyPattern,
                  doc: dict[str, Any], lo: tuple[Any, ...], hi: tuple[Any, ...]
                  ) -> tuple[Any, ...]:
    """The split point of the chunk ``doc`` ([lo, hi)): the hash midpoint for a hashed key,
    else the median shard key of its documents on its shard."""
    first = pattern.fields[0]
    if first in pattern.hashed and isinstance(lo[0], Int64 | int) and isinstance(hi[0], Int64 | int):
        return (Int64((int(lo[0]) + int(hi[0])) // 2),) + tuple(lo[1:])
    if first in pattern.hashed:
        a = -2 ** 63 if isinstance(lo[0], MinKey) else int(lo[0])
        b = 2 ** 63 - 1 if isinstance(hi[0], MaxKey) else int(hi[0])
        return (Int64((a + b) // 2),) + tuple(lo[1:])
    db, coll = entry["_id"].split(".", 1)
    keys = sorted((k for k in (pattern.key_of_doc(d) for d in
                               await node.shard_find_all(doc["shard"], db, coll))
                   if compare_keys(lo, k) <= 0 and compare_keys(k, hi) < 0), key=SortKey)
    if len(keys) < 2:
        raise MongoError(2, "cannot find a split point: the chunk has fewer than 2 documents")
    return keys[len(keys) // 2]


@commands.handler(csrq.MoveChunk.NAME, privileges=priv.INTERNAL)
async def move_chunk(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """moveChunk as a migration (``configsvr_move_range_command.cpp``): under the DDL lock,
    check the request, prepare the recipient's collection, then have the donor's primary run
    the migration (it writes ``migrateChunkToNewShard`` when the recipient has no chunk of the
    collection yet) (``_shardsvrMoveRange``, :func:`configsvr.migration.migrate`) and pass
    its error back with its code.

    ``{_configsvrMoveChunk: ns, find | bounds, to}`` -> ``{millis}``. Errors: InvalidNamespace
    (73), missing ``to`` (40414), NamespaceNotSharded (118), ShardNotFound (70), the chunk
    look-up's (:func:`configsvr.catalog.locate_chunk`).
    """
    ns = req.arg
    db, coll = split_ns(ns, "moveChunk")
    to = req.get("to")
    if not isinstance(to, str):
        raise MongoError(40414, "BSON field 'moveChunk.to' is missing but a required field")
    async with node.ddl_lock:
        entry, pattern, chunk_docs = await node.load_collection(ns)
        check_migrations_allowed(entry)  # setAllowMigrations (configsvr/commands/metadata.py)
        doc = locate_chunk(pattern, chunk_docs, req, "moveChunk")
        donor = doc["shard"]
        shard_names = {s["_id"] for s in await node.shards()}
        if to not in shard_names:
            raise MongoError(70, f"Shard {to} not found")
        if donor == to:
            return {"millis": 0}
        uuid = entry["uuid"]
        # the recipient clones the donor's options (validator, ...) as
        # MigrationDestinationManager::cloneCollectionIndexesAndOptions does
        listed = await node.on_shard(donor, db, {"listCollections": 1, "filter": {"name": coll}})
        infos = listed["cursor"]["firstBatch"]
        await node.on_shard(to, db, shrq.EnsureCollection(
            coll, uuid=uuid, shardKey=pattern.pattern,
            options=infos[0].get("options", {}) if infos else {}, primary=False).to_command())
        if pattern.pattern != {"_id": 1}:
            name = "_".join(f"{f}_{v}" for f, v in pattern.pattern.items())
            try:
                await node.on_shard(to, db, {"createIndexes": coll, "fromMigrate": True,
                                             "indexes": [{"key": pattern.pattern, "name": name}]})
            except MongoError as exc:
                if exc.code not in (85, 86, 68):
                    raise
        await migration.migrate(node, ns, entry, doc, to)
        return {"millis": 0}


@commands.handler(csrq.CommitChunkMigration.NAME, privileges=priv.INTERNAL)
async def commit_chunk_migration(node: ConfigServerNode, req: Request) -> dict[str, Any]:
    """``_configsvrCommitChunkMigration`` (``src/mongo/db/s/config/
    configsvr_commit_chunk_migration_command.cpp``): ``{_configsvrCommitChunkMigration: ns,
    fromShard, toShard, migratedChunk: {min, max}, fromShardCollectionVersion: {e, t, v}}`` ->
    ``{shardVersion: {e, t, v}}`` (:func:`configsvr.migration.commit_chunk_migration`).
    Errors: InvalidNamespace (73), NamespaceNotSharded (118), StaleEpoch (150) when the epoch
    changed, ConflictingOperationInProgress (117) when the donor no longer owns exactly that
    range. Sent by the donor from its critical section while the migration's request holds
    the DDL lock, so it does not take that lock (mongod serialises it with the chunk
    operations' lock)."""
    ns = req.arg
    split_ns(ns, csrq.CommitChunkMigration.NAME)
    chunk = req.get("migratedChunk")
    version = req.get("fromShardCollectionVersion")
    if not isinstance(chunk, dict) or not isinstance(chunk.get("min"), dict) \
            or not isinstance(chunk.get("max"), dict) or not isinstance(version, dict):
        raise MongoError(40414, f"BSON field '{csrq.CommitChunkMigration.NAME}.migratedChunk' "
                                f"is missing but a required field")
    migrated = {"min": chunk["min"], "max": chunk["max"]}
    if isinstance(chunk.get("lastmod"), Timestamp):
        migrated["lastmod"] = chunk["lastmod"]
    return await migration.commit_chunk_migration(
        node, ns, migrated, req.get("fromShard"), req.get("toShard"), version.get("e"))


@commands.handler(csrq.EnsureChunkVersionIsGreaterThan.NAME, privileges=priv.INTERNAL)
async def ensure_chunk_version_is_greater_than(node: ConfigServerNode, req: Request
                                               ) -> dict[str, Any]:
    """``_configsvrEnsureChunkVersionIsGreaterThan`` (:class:`csrq.EnsureChunkVersionIsGreaterThan`;
    :func:`configsvr.migration.ensure_chunk_version_is_greater_than`). Errors: a missing
    field (40414) or one of the wrong type (14)."""
    r = csrq.EnsureChunkVersionIsGreaterThan.parse(req.body)
    await migration.ensure_chunk_version_is_greater_than(
        node, r.collectionUUID, r.nss, r.minKey, r.maxKey, r.version)
    return {}
