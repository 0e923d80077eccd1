"""The shard's half of a chunk migration and of shard versioning (internal commands the config
server sends; mongod's ``_migrateClone``/``_transferMods`` of ``migration_chunk_cloner_source``
and the critical section of ``migration_source_manager.cpp``, with shardsim's own names where
the shapes are shardsim's):

======================================  ==========================================================
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

from shardsim.commands import CommandFamily, Request
from shardsim.errors import MongoError
from shardsim.shard_key import KeyPattern, compare_keys
from shardsim.values import id_key
from shard.range_deleter import COORDINATORS, RANGE_DELETIONS
from shard.sharding_runtime import ModsTracker

if TYPE_CHECKING:  # pragma: no cover
    from shard.node import ShardNode

commands = CommandFamily("migration")

# sessionId -> (ns, tracker, pattern, min key, max key)
_Migration = tuple[str, ModsTracker, KeyPattern, tuple[Any, ...], tuple[Any, ...]]


def _ns(req: Request) -> str:
    ns = req.arg
    if not isinstance(ns, str) or "." not in ns:
        raise MongoError(73, f"Invalid namespace specified '{ns}'")
    return ns


def _migrations(node: "ShardNode") -> dict[str, _Migration]:
    migs = getattr(node, "_migrations", None)
    if migs is None:
        migs = node._migrations = {}  # type: ignore[attr-defined]
    return migs


def _migration(node: "ShardNode", req: Request) -> _Migration:
    sid = req.body.get("sessionId")
    mig = _migrations(node).get(sid) if isinstance(sid, str) else None
    if mig is None:
        raise MongoError(117, f"migration session {sid} is not active on this shard")  # ConflictingOperationInProgress
    return mig


def _range_args(req: Request) -> KeyPattern:
    """The shard-key pattern of a request with ``key``, ``min`` and ``max`` (objects):
    40414 for a missing field, TypeMismatch (14) for another type."""
    for f in ("key", "min", "max"):
        v = req.body.get(f)
        if v is None:
            raise MongoError(40414, f"BSON field '{req.name}.{f}' is missing but a required "
                                    f"field")
        if not isinstance(v, dict):
            raise MongoError(14, f"BSON field '{req.name}.{f}' is the wrong type, expected "
                                 f"type 'object'")
    return KeyPattern(dict(req.body["key"]))


def _in_range(mig: _Migration, doc: dict[str, Any]) -> bool:
    _, _, pattern, lo, hi = mig
    try:
        key = pattern.key_of_doc(doc)
    except MongoError:
        return False
    return compare_keys(lo, key) <= 0 and compare_keys(key, hi) < 0


@commands.handler("_shardsimSetFilteringMetadata")
async def set_filtering_metadata(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimSetFilteringMetadata: ns, metadata: null | {epoch, timestamp, key, chunks:
    [{min, max, lastmod}]}}`` -> ``{version}`` (this shard's new ``{e, t, v}``)."""
    ns = _ns(req)
    meta = req.body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise MongoError(14, "BSON field 'metadata' is the wrong type, expected type 'object'")
    node.sharding.set_metadata(ns, meta)
    return {"version": node.sharding.wanted(ns)}


@commands.handler("_shardsimMigrationStart")
async def migration_start(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationStart: ns, sessionId, key, min, max, migrationId?, uuid?, to?}``:
    with ``migrationId``, persist the coordinator document and the donor's pending
    range-deletion task (``MigrationCoordinator::startMigration``); then record the
    namespace's writes from now on (``MigrationChunkClonerSource::startClone``). ``{}``."""
    ns = _ns(req)
    sid = req.body.get("sessionId")
    if not isinstance(sid, str):
        raise MongoError(14, "BSON field 'sessionId' is the wrong type, expected type 'string'")
    pattern = _range_args(req)
    mid = req.body.get("migrationId")
    if mid is not None:
        common = {"_id": mid, "nss": ns, "collectionUuid": req.body.get("uuid"),
                  "donorShardId": node.shard_name,
                  "range": {"min": req.body["min"], "max": req.body["max"]},
                  "keyPattern": pattern.pattern}
        node.range_deleter.save(COORDINATORS, {**common, "migrationSessionId": sid,
                                               "recipientShardId": req.body.get("to")})
        node.range_deleter.save(RANGE_DELETIONS, {**common, "whenToClean": "now",
                                                  "pending": True})
    tracker = ModsTracker()
    node.sharding.trackers.setdefault(ns, []).append(tracker)
    _migrations(node)[sid] = (ns, tracker, pattern, pattern.bound_to_key(req.body["min"]),
                              pattern.bound_to_key(req.body["max"]))
    return {}


@commands.handler("_migrateClone")
async def migrate_clone(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_migrateClone: 1, sessionId}`` -> ``{objects: [...]}``: every document of the
    migrating range, read in one step (mongod sends batches of record ids)."""
    mig = _migration(node, req)
    db, _, name = mig[0].partition(".")
    coll = node.storage.get(db, name)
    docs = [] if coll is None else [d for d in coll.docs.values() if _in_range(mig, d)]
    return {"objects": docs}


@commands.handler("_transferMods")
async def transfer_mods(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_transferMods: 1, sessionId}`` -> ``{reload: [docs], deleted: [{_id}], size}``: the
    current state of each document of the range written since the last call
    (``MigrationChunkClonerSource::nextModsBatch``)."""
    mig = _migration(node, req)
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


@commands.handler("_shardsimMigrationCriticalSection")
async def critical_section(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationCriticalSection: ns, enter: bool, blockReads?: bool}``: enter
    (block writes, wait for the running ones) or leave the namespace's critical section;
    ``blockReads: true`` with ``enter`` also blocks routed reads (entered first if needed:
    ``ShardingRecoveryService::promoteRecoverableCriticalSectionToBlockAlsoReads``). ``{}``."""
    ns = _ns(req)
    if req.body.get("enter") is True:
        await node.sharding.enter_critical_section(ns)
        if req.body.get("blockReads") is True:
            node.sharding.block_reads(ns)
    else:
        node.sharding.exit_critical_section(ns)
    return {}


@commands.handler("_shardsimMigrationEnd")
async def migration_end(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationEnd: 1, sessionId}``: stop recording writes. ``{}``."""
    sid = req.body.get("sessionId")
    mig = _migrations(node).pop(sid, None) if isinstance(sid, str) else None
    if mig is not None:
        trackers = node.sharding.trackers.get(mig[0], [])
        if mig[1] in trackers:
            trackers.remove(mig[1])
        if not trackers:
            node.sharding.trackers.pop(mig[0], None)
    return {}


@commands.handler("_shardsimSessionRecords")
async def session_records(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimSessionRecords: 1}`` -> ``{records: [{lsid, txnNumber, stmts}]}``: the
    retryable-write history (what mongod's ``SessionCatalogMigrationSource`` sends from the
    oplog)."""
    return {"records": [s.record() for s in node.sessions._sessions.values()
                        if s.executed and s.txn is None]}


@commands.handler("_shardsimMergeSessionRecords")
async def merge_session_records(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMergeSessionRecords: 1, records}``: a record of a newer txnNumber replaces
    this shard's, one of the same txnNumber adds its executed statements
    (``SessionCatalogMigrationDestination``). ``{n}``."""
    n = 0
    for rec in req.body.get("records") or []:
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


@commands.handler("_shardsimRecvChunkStart")
async def recv_chunk_start(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimRecvChunkStart: ns, migrationId, uuid, from, key, min, max}`` on the
    recipient, before the clone: run the range deletions overlapping ``[min, max)``, delete
    what is left there (orphans), persist the recipient's pending range-deletion task
    (``MigrationDestinationManager::_migrateDriver``). ``{deleted: n}``. Errors:
    ConflictingOperationInProgress (117) while an overlapping task is pending, 73, 40414 (a
    missing field), 14."""
    ns = _ns(req)
    pattern = _range_args(req)
    if req.body.get("migrationId") is None:
        raise MongoError(40414, "BSON field '_shardsimRecvChunkStart.migrationId' is missing "
                                "but a required field")
    task = {"_id": req.body.get("migrationId"), "nss": ns,
            "collectionUuid": req.body.get("uuid"), "donorShardId": req.body.get("from"),
            "range": {"min": req.body["min"], "max": req.body["max"]},
            "keyPattern": pattern.pattern, "whenToClean": "now", "pending": True}
    return {"deleted": await node.range_deleter.clear_incoming(task)}


@commands.handler("_shardsimMigrationDecision")
async def migration_decision(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimMigrationDecision: migrationId, decision: "committed" | "aborted"}``:
    persist the decision in the coordinator document (``MigrationCoordinator::
    setMigrationDecision``). ``{found: bool}``; BadValue (2) for another decision."""
    decision = req.body.get("decision")
    if decision not in ("committed", "aborted"):
        raise MongoError(2, f"unknown migration decision {decision!r}")
    doc = node.range_deleter.find(COORDINATORS, req.arg)
    if doc is not None and doc.get("decision") != decision:
        node.range_deleter.save(COORDINATORS, {**doc, "decision": decision})
    return {"found": doc is not None}


@commands.handler("_shardsimRangeDeletionTask")
async def range_deletion_task(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimRangeDeletionTask: migrationId, action: "run" | "forget"}``: make the task
    ready and delete its range (``markAsReadyRangeDeletionTaskLocally`` and the range
    deleter), or delete the task (``deleteRangeDeletionTaskLocally``). ``{deleted: n}`` (the
    documents deleted). BadValue (2) for another action."""
    action = req.body.get("action")
    if action == "run":
        return {"deleted": await node.range_deleter.run_task(req.arg)}
    if action == "forget":
        node.range_deleter.remove(RANGE_DELETIONS, req.arg)
        return {"deleted": 0}
    raise MongoError(2, f"unknown range deletion action {action!r}")


@commands.handler("_shardsimForgetMigration")
async def forget_migration(node: "ShardNode", req: Request) -> dict[str, Any]:
    """``{_shardsimForgetMigration: migrationId}``: delete the donor's coordinator document
    (``MigrationCoordinator::forgetMigration``). ``{}``."""
    node.range_deleter.remove(COORDINATORS, req.arg)
    return {}
