"""Chunk migration as 8.0 runs it, and the shards' filtering metadata.

The phases follow ``MigrationSourceManager`` (``src/mongo/db/s/migration_source_manager.cpp``:
``startClone`` -> ``awaitToCatchUp`` -> ``enterCriticalSection`` -> ``commitChunkOnRecipient``
-> ``commitChunkMetadataOnConfig`` -> ``_cleanup``), the cloner's transfer mods
(``migration_chunk_cloner_source.cpp``), the recipient's apply loop
(``migration_destination_manager.cpp``: ``_migrateDriver``, every write ``fromMigrate``) and
range deletion (``range_deleter_service.cpp``, with ``orphanCleanupDelaySecs`` 0):

1. the donor persists its coordinator document and pending range-deletion task, then starts
   recording the collection's writes (``_shardsimMigrationStart``); the recipient clears the
   range and persists its pending task (``_shardsimRecvChunkStart``,
   ``MigrationDestinationManager::_migrateDriver``; :mod:`shard.range_deleter`);
2. clone: the range's documents are inserted on the recipient with ``fromMigrate``;
3. catch-up: ``_transferMods`` rounds re-send the documents written meanwhile (replacement
   upserts and deletes by ``_id``, ``fromMigrate``) until a round is small;
4. critical section on the donor: new writes to the collection wait, running ones finish; a last
   ``_transferMods`` round; the retryable-write session records follow the chunk;
5. commit on the config server (its ``_configsvrCommitChunkMigration`` command,
   :func:`commit_chunk_migration`): the chunk moves to the recipient at version ``(major + 1, 0)``
   and the donor's highest remaining chunk becomes ``(major + 1, 1)`` (so both shards'
   placement versions change: ``ShardingCatalogManager::commitChunkMigration``); both shards
   get their new filtering metadata;
6. the critical section is released: the waiting writes fail with StaleConfig (13388) and the
   routers retry them on the new owner;
7. completion by the decision in ``config.chunks``: range deletion on the side that does not
   own the range (``fromMigrate`` deletes), the persisted state removed
   (:mod:`configsvr.migration_recovery`, which also completes the migrations a restart or a
   failure interrupted).

Not faithful: the config server drives the phases (in 8.0 the donor shard runs
``MigrationSourceManager`` and the recipient pulls ``_migrateClone``/``_transferMods`` itself);
the filtering metadata is pushed to the shards instead of being pulled on refresh (every shard
gets the whole routing table, which post-image look-ups use: :mod:`shard.sharding_runtime`).
"""

from __future__ import annotations

import logging
import uuid as uuid_mod
from typing import TYPE_CHECKING, Any

from bson import Binary, ObjectId
from bson.int64 import Int64
from bson.timestamp import Timestamp

from shardsim.configsvr import catalog
from shardsim.configsvr import placement_history
from shardsim.configsvr.migration_recovery import UNREACHABLE
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern
from shardsim.core.protocol import configsvr as csrq
from shardsim.core.protocol import shard as shrq
from shardsim.core.protocol.versions import NETWORK_ERRORS

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.configsvr")

CATCH_UP_ROUNDS = 20  # transfer-mods rounds before the critical section at the latest
CATCH_UP_SMALL = 16  # a round this small lets the migration enter the critical section
BATCH = 1000


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


async def log_change(node: "ConfigServerNode", shard: str, what: str, ns: str,
                     details: dict[str, Any]) -> None:
    """Append an entry to ``config.changelog`` as ``ShardingLogging::logChange`` does
    (``src/mongo/db/s/sharding_logging.cpp``): ``{_id: "<server>-<time>-<oid>", server, shard,
    clientAddr, time: Date, what, ns, details}``. The migration writes ``moveChunk.commit``
    (``details: {min, max, from, to, counts}``, as ``MigrationSourceManager::
    commitChunkMetadataOnConfig``); ``counts`` holds only ``cloned`` faithfully. A failure to
    log is not an error of the operation (as in the server)."""
    now = catalog.date_now()
    server = f"{shard}-{now.isoformat()}-{ObjectId()}"
    try:
        await node.insert("changelog", [{"_id": server, "server": shard, "shard": shard,
                                         "clientAddr": "", "time": now, "what": what,
                                         "ns": ns, "details": details}])
    except MongoError as exc:  # pragma: no cover - logging only
        log.warning("changelog entry %s for %s not written: %s", what, ns, exc)


async def _apply_mods(node: "ConfigServerNode", to: str, db: str, coll: str,
                      mods: dict[str, Any]) -> None:
    """Apply one ``_transferMods`` reply on the recipient, ``fromMigrate``."""
    reload, deleted = mods.get("reload") or [], mods.get("deleted") or []
    for i in range(0, len(reload), BATCH):
        await node.on_shard(to, db, {"update": coll, "fromMigrate": True, "ordered": True,
                                     "updates": [{"q": {"_id": d["_id"]}, "u": d, "upsert": True}
                                                 for d in reload[i:i + BATCH]]})
    for i in range(0, len(deleted), BATCH):
        await node.on_shard(to, db, {"delete": coll, "fromMigrate": True, "ordered": True,
                                     "deletes": [{"q": {"_id": d["_id"]}, "limit": 1}
                                                 for d in deleted[i:i + BATCH]]})


async def _clone_and_catch_up(node: "ConfigServerNode", donor: str, to: str, db: str,
                              coll: str, sid: str) -> int:
    """Phases 2-3: clone, then transfer-mods rounds until one is small. Returns the number of
    documents cloned."""
    objects = (await node.on_shard(donor, "admin", shrq.MigrateClone(1, sid).to_command()))[
        "objects"]
    for i in range(0, len(objects), BATCH):
        await node.on_shard(to, db, {"insert": coll, "documents": objects[i:i + BATCH],
                                     "ordered": False, "fromMigrate": True})
    await node.migration_recovery.pause("moveChunkHangAtStep3")
    for _ in range(CATCH_UP_ROUNDS):
        mods = await node.on_shard(donor, "admin", shrq.TransferMods(1, sid).to_command())
        await _apply_mods(node, to, db, coll, mods)
        if int(mods.get("size", 0)) <= CATCH_UP_SMALL:
            break
    return len(objects)


async def commit_chunk_migration(node: "ConfigServerNode", ns: str, migrated: dict[str, Any],
                                 donor: str, to: str, epoch: Any) -> dict[str, Any]:
    """The config server's part of phase 5, as ``_configsvrCommitChunkMigration`` runs
    ``ShardingCatalogManager::commitChunkMigration``
    (``src/mongo/db/s/config/sharding_catalog_manager_chunk_operations.cpp``): check that the
    collection still has epoch ``epoch`` (else StaleEpoch, 150) and that ``donor`` still owns a
    chunk with exactly the bounds of ``migrated`` (``{min, max}``; else
    ConflictingOperationInProgress, 117); then the chunk moves to ``to`` at version
    ``(major + 1, 0)`` and the donor's highest remaining chunk (the control chunk) becomes
    ``(major + 1, 1)``, so both shards' placement versions change. Returns
    ``{shardVersion: {e, t, v}}`` with the donor's new placement version (``v`` its highest
    chunk version, ``Timestamp(0, 0)`` when it owns no chunk of ``ns`` any more). The caller
    holds the DDL lock; the writes are the config server's own (``w: majority`` on a config
    replica set through :meth:`ConfigServerNode.update`)."""
    entry, _, chunk_docs = await node.load_collection(ns)
    if entry["lastmodEpoch"] != epoch:
        raise MongoError(150, f"The epoch of collection '{ns}' has changed since the migration "
                              f"began. Expected {epoch}, but found {entry['lastmodEpoch']}")
    doc = next((d for d in chunk_docs if d["shard"] == donor and d["min"] == migrated["min"]
                and d["max"] == migrated["max"]), None)
    if doc is None:
        raise MongoError(117, f"Migrated range {migrated['min']} -> {migrated['max']} of "
                              f"{ns} is no longer owned by shard {donor}: the commit is refused")
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
    return {"shardVersion": {"e": entry["lastmodEpoch"], "t": entry["timestamp"],
                             "v": version}}


async def _commit(node: "ConfigServerNode", ns: str, doc: dict[str, Any],
                  epoch: Any, donor: str, to: str) -> dict[str, Any]:
    """Phase 5: ``_configsvrCommitChunkMigration`` (:func:`commit_chunk_migration`, through
    this config server's own command, as the donor will send it), then both shards' filtering metadata (first,
    their versions changed), then everyone's routing information. Returns the commit's
    reply."""
    reply = await node.local(csrq.CommitChunkMigration.NAME, "admin", csrq.CommitChunkMigration(
        ns, donor, to, {"min": doc["min"], "max": doc["max"]},
        {"e": epoch}).to_command())
    await push_metadata(node, ns, [donor, to])
    others = [s["_id"] for s in await node.shards() if s["_id"] not in (donor, to)]
    if others:
        await push_metadata(node, ns, others)
    return reply


async def migrate(node: "ConfigServerNode", ns: str, entry: dict[str, Any], pattern: KeyPattern,
                  chunk_docs: list[dict[str, Any]], doc: dict[str, Any], to: str) -> int:
    """Move chunk ``doc`` of ``ns`` to shard ``to`` (phases 1-7 of the module doc; the caller
    holds the DDL lock and has created the collection and its shard-key index on ``to``).
    Returns the number of documents moved. First the coordinations of ``ns`` left by an
    interrupted migration are completed (ConflictingOperationInProgress, 117, while one cannot
    be); the donor persists its coordinator document and the recipient clears the range before
    anything is cloned; whatever happens, the migration is completed by its decision in
    ``config.chunks`` (:mod:`configsvr.migration_recovery`): the side that does not own the
    range deletes its copy. Raises what a shard answers."""
    db, coll = ns.split(".", 1)
    donor = doc["shard"]
    recovery = node.migration_recovery
    if await recovery.recover_once(ns):
        raise MongoError(117, f"a previous migration of {ns} is not completed yet: a shard "
                              f"does not answer")
    mid = Binary(uuid_mod.uuid4().bytes, 4)
    sid = f"{donor}_{to}_{uuid_mod.uuid4().hex}"
    coordinator = {"_id": mid, "migrationSessionId": sid, "nss": ns,
                   "collectionUuid": entry["uuid"], "donorShardId": donor,
                   "recipientShardId": to, "range": {"min": doc["min"], "max": doc["max"]},
                   "keyPattern": pattern.pattern}
    recovery.active.add(mid)
    try:
        try:
            await node.on_shard(donor, "admin", shrq.MigrationStart(
                ns, sid, pattern.pattern, doc["min"], doc["max"], migrationId=mid,
                uuid=entry["uuid"], to=to).to_command())
            cloned = await _run_phases(node, ns, doc, chunk_docs, pattern, donor, to, sid, mid,
                                        entry["lastmodEpoch"])
        finally:
            await _complete(node, coordinator)
    finally:
        recovery.active.discard(mid)
    log.info("moved chunk %s of %s from %s to %s (%d docs cloned)", doc["min"], ns, donor, to,
             cloned)
    return cloned


async def _complete(node: "ConfigServerNode", coordinator: dict[str, Any]) -> None:
    """Complete the migration by its decision; when a shard does not answer, leave it to the
    background recovery (:meth:`MigrationRecovery.kick`)."""
    recovery = node.migration_recovery
    try:
        await recovery.complete(coordinator)
    except MongoError as exc:
        log.warning("migration %s of %s not completed: %s", coordinator["_id"],
                    coordinator["nss"], exc.errmsg)
        recovery.active.discard(coordinator["_id"])
        recovery.kick()
        if exc.code not in UNREACHABLE:
            raise


async def _run_phases(node: "ConfigServerNode", ns: str, doc: dict[str, Any],
                      chunk_docs: list[dict[str, Any]], pattern: KeyPattern, donor: str,
                      to: str, sid: str, mid: Binary, epoch: Any) -> int:
    """Phases 2-6: the recipient's start, clone, catch-up, critical section, commit.
    Returns the number of documents cloned."""
    db, coll = ns.split(".", 1)
    recovery = node.migration_recovery
    await node.on_shard(to, "admin", shrq.RecvChunkStart(
        ns, mid, pattern.pattern, doc["min"], doc["max"], uuid=doc.get("uuid"),
        from_=donor).to_command())
    in_cs = False
    try:
        cloned = await _clone_and_catch_up(node, donor, to, db, coll, sid)
        await recovery.pause("moveChunkHangAtStep4")
        await node.on_shard(donor, "admin", shrq.MigrationCriticalSection(ns, True).to_command())
        in_cs = True
        mods = await node.on_shard(donor, "admin", shrq.TransferMods(1, sid).to_command())
        await _apply_mods(node, to, db, coll, mods)
        records = (await node.on_shard(donor, "admin",
                                       shrq.SessionRecords(1).to_command()))["records"]
        if records:
            await node.on_shard(to, "admin", shrq.MergeSessionRecords(1, records).to_command())
        await recovery.pause("moveChunkHangAtStep5")
        # The v2 change-stream readers' control event, on the donor inside its critical section
        # (no donor write after it; the recipient's next writes follow the commit):
        # notifyChangeStreamsOnChunkMigrated / buildMoveChunkOplogEntries.
        # config.placementHistory first when the set of owning shards changes (its timestamp is
        # then below the no-op's, so a reader refreshing at the no-op's time sees the new set;
        # the donor takes no write from here on). Set back if the commit fails.
        remaining = [d for d in chunk_docs if d["shard"] == donor and d["_id"] != doc["_id"]]
        before = {d["shard"] for d in chunk_docs}
        after = {d["shard"] for d in chunk_docs if d["_id"] != doc["_id"]} | {to}
        if before != after:
            await placement_history.record(node, ns, after)
        await node.on_shard(donor, db, shrq.Noop(
            {"msg": {"moveChunk": ns}},
            o2={"moveChunk": ns, "donor": donor, "recipient": to,
                "allCollectionChunksMigratedFromDonor": not remaining},
            ns=ns, ui=doc.get("uuid")).to_command())
        try:
            await _commit(node, ns, doc, epoch, donor, to)
        except BaseException:
            if before != after:
                await placement_history.record(node, ns, before)
            raise
        await log_change(node, donor, "moveChunk.commit", ns, {
            "min": doc["min"], "max": doc["max"], "from": donor, "to": to,
            "counts": {"cloned": Int64(cloned), "clonedBytes": Int64(0),
                       "catchup": Int64(0), "steady": Int64(0)}})
        await recovery.pause("moveChunkHangAtStep6")
    finally:
        if in_cs:
            try:
                await node.on_shard(donor, "admin",
                                    shrq.MigrationCriticalSection(ns, False).to_command())
            except MongoError as exc:  # the completion releases it again
                log.warning("critical section of %s not released on %s: %s", ns, donor, exc)
    return cloned
