"""Taking back, in memory, a durable commit that failed (disk full, I/O error).

mongod writes a command's changes in a WiredTiger transaction; when the storage engine refuses
it the transaction is aborted and nothing of the write remains: not the document, not its oplog
entry, so no change stream ever sees it (``WriteUnitOfWork`` destructor -> ``abortUnitOfWork``,
``wiredtiger_recovery_unit.cpp``). A shardsim shard changes its in-memory state first and writes
the command's journal to SQLite when it ends (:meth:`shard.durable.DurableStore.commit`); when
that fails SQLite has rolled its transaction back, so the disk holds the last committed state,
and :func:`undo` puts memory back to it for everything the failed journal touched:

* the oplog entries newer than the last commit leave the oplog (``Oplog.discard_after``) and
  their pre-images go (``PreImages.discard_from``). No reader saw them: the commit runs before
  the event loop lets any other command (a change stream's ``getMore``, a ``find``) run;
* documents are read back from the ``docs`` table one by one (a document the failed command
  deleted comes back at its place: its collection is reloaded in ``$natural`` order);
* a collection whose catalog record changed (create, drop, rename, indexes, collMod) is
  reloaded from the ``catalog`` and ``docs`` tables, or removed when it did not exist;
* a session record (retryable-write history, a prepared transaction) is reloaded, so a retry
  of the failed statement runs it again instead of answering from history; a transaction whose
  commit (or prepare) entry was in the failed journal is prepared again when the disk says it
  was prepared, else aborted.

The clock is not moved back (later writes get later times, as on mongod) and the snapshot
history keeps its records (they undo to the documents memory now holds again).
"""

from __future__ import annotations

from typing import Any

from shardsim.shard.storage import Collection


def undo(node: Any, journal: list[tuple]) -> None:
    """Put ``node``'s memory back to what its durable store last committed, for everything
    ``journal`` (the records of the failed commit) touched. The storage journal is suspended
    meanwhile (nothing here is journaled)."""
    store, storage = node.durable, node.storage
    through = node.oplog.durable_through
    node.oplog.discard_after(through)
    node.pre_images.discard_from(through + 1)
    catalog: dict[bytes, None] = {}
    docs: dict[bytes, dict[Any, None]] = {}
    sessions: dict[bytes, Any] = {}
    txn_ops: set[tuple[bytes, int]] = set()
    for rec in journal:
        kind = rec[0]
        if kind == "doc":
            docs.setdefault(rec[1], {})[rec[2]] = None
        elif kind == "catalog":
            catalog[rec[1]] = None
        elif kind == "session":
            sessions[rec[1]] = rec[2]
        elif kind == "oplog":
            entry = rec[1]
            if "lsid" in entry and "txnNumber" in entry:
                txn_ops.add((_lsid_key(entry["lsid"]), int(entry["txnNumber"])))
    saved, storage.journal = storage.journal, None
    try:
        _restore_catalog(store, storage, list(catalog))
        for uuid, keys in docs.items():
            coll = storage.by_uuid.get(uuid)
            if uuid not in catalog and coll is not None:
                _restore_docs(store, storage, coll, list(keys))
        for sid, _ in txn_ops:  # a transaction's commit: its session may not be journaled
            sess = node.sessions._sessions.get(sid)
            if sess is not None:
                sessions.setdefault(sid, sess)
        for sid, sess in sessions.items():
            _restore_session(node, store.committed_session(sid), sess, txn_ops)
    finally:
        storage.journal = saved


def _lsid_key(lsid: Any) -> bytes:
    lid = lsid.get("id") if isinstance(lsid, dict) else None
    return bytes(lid) if lid is not None else b""


def _unmap(storage: Any, coll: Collection) -> None:
    colls = storage.dbs.get(coll.db)
    if colls is not None and colls.get(coll.name) is coll:
        del colls[coll.name]
        if not colls:
            del storage.dbs[coll.db]
    if storage.by_uuid.get(coll.uuid) is coll:
        del storage.by_uuid[coll.uuid]


def _map(storage: Any, coll: Collection) -> None:
    coll.recorder = storage.history
    storage.dbs.setdefault(coll.db, {})[coll.name] = coll
    storage.by_uuid[coll.uuid] = coll


def _restore_catalog(store: Any, storage: Any, uuids: list[bytes]) -> None:
    """Reload the collections ``uuids`` from disk (remove those the last commit did not have).
    An existing Collection object is kept (transactions and cursors hold it) and refilled."""
    current = {u: storage.by_uuid.get(u) for u in uuids}
    for coll in current.values():
        if coll is not None:
            _unmap(storage, coll)
    for uuid in uuids:
        fresh = store.reload_collection(uuid)
        if fresh is None:
            continue
        mem = current[uuid]
        if mem is None:
            _map(storage, fresh)
            continue
        _transplant(mem, fresh)
        _map(storage, mem)


def _transplant(mem: Collection, fresh: Collection) -> None:
    """Give ``mem`` the catalog and documents of ``fresh`` (its own locks and history stay)."""
    mem.db, mem.name = fresh.db, fresh.name
    mem.options, mem.shard_key = fresh.options, fresh.shard_key
    mem.indexes, mem.docs = fresh.indexes, fresh.docs


def _restore_docs(store: Any, storage: Any, coll: Collection, keys: list[Any]) -> None:
    """Give ``coll``'s documents at ``keys`` their committed value (unique index entries
    follow); a document that must come back reloads the whole collection (``$natural``
    order)."""
    for key in keys:
        committed = store.committed_doc(coll.uuid, key)
        cur = coll.docs.get(key)
        if committed is None:
            if cur is not None:
                coll._unindex(key, cur)
                del coll.docs[key]
        elif cur is None:
            fresh = store.reload_collection(coll.uuid)
            if fresh is not None:
                _transplant(coll, fresh)
            return
        else:
            coll._unindex(key, cur)
            coll.docs[key] = committed
            for idx in coll.indexes.values():
                if idx.unique and idx.name != "_id_":
                    for hk, _ in idx.keys_of(committed):
                        idx.entries[hk] = key


def _restore_session(node: Any, rec: dict[str, Any] | None, sess: Any,
                     txn_ops: set[tuple[bytes, int]]) -> None:
    """Give ``sess`` its committed record (``rec``, None: it had none): txnNumber and the
    statements executed; a transaction whose commit/prepare entry was lost is prepared again
    (``rec`` says prepared) or aborted."""
    txn = sess.txn
    if txn is not None and (_lsid_key(sess.lsid), txn.txn_number) in txn_ops \
            and txn.state in ("committed", "prepared"):
        if txn.state == "prepared":
            txn.unlock()
        txn.state = "aborted"  # its txnNumber stays used: a retry gets NoSuchTransaction
        if rec and rec.get("prepared") and int(rec["txnNumber"]) == txn.txn_number:
            node.sessions._restore_prepared(sess, rec["prepared"])  # prepared, as on disk
        return
    if txn is not None and txn.state == "in_progress" and txn.txn_number == sess.txn_number:
        return  # a transaction still open on the session: its number stays
    sess.txn_number = int(rec["txnNumber"]) if rec else -1
    sess.executed = {int(x["i"]): x["r"] for x in rec.get("stmts", [])} if rec else {}

