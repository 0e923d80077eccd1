"""The shard's half of a chunk migration and of shard versioning (internal commands the config
server and the donor send, the donor also to itself: :mod:`shard.migration_source`; mongod's
``_migrateClone``/``_transferMods`` of ``migration_chunk_cloner_source`` and the critical
section of ``migration_source_manager.cpp``, with shardsim's own names where the shapes are
shardsim's):

======================================  ==========================================================
``_shardsvrMoveRange``                  run a migration as its donor: :mod:`shard.migration_source`
``_shardsimSetFilteringMetadata``       install a namespace's filtering metadata (placement
                                        version, owned chunks) pushed by the config server
``_shardsimMigrationStart``             the donor starts recording the namespace's writes
                                        (transfer mods) under a ``sessionId``
``_migrateClone``                       the documents of the range ``[min, max)``: ``{objects}``
``_transferMods``                       the writes since the last call: ``{reload, deleted}``
``_shardsimMigrationCriticalSection``   ``enter: true`` blocks writes to the namespace and waits
                                        for those running; ``enter: false`` releases them
``_shardsimMigrationEnd``               stop recording (commit or abort)
``_shardsimSessionRecords``             export the retryable-write session records
``_shardsimMergeSessionRecords``        import them on the recipient (a statement executed on
                                        the donor is executed here too)
======================================  ==========================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.core.commands import CommandFamily, Request
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import KeyPattern, compare_keys
from shardsim.core.values import id_key
from shardsim.shard.migration_source import MAJORITY_WAIT_MS
from shardsim.shard.range_deleter import COORDINATORS, CRITICAL_SECTIONS, RANGE_DELETIONS
from shardsim.shard.sharding_runtime import ModsTracker
from shardsim.core.protocol import shard as shrq
from shardsim.core.auth import privileges as priv

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

commands = CommandFamily("migration")

# sessionId -> (ns, tracker, pattern, min key, max key)
_Migration = tuple[str, ModsTracker, KeyPattern, tuple[Any, ...], tuple[Any, ...]]


def _ns(req: Request) -> str:
    ns = req.arg
    if not isinstance(ns, str) or "." not in ns:
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    return ns


def _migrations(node: "ShardNode") -> dict[str, _Migration]:
    return node.sharding.migrations


def _migration(node: "ShardNode", sid: str) -> _Migration:
    mig = _migrations(node).get(sid)
    if mig is None:
        raise MongoError(117, f"migration session {sid} is not active on this shard")  # ConflictingOperationInProgress
    return mig


def _in_range(mig: _Migration, doc: dict[str, Any]) -> bool:
    _, _, pattern, lo, hi = mig
    try:
        key = pattern.key_of_doc(doc)
    except MongoError:
        return False
    return compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0


@commands.handler(shrq.ShardsvrMoveRange.NAME, privileges=priv.INTERNAL)
async def shardsvr_move_range(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.ShardsvrMoveRange` on the donor's primary
    (``shardsvr_move_range_command.cpp``): run the migration
    (:meth:`shard.migration_source.MigrationSource.move_range`). ``{}``; errors: the
    migration's, 10107 on a secondary, 11602 when a stepdown interrupted it, 73, 40414, 14."""
    request = shrq.ShardsvrMoveRange.parse(req.body)
    _ns(req)
    return await node.migration_source.move_range(request)


@commands.handler(shrq.SetFilteringMetadata.NAME, privileges=priv.INTERNAL)
async def set_filtering_metadata(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.SetFilteringMetadata` -> ``{version}`` (this
    shard's new ``{e, t, v}``)."""
    request = shrq.SetFilteringMetadata.parse(req.body)
    ns = _ns(req)
    node.sharding.set_metadata(ns, request.metadata)
    return {"version": node.sharding.wanted(ns)}


@commands.handler(shrq.MigrationStart.NAME, privileges=priv.INTERNAL)
async def migration_start(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.MigrationStart`: with ``migrationId``, persist the
    coordinator document and the donor's pending range-deletion task
    (``MigrationCoordinator::startMigration``); then record the namespace's writes from now
    on (``MigrationChunkClonerSource::startClone``). ``{}``. Errors: 73, 40414, 14."""
    request = shrq.MigrationStart.parse(req.body)
    ns = _ns(req)
    pattern = KeyPattern(dict(request.key))
    if request.migrationId is not None:
        common = {"_id": request.migrationId, "nss": ns, "collectionUuid": request.uuid,
                  "donorShardId": node.shard_name,
                  "range": {"min": request.min, "max": request.max},
                  "keyPattern": pattern.pattern}
        coordinator = {**common, "migrationSessionId": request.sessionId,
                       "recipientShardId": request.to}
        if request.preMigrationChunkVersion is not None:
            coordinator["preMigrationChunkVersion"] = request.preMigrationChunkVersion
        node.range_deleter.save(COORDINATORS, coordinator)
        node.range_deleter.save(RANGE_DELETIONS, {**common, "whenToClean": "now",
                                                  "pending": True})
    tracker = ModsTracker()
    node.sharding.trackers.setdefault(ns, []).append(tracker)
    _migrations(node)[request.sessionId] = (ns, tracker, pattern,
                                            pattern.bound_to_key(request.min),
                                            pattern.bound_to_key(request.max))
    return {}


@commands.handler(shrq.MigrateClone.NAME, privileges=priv.INTERNAL)
async def migrate_clone(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_migrateClone: 1, sessionId}`` -> ``{objects: [...]}``: every document of the
    migrating range, read in one step (mongod sends batches of record ids)."""
    mig = _migration(node, shrq.MigrateClone.parse(req.body).sessionId)
    db, _, name = mig[0].partition(".")
    coll = node.storage.get(db, name)
    docs = [] if coll is None else [d for d in coll.docs.values() if _in_range(mig, d)]
    return {"objects": docs}


@commands.handler(shrq.TransferMods.NAME, privileges=priv.INTERNAL)
async def transfer_mods(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_transferMods: 1, sessionId}`` -> ``{reload: [docs], deleted: [{_id}], size}``: the
    current state of each document of the range written since the last call
    (``MigrationChunkClonerSource::nextModsBatch``)."""
    mig = _migration(node, shrq.TransferMods.parse(req.body).sessionId)
    db, _, name = mig[0].partition(".")
    coll = node.storage.get(db, name)
    reload: list[dict[str, Any]] = []
    deleted: list[dict[str, Any]] = []
    for _id in mig[1].take():
        doc = coll.docs.get(id_key(_id)) if coll is not None else None
        if doc is not None and _in_range(mig, doc):
            reload.append(doc)
        else:
            deleted.append({"_id": _id})
    return {"reload": reload, "deleted": deleted, "size": len(reload) + len(deleted)}


@commands.handler(shrq.MigrationCriticalSection.NAME, privileges=priv.INTERNAL)
async def critical_section(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationCriticalSection: ns, enter: bool, blockReads?: bool}``: enter
    (block writes, wait for the running ones) or leave the namespace's critical section;
    ``blockReads: true`` with ``enter`` also blocks routed reads (entered first if needed:
    ``ShardingRecoveryService::promoteRecoverableCriticalSectionToBlockAlsoReads``). ``{}``."""
    request = shrq.MigrationCriticalSection.parse(req.body)
    ns = _ns(req)
    # A migration's critical section is recoverable, as 8.0's (ShardingRecoveryService::
    # acquireRecoverableCriticalSectionBlockWrites): persisted, logged and majority-committed
    # before the command answers, so the next primary of this shard holds it too
    # (ShardNode.on_became_writable_primary) until the migration's completion releases it;
    # releasing waits for the majority as well, or a new primary could hold it again with no
    # one left to release it. (A resharding's stays in memory: its release is best effort.)
    recoverable = request.reason is None
    if request.enter:
        await node.sharding.enter_critical_section(ns)
        if request.blockReads:
            node.sharding.block_reads(ns)
        if recoverable:
            doc = {"_id": ns, "reason": {"command": "migrateChunk"},
                   "blockReads": bool(request.blockReads)}
            node.range_deleter.save(CRITICAL_SECTIONS, doc)
            await node.wait_for_majority(MAJORITY_WAIT_MS)
    else:
        node.sharding.exit_critical_section(ns)
        if recoverable and node.range_deleter.remove(CRITICAL_SECTIONS, ns):
            await node.wait_for_majority(MAJORITY_WAIT_MS)
    return {}


@commands.handler(shrq.MigrationEnd.NAME, privileges=priv.INTERNAL)
async def migration_end(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationEnd: 1, sessionId}``: stop recording writes. ``{}``."""
    mig = _migrations(node).pop(shrq.MigrationEnd.parse(req.body).sessionId, None)
    if mig is not None:
        trackers = node.sharding.trackers.get(mig[0], [])
        if mig[1] in trackers:
            trackers.remove(mig[1])
        if not trackers:
            node.sharding.trackers.pop(mig[0], None)
    return {}


@commands.handler(shrq.SessionRecords.NAME, privileges=priv.INTERNAL)
async def session_records(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimSessionRecords: 1}`` -> ``{records: [{lsid, txnNumber, stmts}]}``: the
    retryable-write history (what mongod's ``SessionCatalogMigrationSource`` sends from the
    oplog)."""
    return {"records": [s.record() for s in node.sessions._sessions.values()
                        if s.executed and s.txn is None]}


@commands.handler(shrq.MergeSessionRecords.NAME, privileges=priv.INTERNAL)
async def merge_session_records(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMergeSessionRecords: 1, records}``: a record of a newer txnNumber replaces
    this shard's, one of the same txnNumber adds its executed statements
    (``SessionCatalogMigrationDestination``). ``{n}``."""
    n = 0
    for rec in shrq.MergeSessionRecords.parse(req.body).records:
        s = node.sessions.get(rec.get("lsid"))
        if s is None or s.txn is not None:
            continue
        tn = int(rec["txnNumber"])
        if tn > s.txn_number:
            s.txn_number, s.executed = tn, {}
        if tn == s.txn_number:
            for x in rec.get("stmts", []):
                s.executed.setdefault(int(x["i"]), x["r"])
            node.sessions.note(s)
            n += 1
    return {"n": n}


@commands.handler(shrq.RecvChunkStart.NAME, privileges=priv.INTERNAL)
async def recv_chunk_start(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.RecvChunkStart` on the recipient, before the
    clone: run the range deletions overlapping ``[min, max)``, delete what is left there
    (orphans), persist the recipient's pending range-deletion task
    (``MigrationDestinationManager::_migrateDriver``). ``{deleted: n}``. Errors:
    ConflictingOperationInProgress (117) while an overlapping task is pending, 73, 40414 (a
    missing field), 14."""
    request = shrq.RecvChunkStart.parse(req.body)
    ns = _ns(req)
    pattern = KeyPattern(dict(request.key))
    task = {"_id": request.migrationId, "nss": ns, "collectionUuid": request.uuid,
            "donorShardId": request.from_, "range": {"min": request.min, "max": request.max},
            "keyPattern": pattern.pattern, "whenToClean": "now", "pending": True}
    return {"deleted": await node.range_deleter.clear_incoming(task)}


@commands.handler(shrq.MigrationDecision.NAME, privileges=priv.INTERNAL)
async def migration_decision(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.MigrationDecision`: persist the decision in the
    coordinator document (``MigrationCoordinator::setMigrationDecision``). ``{found: bool}``;
    BadValue (2) for another decision."""
    request = shrq.MigrationDecision.parse(req.body)
    if request.decision not in ("committed", "aborted"):
        raise MongoError(2, f"unknown migration decision {request.decision!r}")
    doc = node.range_deleter.find(COORDINATORS, request.migrationId)
    if doc is not None and doc.get("decision") != request.decision:
        node.range_deleter.save(COORDINATORS, {**doc, "decision": request.decision})
    return {"found": doc is not None}


@commands.handler(shrq.RangeDeletionTask.NAME, privileges=priv.INTERNAL)
async def range_deletion_task(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.RangeDeletionTask`: ``run`` makes the task ready
    and deletes its range (``markAsReadyRangeDeletionTaskLocally`` and the range deleter),
    ``forget`` deletes the task (``deleteRangeDeletionTaskLocally``). ``{deleted: n}`` (the
    documents deleted). BadValue (2) for another action."""
    request = shrq.RangeDeletionTask.parse(req.body)
    if request.action == "run":
        return {"deleted": await node.range_deleter.run_task(request.migrationId)}
    if request.action == "forget":
        node.range_deleter.remove(RANGE_DELETIONS, request.migrationId)
        return {"deleted": 0}
    raise MongoError(2, f"unknown range deletion action {request.action!r}")


@commands.handler(shrq.ForgetMigration.NAME, privileges=priv.INTERNAL)
async def forget_migration(node: "ShardNode", req: Request) -> dict[str, Any]:
    """:class:`shardsim.core.protocol.shard.ForgetMigration`: delete the donor's coordinator
    document (``MigrationCoordinator::forgetMigration``). ``{}``."""
    node.range_deleter.remove(COORDINATORS, shrq.ForgetMigration.parse(req.body).migrationId)
    return {}
