"""Resharding, as the config server coordinates it: ``reshardCollection``, and
``moveCollection``/``unshardCollection`` which 8.0 implements as resharding to one shard
(``src/mongo/db/s/resharding/resharding_coordinator_service.cpp``,
``resharding_donor_service.cpp``, ``resharding_recipient_service.cpp``,
``reshard_collection_coordinator.cpp``).

The phases, as 8.0 has them:

1. **initializing** (:func:`prepare`): a new UUID, the new key and its chunks (split points
   from the data of the new key: one chunk per shard at the quantiles, even hash ranges for a
   hashed key; one chunk on ``toShard`` for a move/unshard); each recipient gets the temporary
   collection ``<db>.system.resharding.<old uuid>`` with the new UUID (``fromMigrate``).
2. **cloning** (:func:`clone`): every donor's documents are read and inserted on the
   recipient owning their new key, as ``fromMigrate`` writes. Each donor's oplog position is
   noted first.
3. **applying** (:func:`catch_up`): the donors' oplog entries for the collection since the
   noted position (also inside ``applyOps``) name the documents written meanwhile; each is
   read again on the donors and its current state written to its new owner (or deleted), all
   ``fromMigrate``. Repeated until little is left.
4. **blocking-writes / committing** (:func:`commit`, inside every donor's critical section
   for the namespace: routed writes through any router wait, then get StaleConfig and are
   retried by the new routing table): a last catch-up, the donors' retryable-write history
   copied to the recipients, then the catalog switch (new UUID, key, chunks; the collection's epoch and
   timestamp change), the critical section promoted to block reads on every donor and recipient
   (routed reads and post-image look-ups wait for the new routing table), the temporary collections renamed over the original on the recipients
   and the original dropped on donors that own nothing now (all ``fromMigrate``), and the
   ``reshardCollection`` no-op on the primary shard
   (``notifyChangeStreamsOnReshardCollectionComplete``: ``o2: {reshardCollection: ns,
   reshardUUID, shardKey, oldShardKey, unique, numInitialChunks, provenance}``, ``ui`` the old
   UUID), which ``showExpandedEvents`` streams show as a ``reshardCollection`` event. Plain
   streams see none of it: the data movement is invisible, and the stream goes on (with the
   new UUID).

Not modelled: the critical section blocks routed (versioned) writes only, not unversioned
writes sent to a donor directly nor writes inside a transaction; the donors' documents are
cloned through the config server's memory; every donor's whole retryable-write history is
copied to every recipient.
"""

from __future__ import annotations

import logging
import uuid as uuid_mod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bson import Binary, ObjectId
from bson.timestamp import Timestamp

from shardsim.configsvr import catalog
from shardsim.configsvr import migration, placement_history
from shardsim.configsvr.catalog import chunk_doc
from shardsim.core.errors import MongoError
from shardsim.core.shard_key import Chunk, ChunkMap, KeyPattern, SortKey, hashed_split_points
from shardsim.core.protocol import shard as shrq

if TYPE_CHECKING:
    from shardsim.configsvr.node import ConfigServerNode

log = logging.getLogger("shardsim.resharding")
_BATCH = 1000


@dataclass
class ReshardOp:
    """One resharding in progress: the source ``ns`` (``db``, ``coll``), its catalog entry
    (None when untracked), old UUID and key, the new pattern, UUID and chunks, the donors and
    recipients, each donor's oplog position (``marks``), ``provenance``
    (``reshardCollection`` / ``moveCollection`` / ``unshardCollection``) and the target of a
    move (``to_shard``)."""

    ns: str
    db: str
    coll: str
    entry: dict[str, Any] | None
    old_uuid: Binary
    old_key: dict[str, Any]
    pattern: KeyPattern
    new_uuid: Binary
    chunks: list[Chunk]
    donors: list[str]
    primary: str
    provenance: str
    unique: bool = False
    to_shard: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    indexes: list[dict[str, Any]] = field(default_factory=list)
    marks: dict[str, Timestamp] = field(default_factory=dict)

    @property
    def temp(self) -> str:
        """The temporary collection's name (``system.resharding.<old uuid>``)."""
        return f"system.resharding.{uuid_mod.UUID(bytes=bytes(self.old_uuid))}"

    @property
    def recipients(self) -> list[str]:
        return sorted({c.shard for c in self.chunks})

    def owner(self, doc: dict[str, Any]) -> str:
        """The recipient of ``doc`` under the new key."""
        cmap = self.__dict__.get("_cmap")
        if cmap is None:
            cmap = self.__dict__["_cmap"] = ChunkMap(self.pattern, self.chunks)
        return cmap.shard_for_doc(doc)


def _split_chunks(pattern: KeyPattern, docs: list[dict[str, Any]], shards: list[str]
                  ) -> list[Chunk]:
    """One chunk per shard: for a hashed first field, even hash ranges; otherwise split at the
    quantiles of the documents' new keys (fewer chunks when there are fewer distinct keys)."""
    gmin, gmax = tuple(pattern.global_min().values()), tuple(pattern.global_max().values())
    if pattern.fields[0] in pattern.hashed:
        bounds = [gmin] + [(p,) + gmin[1:] for p in hashed_split_points(len(shards))] + [gmax]
    else:
        keys = sorted((pattern.key_of_doc(d) for d in docs), key=SortKey)
        bounds = [gmin]
        for i in range(1, len(shards)):
            if not keys:
                break
            k = keys[len(keys) * i // len(shards)]
            if SortKey(k) > SortKey(bounds[-1]):
                bounds.append(k)
        bounds.append(gmax)
    return [Chunk(bounds[i], bounds[i + 1], shards[i % len(shards)])
            for i in range(len(bounds) - 1)]


async def _latest_ts(node: ConfigServerNode, shard: str) -> Timestamp:
    reply = await node.on_shard(shard, "local", {"find": "oplog.rs", "filter": {},
                                                 "sort": {"$natural": -1}, "limit": 1})
    batch = reply["cursor"]["firstBatch"]
    return batch[0]["ts"] if batch else Timestamp(0, 0)


async def donor_docs(node: ConfigServerNode, op: ReshardOp) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for donor in op.donors:
        docs.extend(await node.shard_find_all(donor, op.db, op.coll))
    return docs


async def mark(node: ConfigServerNode, op: ReshardOp) -> None:
    """Note each donor's newest oplog entry: the catch-up starts after it (taken before the
    documents are read, so no write falls between the clone and the catch-up)."""
    for donor in op.donors:
        op.marks[donor] = await _latest_ts(node, donor)


async def prepare(node: ConfigServerNode, op: ReshardOp, shards: list[str],
                  docs: list[dict[str, Any]]) -> None:
    """Initializing: chunks (unless set) and the temporary collections."""
    if not op.chunks:
        op.chunks = _split_chunks(op.pattern, docs, shards)
    for shard in op.recipients:
        # no leftover of an earlier attempt (resharding_data_copy_util's ensureCollectionDropped)
        try:
            await node.on_shard(shard, op.db, {"drop": op.temp, "fromMigrate": True})
        except MongoError as exc:
            if exc.code != 26:
                raise
        await node.on_shard(shard, op.db, shrq.EnsureCollection(
            op.temp, uuid=op.new_uuid, shardKey=op.pattern.pattern, options=op.options,
            primary=False).to_command())
        specs = [i for i in op.indexes if i.get("name") != "_id_"]
        if op.pattern.pattern != {"_id": 1}:
            name = "_".join(f"{f}_{v}" for f, v in op.pattern.pattern.items())
            if not any(i.get("key") == op.pattern.pattern for i in specs):
                specs.append({"key": op.pattern.pattern, "name": name})
        if specs:
            await node.on_shard(shard, op.db, {"createIndexes": op.temp, "indexes": specs,
                                               "fromMigrate": True})


async def clone(node: ConfigServerNode, op: ReshardOp, docs: list[dict[str, Any]]) -> int:
    """Cloning: insert ``docs`` on their new owners (``fromMigrate``); returns the count."""
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_owner.setdefault(op.owner(d), []).append(d)
    for shard, group in by_owner.items():
        for i in range(0, len(group), _BATCH):
            await node.on_shard(shard, op.db, {"insert": op.temp, "documents": group[i:i + _BATCH],
                                               "ordered": False, "fromMigrate": True})
    return len(docs)


def _touched_ids(entries: list[dict[str, Any]], ns: str, ui: Binary) -> list[Any]:
    """The ``_id`` of every document the oplog ``entries`` wrote in ``ns`` (also in applyOps)."""
    out: list[Any] = []
    for e in entries:
        ops = e.get("o", {}).get("applyOps") if e.get("op") == "c" else [e]
        for o in ops or []:
            if o.get("ns") != ns and o.get("ui") != ui:
                continue
            if o.get("op") in ("i", "d"):
                out.append(o["o"].get("_id"))
            elif o.get("op") == "u":
                out.append((o.get("o2") or {}).get("_id"))
    return out


async def catch_up(node: ConfigServerNode, op: ReshardOp) -> int:
    """Applying: bring the documents the donors wrote since ``op.marks`` to their current
    state on the recipients; moves the marks. Returns how many documents were touched."""
    ids: list[Any] = []
    for donor in op.donors:
        reply = await node.on_shard(donor, "local", {
            "find": "oplog.rs", "filter": {"ts": {"$gt": op.marks[donor]}},
            "batchSize": 1 << 30})
        entries = reply["cursor"]["firstBatch"]
        if entries:
            op.marks[donor] = entries[-1]["ts"]
        ids.extend(_touched_ids(entries, op.ns, op.old_uuid))
    seen: set[str] = set()
    unique_ids = []
    for i in ids:
        k = repr(i)
        if k not in seen:
            seen.add(k)
            unique_ids.append(i)
    for i in range(0, len(unique_ids), _BATCH):
        part = unique_ids[i:i + _BATCH]
        current: dict[str, dict[str, Any]] = {}
        for donor in op.donors:
            reply = await node.on_shard(donor, op.db, {"find": op.coll, "filter": {
                "_id": {"$in": part}}, "batchSize": 1 << 30})
            for d in reply["cursor"]["firstBatch"]:
                current[repr(d["_id"])] = d
        for shard in op.recipients:  # drop every touched document, then write the live ones
            await node.on_shard(shard, op.db, {"delete": op.temp, "fromMigrate": True,
                                               "deletes": [{"q": {"_id": {"$in": part}},
                                                            "limit": 0}]})
        await clone(node, op, list(current.values()))
    return len(unique_ids)


async def _critical_section(node: ConfigServerNode, op: ReshardOp, enter: bool,
                            block_reads: bool = False) -> None:
    """Enter (block the routed writes to ``op.ns`` on every donor and wait for the running
    ones) or leave the participants' critical section: 8.0's blocking-writes state, in which
    each donor holds the collection's critical section (``ReshardingDonorService``'s
    ``_writeTransactionOplogEntryThenTransitionToBlockingWrites``) until the coordinator has
    committed; the writes that waited then fail with StaleConfig (13388) and their routers
    retry them by the new routing table. ``block_reads``: the promotion before the renames and
    drops, on every donor and recipient (a recipient that is no donor enters it then), so that
    routed reads and post-image look-ups wait for the new routing table
    (``DonorStateMachine::_dropOriginalCollectionThenTransitionToDone``,
    ``RecipientStateMachine::_renameTemporaryReshardingCollection``:
    ``promoteRecoverableCriticalSectionToBlockAlsoReads``). The recipients that are no
    donors hold it from the start too: a shard that gets a routed request with the new
    version refreshes its metadata, and the refresh waits for the critical section (as
    mongod's ``onCollectionPlacementVersionMismatch`` joins it), so no request reaches a
    recipient's collection before the temporary collection is renamed over it. Leaving
    releases it on every participant, best effort for each."""
    shards = op.donors + [s for s in op.recipients if s not in op.donors]
    for shard in shards:
        cmd = shrq.MigrationCriticalSection(op.ns, enter, reason="reshardCollection",
                                            blockReads=True if enter and block_reads else None
                                            ).to_command()
        if enter:
            await node.on_shard(shard, "admin", cmd)
            continue
        try:
            await node.on_shard(shard, "admin", cmd)
        except MongoError as exc:
            log.warning("critical section of %s not released on %s: %s", op.ns, shard, exc)


async def release(node: ConfigServerNode, op: ReshardOp) -> None:
    """Leave the critical section on every participant (best effort for each)."""
    await _critical_section(node, op, False)


async def _move_session_records(node: ConfigServerNode, op: ReshardOp) -> None:
    """The donors' retryable-write history to the recipients, so a statement executed on a
    donor is not applied again on its new owner (8.0's ``ReshardingTxnCloner`` and the
    session application of the recipients' oplog appliers)."""
    for donor in op.donors:
        records = (await node.on_shard(donor, "admin", shrq.SessionRecords(1).to_command()))[
            "records"]
        if not records:
            continue
        for shard in op.recipients:
            if shard != donor:
                await node.on_shard(shard, "admin",
                                    shrq.MergeSessionRecords(1, records).to_command())


async def commit(node: ConfigServerNode, op: ReshardOp) -> None:
    """Blocking-writes and committing, inside the donors' critical section
    (:func:`_critical_section`): the last catch-up, the retryable-write history, the catalog
    switch, the rename of the temporary collections, every shard's new metadata, the drop of
    the original on former owners, the event; then the critical section is released."""
    await _critical_section(node, op, True)
    try:
        await _commit_in_critical_section(node, op)
    finally:
        await _critical_section(node, op, False)


async def _commit_in_critical_section(node: ConfigServerNode, op: ReshardOp) -> None:
    await catch_up(node, op)
    await _move_session_records(node, op)
    await save_state(node, op, "committing")  # the decision: from here on, rolled forward
    await finish_commit(node, op)


def _untracks(op: ReshardOp) -> bool:
    """True when the operation leaves the collection untracked (moved/unsharded onto the
    database's primary shard)."""
    return op.provenance != "reshardCollection" and op.to_shard == op.primary


async def _switch_catalog(node: ConfigServerNode, op: ReshardOp) -> None:
    """The catalog switch (new uuid, key and chunks; or the entry removed for an untracked
    result). Done once: skipped when ``config.collections`` already has the new uuid (a
    commit resumed after a restart); chunks of the new uuid left by an interrupted switch are
    replaced."""
    ns = op.ns
    untrack = _untracks(op)
    found = await node.find_all("collections", {"_id": ns})
    done = (found and found[0].get("uuid") == op.new_uuid) or (untrack and not found)
    if not done:
        await _write_catalog(node, op, untrack)
    if op.entry is not None:
        await node.delete("chunks", {"uuid": op.old_uuid})


async def _write_catalog(node: ConfigServerNode, op: ReshardOp, untrack: bool) -> None:
    """The catalog writes of the switch: the new chunks, then the entry in one write (or the
    entry removed when ``untrack``)."""
    ns = op.ns
    now = node.clock.now()
    # A router reads config.collections and config.chunks one after the other: the new chunks
    # go in first and the entry is swapped in one write, so every read pairs an entry with its
    # own complete chunks (old entry + old chunks, or new + new); the old chunks go last.
    if untrack:
        await node.delete("collections", {"_id": ns})
    else:
        doc = dict(op.entry or {"_id": ns, "noBalance": False})
        doc.update({"lastmodEpoch": ObjectId(), "timestamp": now, "uuid": op.new_uuid,
                    "key": op.pattern.pattern, "unique": op.unique,
                    "lastmod": catalog.date_now()})
        doc.pop("unsplittable", None)
        if op.provenance != "reshardCollection":
            doc["unsplittable"] = True
        await node.delete("chunks", {"uuid": op.new_uuid})
        await node.insert("chunks", [chunk_doc(op.new_uuid, op.pattern, c, Timestamp(1, i), now)
                                     for i, c in enumerate(op.chunks)])
        if op.entry is not None:
            await node.update("collections", {"_id": ns}, doc)
        else:
            await node.insert("collections", [doc])


async def finish_commit(node: ConfigServerNode, op: ReshardOp) -> None:
    """Committing, from the persisted decision on: the catalog switch, the renames, every
    shard's new metadata, the drops on former owners, the event. Each step can be repeated
    (a commit resumed by :mod:`configsvr.resharding_recovery` after a restart)."""
    ns = op.ns
    untrack = _untracks(op)
    await _switch_catalog(node, op)
    committed = await placement_history.record(node, ns, [] if untrack else set(op.recipients))
    await placement_history.notify(node, ns, set(op.donors) | set(op.recipients) | {op.primary},
                                   committed, ui=op.old_uuid)
    await node.migration_recovery.pause("reshardingPauseCoordinatorBeforeCompletion")
    await _critical_section(node, op, True, block_reads=True)
    for shard in op.recipients:
        try:
            await node.on_shard(shard, "admin", {"renameCollection": f"{op.db}.{op.temp}",
                                                 "to": ns, "dropTarget": True,
                                                 "fromMigrate": True})
        except MongoError as exc:
            if exc.code != 26:  # renamed already (a resumed commit)
                raise
    if not untrack:  # a new uuid, epoch and chunks: every shard learns them
        await migration.push_metadata(node, ns)
    else:  # unsharded (untracked) now: no shard keeps the old version
        for shard in [s["_id"] for s in await node.shards()]:
            try:
                await node.on_shard(shard, op.db, shrq.SetFilteringMetadata(ns).to_command())
            except MongoError as exc:
                log.warning("metadata of %s not cleared on %s: %s", ns, shard, exc)
    for shard in op.donors:
        if shard not in op.recipients:
            try:
                await node.on_shard(shard, op.db, {"drop": op.coll, "fromMigrate": True})
            except MongoError as exc:
                if exc.code != 26:
                    raise
    o2: dict[str, Any] = {"reshardCollection": ns, "reshardUUID": op.new_uuid,
                          "shardKey": op.pattern.pattern, "oldShardKey": op.old_key,
                          "unique": op.unique, "numInitialChunks": len(op.chunks),
                          "provenance": op.provenance}
    await node.on_shard(op.primary, op.db, shrq.Noop(
        {"msg": f"Reshard collection {ns} with shard key {op.pattern.pattern}"},
        o2=o2, ns=ns, ui=op.old_uuid).to_command())
    log.info("%s %s: new key %s, %d chunks on %s", op.provenance, ns, op.pattern.pattern,
             len(op.chunks), op.recipients)
    await forget_state(node, op)


async def abort(node: ConfigServerNode, op: ReshardOp) -> None:
    """Drop the temporary collections (after a failure) and forget the persisted state."""
    for shard in op.recipients:
        try:
            await node.on_shard(shard, op.db, {"drop": op.temp, "fromMigrate": True})
        except MongoError:
            pass
    await forget_state(node, op)


# -- the coordinator document (config.reshardingOperations on the config server) -------------
STATE_COLL = "reshardingOperations"


def to_doc(op: ReshardOp) -> dict[str, Any]:
    """``op`` as its coordinator document ``{_id: reshardingUUID, ns, state, op: {...}}``
    (``ReshardingCoordinatorDocument``; shardsim keeps what a resumed commit needs)."""
    fields = {k: v for k, v in op.__dict__.items() if not k.startswith("_")}
    fields["pattern"] = op.pattern.pattern
    fields["chunks"] = [{"min": list(c.min), "max": list(c.max), "shard": c.shard}
                        for c in op.chunks]
    return {"_id": op.new_uuid, "ns": op.ns, "op": fields}


def from_doc(doc: dict[str, Any]) -> ReshardOp:
    """The :class:`ReshardOp` of a coordinator document (:func:`to_doc`)."""
    fields = dict(doc["op"])
    fields["pattern"] = KeyPattern(dict(fields["pattern"]))
    fields["chunks"] = [Chunk(tuple(c["min"]), tuple(c["max"]), c["shard"])
                        for c in fields["chunks"]]
    fields["marks"] = dict(fields.get("marks") or {})
    return ReshardOp(**fields)


async def save_state(node: ConfigServerNode, op: ReshardOp, state: str) -> None:
    """Persist ``op`` in ``state`` (``cloning`` before the temporary collections exist,
    ``committing`` once the decision is taken: ``ReshardingCoordinator``'s state document)."""
    doc = {**to_doc(op), "state": state}
    if await node.find_all(STATE_COLL, {"_id": op.new_uuid}):
        await node.update(STATE_COLL, {"_id": op.new_uuid}, doc)
    else:
        await node.insert(STATE_COLL, [doc])


async def forget_state(node: ConfigServerNode, op: ReshardOp) -> None:
    """Delete ``op``'s coordinator document (done or aborted)."""
    await node.delete(STATE_COLL, {"_id": op.new_uuid})


def new_uuid() -> Binary:
    """A fresh collection UUID (Binary subtype 4)."""
    return Binary(uuid_mod.uuid4().bytes, 4)


__all__ = ["ReshardOp", "abort", "catch_up", "clone", "commit", "donor_docs", "finish_commit",
           "forget_state", "from_doc", "mark", "new_uuid", "prepare", "release", "save_state",
           "to_doc"]
