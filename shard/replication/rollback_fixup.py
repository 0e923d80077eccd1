"""The rollback's ``FixUpInfo`` and ``syncFixUp`` (``rs_rollback.cpp``): what the entries to
undo touched, and putting it back to the sync source's version. Used by
:func:`shard.replication.rollback.undo_entries` (whose docstring describes the keys and the
order of the steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import uuid as uuid_mod

import bson
from bson.timestamp import Timestamp

from shardsim.core.errors import MongoError
from shardsim.core.node import CODEC
from shardsim.shard.replication.documents import (IDEMPOTENT, add_index_relaxed, document_key_of,
                                                  settle_unique_indexes, write_document)
from shardsim.shard.sessions import session_key
from shardsim.shard.storage import Collection

if TYPE_CHECKING:  # pragma: no cover
    from shardsim.shard.node import ShardNode

SESSIONS = b"config.transactions"
CATALOG = b"$catalog"
DOCUMENTS = b"$documents"
MIN_VALID = b"$minValid"


def uuid_string(uuid: bytes) -> str:
    """A collection UUID as the server prints it (and names its rollback folder)."""
    return str(uuid_mod.UUID(bytes=bytes(uuid)))


class FixUpInfo:
    """What the undone entries touched (``rs_rollback.h`` ``FixUpInfo``): ``docs`` (refetch
    key -> (collection UUID, ``_id``)), ``created`` / ``dropped`` / ``metadata`` (collection
    UUIDs: created after the common point, dropped after it, with index or option changes),
    ``renames`` (``(uuid, db, name)`` to rename back to, newest first) and ``sessions``
    (session key -> lsid: every session the member knows)."""

    def __init__(self) -> None:
        self.docs: dict[tuple[bytes, bytes], tuple[bytes, Any]] = {}
        self.created: set[bytes] = set()
        self.dropped: dict[bytes, tuple[str, str]] = {}  # uuid -> (db, name) at the common point
        self.metadata: set[bytes] = set()
        self.renames: list[tuple[bytes, str, str]] = []
        self.sessions: dict[bytes, Any] = {}

    @classmethod
    def from_entries(cls, node: "ShardNode", undo: list[dict[str, Any]]) -> "FixUpInfo":
        """The info of ``undo`` (newest first), as ``updateFixUpInfoFromLocalOplogEntry``
        builds it entry by entry (``applyOps`` operations included)."""
        info = cls()
        # every session, not only those of the undone entries: statements that logged nothing
        # (an aborted transaction, a delete matching nothing) moved sessions too; the server
        # reloads all session state from config.transactions after a rollback
        for sk, s in node.sessions._sessions.items():
            info.sessions[sk] = s.lsid
            if s.txn is not None and s.txn.state == "prepared":  # the source may have decided
                for op in s.txn.ops:                         # it: its documents are refetched
                    info._add(op)
        for entry in undo:
            lsid = entry.get("lsid")
            if isinstance(lsid, dict) and entry.get("txnNumber") is not None:
                sk = session_key(lsid)
                if sk is not None:
                    info.sessions[sk] = lsid
            info._add(entry)
            if entry.get("op") == "c" and \
                    next(iter(entry.get("o") or {}), None) in ("commitTransaction",
                                                               "abortTransaction"):
                info._add_prepared_ops(node, entry)
        return info

    def _add_prepared_ops(self, node: "ShardNode", entry: dict[str, Any]) -> None:
        """A decision undone: the documents of the prepare entry it names (``prevOpTime``, kept
        in the local oplog when it is older than the common point) are refetched too."""
        prev = entry.get("prevOpTime")
        ts = prev.get("ts") if isinstance(prev, dict) else None
        if ts is None:
            return
        prepare = node.oplog.get((ts.time << 32) | ts.inc)
        if prepare is not None:
            self._add(prepare)

    def _add(self, op: dict[str, Any]) -> None:
        kind = op.get("op")
        ui = op.get("ui")
        if kind in ("i", "u", "d") and ui is not None:
            doc = op.get("o2") if kind == "u" else op.get("o")
            _id = (doc or {}).get("_id")
            key = (bytes(ui), bson.encode({"_id": _id}, codec_options=CODEC))
            self.docs[key] = (bytes(ui), _id)
            return
        if kind != "c":
            return
        o = op.get("o") or {}
        name = next(iter(o), None)
        if name == "applyOps":
            for sub in o.get("applyOps") or []:
                self._add(sub)
        elif name == "create" and ui is not None:
            self.created.add(bytes(ui))
        elif name == "drop" and ui is not None:
            self.dropped[bytes(ui)] = (str(op.get("ns") or "").partition(".")[0], o["drop"])
        elif name == "renameCollection" and ui is not None:
            sdb, _, sname = str(o["renameCollection"]).partition(".")
            self.renames.append((bytes(ui), sdb, sname))
            if bytes(ui) in self.dropped:  # renamed, then dropped: it comes back as it was
                self.dropped[bytes(ui)] = (sdb, sname)
            target = o.get("dropTarget")
            if target is not None and not isinstance(target, bool):
                tdb, _, tname = str(o.get("to") or "").partition(".")
                self.dropped[bytes(target)] = (tdb, tname)
        elif name in ("createIndexes", "dropIndexes", "collMod") and ui is not None:
            self.metadata.add(bytes(ui))

    def keys(self) -> list[tuple[bytes, bytes]]:
        """The refetch keys, documents of collections that are dropped or restored whole
        left out, and last the source's newest optime (``minValid``)."""
        whole = self.created | self.dropped.keys()
        out = [k for k, (uuid, _) in self.docs.items() if uuid not in whole]
        out += [(SESSIONS, sk) for sk in self.sessions]
        out += [(CATALOG, u) for u in sorted((self.dropped.keys() | self.metadata)
                                             - self.created)]
        out += [(DOCUMENTS, u) for u in sorted(self.dropped.keys() - self.created)]
        return out + [(MIN_VALID, b"")]

    def check_restorable(self, node: "ShardNode", answers: dict[Any, Any]) -> None:
        """UnrecoverableRollbackError (127) before anything changes when a dropped collection
        the source still has cannot come back under its name at the common point (another
        collection, not one this rollback drops or renames away, holds it)."""
        storage = node.storage
        leaving = self.created | {u for u, _, _ in self.renames}
        for uuid, (db, name) in self.dropped.items():
            if uuid in self.created or answers.get((CATALOG, uuid)) is None \
                    or uuid in storage.by_uuid:
                continue
            holder = storage.get(db, name)
            if holder is not None and holder.uuid not in leaving:
                raise MongoError(127, f"cannot roll back the drop of {db}.{name}: the name is "
                                      f"taken by collection {holder.uuid.hex()}")


def fix_up(node: "ShardNode", info: FixUpInfo, answers: dict[Any, Any],
           files: dict[str, list[dict[str, Any]]], common: Timestamp | None = None) -> None:
    """``syncFixUp``: put everything ``info`` names back to the source's version (``answers``),
    saving every removed or overwritten document in ``files`` (collection UUID string ->
    documents); ``common`` is the common point (None: the whole oplog was undone)."""
    storage = node.storage

    def save(coll: Collection, doc: dict[str, Any]) -> None:
        files.setdefault(uuid_string(coll.uuid), []).append(doc)

    touched: set[bytes] = set()
    for sk in info.sessions:  # their prepared documents must be writable again
        s = node.sessions._sessions.get(sk)
        if s is not None and s.txn is not None and s.txn.state == "prepared":
            s.txn.unlock()
            s.txn.rollback(storage)
            s.txn.state = "aborted"
    for uuid in info.created:
        coll = storage.by_uuid.get(uuid)
        if coll is not None:
            for doc in coll.docs.values():
                save(coll, doc)
            storage.remove(coll)
    for uuid, db, name in info.renames:
        coll = storage.by_uuid.get(uuid)
        if coll is not None and (coll.db, coll.name) != (db, name):
            storage.rename(coll, db, name)
            touched.add(uuid)
    for uuid, (db, name) in info.dropped.items():
        if uuid in info.created:
            continue
        _restore_dropped(node, uuid, db, name, answers)
        touched.add(uuid)
    for uuid in info.metadata - info.created:
        _resync_metadata(node, uuid, answers.get((CATALOG, uuid)))
        touched.add(uuid)
    _fix_documents(node, info, answers, save, touched)
    settle_unique_indexes(node)
    _fix_sessions(node, info, answers, common)
    _drop_history(node, touched)


def _restore_dropped(node: "ShardNode", uuid: bytes, db: str, name: str,
                     answers: dict[Any, Any]) -> None:
    """Collection ``uuid`` back under its name at the common point (``db.name``: the source's
    renames since replay in the catch-up), with the source's options, indexes and documents."""
    storage = node.storage
    cat = answers.get((CATALOG, uuid))
    docs = answers.get((DOCUMENTS, uuid))
    if cat is None or uuid in storage.by_uuid:
        return  # the source dropped it too (its drop replicates), or it is here already
    if storage.get(db, name) is not None:
        raise MongoError(127, f"cannot roll back the drop of {db}.{name}: the name is taken")
    coll = Collection(db, name, uuid, dict(cat.get("options") or {}), cat.get("shardKey"))
    for spec in cat.get("indexes") or []:
        if spec.get("name") != "_id_" and not spec.get("clustered"):
            add_index_relaxed(node, coll, dict(spec))
    storage.add(coll)
    for doc in (docs or {}).get("documents") or []:
        key = coll.insert(doc)
        storage.note_doc(coll, key, doc)


def _resync_metadata(node: "ShardNode", uuid: bytes, cat: dict[str, Any] | None) -> None:
    coll = node.storage.by_uuid.get(uuid)
    if coll is None or cat is None:
        return
    coll.options = dict(cat.get("options") or {})
    coll.capped = bool(coll.options.get("capped"))
    specs = {s["name"]: s for s in cat.get("indexes") or []}
    for name in list(coll.indexes):
        if name != "_id_" and (name not in specs or coll.indexes[name].spec != specs[name]):
            del coll.indexes[name]
    for name, spec in specs.items():
        if name not in coll.indexes and not spec.get("clustered"):
            add_index_relaxed(node, coll, dict(spec))
    node.storage.note_catalog(coll)


def _fix_documents(node: "ShardNode", info: FixUpInfo, answers: dict[Any, Any], save: Any,
                   touched: set[bytes]) -> None:
    """Deletes first, then the source's versions (so a unique key moving between documents
    does not collide half-way)."""
    storage = node.storage
    whole = info.created | info.dropped.keys()
    puts: list[tuple[Collection, Any, dict[str, Any]]] = []
    for key, (uuid, _id) in info.docs.items():
        coll = storage.by_uuid.get(uuid)
        if uuid in whole or coll is None:
            continue
        touched.add(uuid)
        k = document_key_of(coll, {"_id": _id})
        cur = coll.docs.get(k) if k is not None else None
        src = answers.get(key)
        if src is None:
            if cur is not None:
                save(coll, cur)
                coll.delete(k)
                storage.note_doc(coll, k, None)
        elif cur is None or bson.encode(cur, codec_options=CODEC) != \
                bson.encode(src, codec_options=CODEC):
            if cur is not None:
                save(coll, cur)
            puts.append((coll, k, src))
    token = IDEMPOTENT.set(True)  # the source's versions may clash with older local ones
    try:                           # on a unique key until the catch-up (relaxed meanwhile)
        for coll, k, src in puts:
            write_document(node, coll, k if k is not None and k in coll.docs else None, src)
    finally:
        IDEMPOTENT.reset(token)


def _fix_sessions(node: "ShardNode", info: FixUpInfo, answers: dict[Any, Any],
                  common: Timestamp | None) -> None:
    sessions = node.sessions
    for sk, lsid in info.sessions.items():
        s = sessions.get(lsid)
        if s is None:
            continue
        rec = answers.get((SESSIONS, sk))
        prep = rec.get("prepared") if rec is not None else None
        if prep and (common is None or prep["prepareTs"] > common):
            # prepared by the source after the common point: the catch-up applies that prepare
            # entry (it is before minValid); restored here already, its locks would refuse the
            # source's earlier entries on the same documents during the catch-up
            rec = {k: v for k, v in rec.items() if k != "prepared"}
        s.txn = None
        s.executed = {}
        s.last_write_ts = None
        s.txn_number = -1
        if rec is not None:
            sessions.restore(rec)
        sessions.note(s)


def _drop_history(node: "ShardNode", touched: set[bytes]) -> None:
    """The touched collections' snapshot history is gone: reads before now get
    SnapshotTooOld (239) there (the pending records of the fix-up are not history either)."""
    history = node.storage.history
    history.pending.clear()
    if not touched:
        return
    now = node.clock.now()
    kept = [(c, ts, cost) for c, ts, cost in history.order if c.uuid not in touched]
    history.bytes = sum(cost for _, _, cost in kept)
    history.order.clear()
    history.order.extend(kept)
    for uuid in touched:
        coll = node.storage.by_uuid.get(uuid)
        if coll is not None:
            coll.history.clear()
            coll.history_floor = now
