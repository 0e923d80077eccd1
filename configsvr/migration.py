"""The config server's part of a chunk migration, and the shards' filtering metadata.

As 8.0 splits it: the config server (``_configsvrMoveRange``, moveChunk and the balancer:
``configsvr_move_range_command.cpp``, ``balancer_commands_scheduler_impl.cpp``) keeps the DDL
lock and the argument checks and sends ``_shardsvrMoveRange`` to the donor's primary, which runs
the migration (``MigrationSourceManager``: :mod:`shard.migration_source`) and commits it here
with ``_configsvrCommitChunkMigration`` (:func:`commit_chunk_migration`: the chunk moves to the
recipient, the donor's control chunk is bumped, the placement history is written when the set
of owning shards changes). The donor's error comes back with its code. A migration that a
failure interrupts is completed by the donor's primary (or the next one), not here.

Not faithful: the config server pushes the new filtering and routing metadata to every shard
after the donor's reply (:func:`push_metadata`; every shard gets the whole routing table, which
post-image look-ups use: :mod:`shard.sharding_runtime`), where mongod's shards refresh it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from shardsim.configsvr import placement_history
from shardsim.core.errors import MongoError
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol.versions import NETWORK_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")


async def push_metadata(node: "ConfigServerNode", ns: str, shards: list[str] | None = None
                        ) -> None:
    """Send every shard (or ``shards``) the filtering and routing metadata of the sharded
    ``ns``: epoch, timestamp, uuid, key, every chunk with its ``lastmod`` and owner, and the
    shards' hosts and the config server's address, which the shard keeps as its shard identity
    to refresh the metadata itself (``_shardsimSetFilteringMetadata``, to the shard's primary).
    An optimisation where mongod's participants refresh at the end of the operation
    (``_flushRoutingTableCacheUpdates``): a shard also refreshes by itself when a routed
    request names a version it does not know (``shard/sharding_runtime.py``).
    A shard derives its own placement version from its chunks and routes post-image look-ups
    with the rest. A shard that is down is skipped (it refreshes when a request tells it
    to)."""
    entry, _, chunk_docs = await node.load_collection(ns)
    db = ns.split(".", 1)[0]
    shard_docs = await node.shards()
    names = shards if shards is not None else [s["_id"] for s in shard_docs]
    meta = {"epoch": entry["lastmodEpoch"], "timestamp": entry["timestamp"],
            "uuid": entry["uuid"], "key": entry["key"],
            "chunks": [{"min": d["min"], "max": d["max"], "lastmod": d["lastmod"],
                        "shard": d["shard"]} for d in chunk_docs],
            "shards": {s["_id"]: s["host"] for s in shard_docs},
            "configsvr": node.connection_string}
    for shard in names:
        try:
            await node.on_shard(shard, db, shrq.SetFilteringMetadata(ns, meta).to_command())
        except MongoError as exc:
            if exc.code not in NETWORK_ERRORS:
                raise
            log.warning("filtering metadata of %s not sent to %s: %s", ns, shard, exc.errmsg)


async def commit_chunk_migration(node: "ConfigServerNode", ns: str, migrated: dict[str, Any],
                                 donor: str, to: str, epoch: Any) -> dict[str, Any]:
    """The config server's part of phase 5, as ``_configsvrCommitChunkMigration`` runs
    ``ShardingCatalogManager::commitChunkMigration``
    (``src/mongo/db/s/config/sharding_catalog_manager_chunk_operations.cpp``): check that the
    collection still has epoch ``epoch`` (else StaleEpoch, 150) and that ``donor`` still owns a
    chunk with exactly the bounds of ``migrated`` (``{min, max}``; else
    ConflictingOperationInProgress, 117); then the chunk moves to ``to`` at version
    ``(major + 1, 0)`` and the donor's highest remaining chunk (the control chunk) becomes
    ``(major + 1, 1)``, so both shards' placement versions change; when that changes the set
    of shards owning ``ns``, ``config.placementHistory`` gets the new set (8.0 writes it in
    the commit's transaction; its timestamp is below the donor's ``moveChunk`` control event,
    written after this reply, so a v2 change-stream reader refreshing at that event sees the
    new set). Returns ``{shardVersion: {e, t, v}}`` with the donor's new placement version
    (``v`` its highest chunk version, ``Timestamp(0, 0)`` when it owns no chunk of ``ns`` any
    more). Sent by the donor while the config server's moveChunk/moveRange holds the DDL
    lock; the writes are the config server's own (``w: majority`` on a config replica set
    through :meth:`ConfigServerNode.update`)."""
    async with node.chunk_op_lock:
        return await _commit_chunk_migration(node, ns, migrated, donor, to, epoch)


async def _commit_chunk_migration(node: "ConfigServerNode", ns: str, migrated: dict[str, Any],
                                  donor: str, to: str, epoch: Any) -> dict[str, Any]:
    entry, _, chunk_docs = await node.load_collection(ns)
    if entry["lastmodEpoch"] != epoch:
        raise MongoError(150, f"The epoch of collection '{ns}' has changed since the migration "
                              f"began. Expected {epoch}, but found {entry['lastmodEpoch']}")
    doc = next((d for d in chunk_docs if d["shard"] == donor and d["min"] == migrated["min"]
                and d["max"] == migrated["max"]), None)
    if doc is None:
        raise MongoError(117, f"Migrated range {migrated['min']} -> {migrated['max']} of "
                              f"{ns} is no longer owned by shard {donor}: the commit is refused")
    sent, now_v = migrated.get("lastmod"), doc["lastmod"]
    if sent is not None and (sent.time, sent.inc) < (now_v.time, now_v.inc):
        # a new donor primary fenced this commit off (ensure_chunk_version_is_greater_than)
        raise MongoError(117, f"Rejecting migration request because the version of the "
                              f"requested chunk {{ min: {migrated['min']}, max: "
                              f"{migrated['max']} }}({sent.time}|{sent.inc}) is older than the "
                              f"version of the current chunk {{ min: {doc['min']}, max: "
                              f"{doc['max']} }}({now_v.time}|{now_v.inc}) on shard {donor}")
    major = max(d["lastmod"].time for d in chunk_docs) + 1
    now = node.clock.now()
    await node.update("chunks", {"_id": doc["_id"]}, {"$set": {
        "shard": to, "lastmod": Timestamp(major, 0), "onCurrentShardSince": now},
        "$push": {"history": {"$each": [{"validAfter": now, "shard": to}], "$position": 0}}})
    rest = [d for d in chunk_docs if d["shard"] == donor and d["_id"] != doc["_id"]]
    version = Timestamp(0, 0)
    if rest:  # the control chunk: the donor's placement version changes too
        control = max(rest, key=lambda d: (d["lastmod"].time, d["lastmod"].inc))
        await node.update("chunks", {"_id": control["_id"]},
                          {"$set": {"lastmod": Timestamp(major, 1)}})
        version = Timestamp(major, 1)
    before = {d["shard"] for d in chunk_docs}
    after = {d["shard"] for d in chunk_docs if d["_id"] != doc["_id"]} | {to}
    if before != after:
        await placement_history.record(node, ns, after)
    return {"shardVersion": {"e": entry["lastmodEpoch"], "t": entry["timestamp"],
                             "v": version}}


async def ensure_chunk_version_is_greater_than(node: "ConfigServerNode", uuid: Any, ns: Any,
                                               lo: dict[str, Any], hi: dict[str, Any],
                                               version: dict[str, Any]) -> None:
    """``ShardingCatalogManager::ensureChunkVersionIsGreaterThan``
    (``sharding_catalog_manager_chunk_operations.cpp``): when the collection (by ``uuid``, else
    ``ns``) still has epoch ``version["e"]`` and the chunk ``[lo, hi)`` exists with version
    ``version["v"]`` or older, that chunk's ``lastmod`` becomes (collection major + 1, 0).
    Anything else (collection or chunk gone, another epoch, a newer chunk version: the migration
    committed) leaves the catalog as it is. Under the chunk-operation lock, as the commit, so a
    commit sent before this and still running finishes first, and one arriving after it is
    refused for its older chunk version."""
    async with node.chunk_op_lock:
        filt = {"uuid": uuid} if uuid is not None else {"_id": ns}
        entries = await node.find_all("collections", filt)
        if not entries or entries[0].get("lastmodEpoch") != version.get("e"):
            return
        chunk_docs = await node.find_all("chunks", {"uuid": entries[0]["uuid"]})
        doc = next((d for d in chunk_docs if d["min"] == lo and d["max"] == hi), None)
        want = version.get("v")
        if doc is None or not isinstance(want, Timestamp):
            return
        if (doc["lastmod"].time, doc["lastmod"].inc) > (want.time, want.inc):
            return
        major = max(d["lastmod"].time for d in chunk_docs) + 1
        await node.update("chunks", {"_id": doc["_id"]},
                          {"$set": {"lastmod": Timestamp(major, 0)}})
        log.info("chunk [%s, %s) of %s bumped to version %d|0 (a migration's recovery)", lo, hi,
                 entries[0]["_id"], major)


async def migrate(node: "ConfigServerNode", ns: str, entry: dict[str, Any],
                  doc: dict[str, Any], to: str) -> None:
    """Move chunk ``doc`` of ``ns`` to shard ``to``: ``_shardsvrMoveRange`` to the donor's
    primary, waiting for its reply (``ConfigsvrMoveRangeCommand``; the caller holds the DDL
    lock and has created the collection and its shard-key index on ``to``); then every shard
    gets the collection's metadata (also after a failure: the donor may have committed).
    Raises the donor's error with its code (a network error when it died meanwhile: its next
    primary completes the migration)."""
    donor = doc["shard"]
    try:
        await node.on_shard(donor, "admin", shrq.ShardsvrMoveRange(
            ns, to, doc["min"], doc["max"], fromShard=donor, epoch=entry["lastmodEpoch"],
            collectionTimestamp=entry["timestamp"], waitForDelete=True).to_command())
    finally:
        try:
            await push_metadata(node, ns)
        except MongoError as exc:  # dropped meanwhile, or a shard's own error: not ours
            log.warning("metadata of %s not pushed after the migration: %s", ns, exc.errmsg)
    log.info("moved chunk %s of %s from %s to %s", doc["min"], ns, donor, to)
